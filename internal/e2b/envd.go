package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// E2B's in-sandbox ports, which its SDKs name in E2b-Sandbox-Port.
const (
	envdPort        = "49983"
	interpreterPort = "49999"
)

// lookup is the caller the adapter finds a sandbox named by in-sandbox
// traffic with, before it knows whose it is: that traffic carries no API
// key, only the sandbox's id and its access token (checked next).
var lookup = sandbox.Caller{Admin: true, Via: "e2b"}

// target is the sandbox in-sandbox traffic is for, and the caller that
// acts on it: the sandbox's tenant, as the manager audits it.
type target struct {
	c  sandbox.Caller
	id string
}

type targetKey struct{}

func targetOf(ctx context.Context) (target, bool) {
	t, ok := ctx.Value(targetKey{}).(target)
	return t, ok
}

// accessToken is sandbox id's envdAccessToken: an HMAC of its id under the
// catalog's secret, so every server process of the state dir agrees and
// nothing is stored per sandbox. Ids are never reused.
func (h *handler) accessToken(id string) string {
	m := hmac.New(sha256.New, h.cfg.Secret)
	m.Write([]byte("e2b envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// tokenOK reports whether tok is sandbox id's access token.
func (h *handler) tokenOK(id, tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(h.accessToken(id))) == 1
}

// signatureOK checks a /files URL signed the way E2B's SDKs sign
// uploadUrl and downloadUrl: "v1_" and the unpadded base64 of
// sha256("<path>:<read|write>:<user>:<token>[:<expiry>]"), with an
// optional expiry in unix seconds that must not have passed.
func (h *handler) signatureOK(id string, r *http.Request, op string) bool {
	q := r.URL.Query()
	sig, exp := q.Get("signature"), q.Get("signature_expiration")
	if sig == "" {
		return false
	}
	s := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + h.accessToken(id)
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
		s += ":" + exp
	}
	sum := sha256.Sum256([]byte(s))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// newEnvd builds the handler of E2B's envd port: the process and
// filesystem Connect services (JSON codec, as the SDKs speak it), /files
// and /health.
func (h *handler) newEnvd() http.Handler {
	mux := http.NewServeMux()
	opts := connect.WithHandlerOptions(connect.WithInterceptors(tokenCheck{h}), connect.WithReadMaxBytes(maxBody))
	mux.Handle(processconnect.NewProcessHandler(&processService{h: h}, opts))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{h: h}, opts))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", h.download)
	mux.HandleFunc("POST /files", h.upload)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("envd has no route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// inSandbox serves the traffic E2B's SDKs send into a sandbox (header
// E2b-Sandbox-Id, port in E2b-Sandbox-Port): a sandbox that does not
// exist or does not run is E2B's proxy's 502, whoever asks; then the
// tenant's rate limit; then the port's own handler, which checks the
// sandbox's access token where envd does.
func (h *handler) inSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	sb, err := h.cfg.Sandboxes.Get(r.Context(), lookup, id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalid) {
		h.fail(w, r, err)
		return
	}
	if err != nil || sb.State != store.StateRunning {
		// E2B's SDKs read this as "the sandbox timed out".
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
		return
	}
	if h.cfg.Limiter != nil && !h.cfg.Limiter(sb.Tenant) {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "rate limit: too many requests for this tenant")
		return
	}
	t := target{c: sandbox.Caller{Tenant: sb.Tenant, Via: "e2b"}, id: sb.ID}
	r = r.WithContext(context.WithValue(r.Context(), targetKey{}, t))
	switch port := r.Header.Get("E2b-Sandbox-Port"); port {
	case "", envdPort:
		h.envd.ServeHTTP(w, r)
	case interpreterPort:
		h.interpreter.ServeHTTP(w, r)
	default:
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": fmt.Sprintf("port %s of the sandbox is not served through E2B's headers; use the sandbox's preview route", port), "code": http.StatusBadGateway})
	}
}

// signedFiles serves /files URLs that name no sandbox: E2B's SDKs build
// uploadUrl and downloadUrl on E2B_SANDBOX_URL, where the sandbox is
// named only by the E2b-Sandbox-Id header its own requests carry, which
// a browser or curl given the URL does not send. The signature is made
// with one sandbox's token, so the running sandbox whose token verifies
// it is the one (an HMAC and a hash per running sandbox of the server).
func (h *handler) signedFiles(w http.ResponseWriter, r *http.Request) {
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	if r.URL.Query().Get("signature") != "" {
		sbs, err := h.cfg.Sandboxes.List(r.Context(), lookup)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		for _, sb := range sbs {
			if sb.State == store.StateRunning && h.signatureOK(sb.ID, r, op) {
				r.Header.Set("E2b-Sandbox-Id", sb.ID)
				r.Header.Del("X-Access-Token")
				h.inSandbox(w, r)
				return
			}
		}
	}
	writeError(w, http.StatusUnauthorized, "a /files URL without E2b-Sandbox-Id needs a valid signature (the SDK's uploadUrl or downloadUrl)")
}

// tokenCheck requires the sandbox's access token (X-Access-Token) on every
// RPC, as envd does.
type tokenCheck struct{ h *handler }

func (c tokenCheck) check(ctx context.Context, hdr http.Header) error {
	t, ok := targetOf(ctx)
	if !ok || !c.h.tokenOK(t.id, hdr.Get("X-Access-Token")) {
		return connect.NewError(connect.CodeUnauthenticated, errors.New("missing or invalid access token (X-Access-Token: the envdAccessToken of the sandbox's create or connect)"))
	}
	return nil
}

func (c tokenCheck) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := c.check(ctx, req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (c tokenCheck) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c tokenCheck) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := c.check(ctx, conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

var userRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`) })

// userOf is the guest user a request acts as: E2B's SDKs send it as
// "Authorization: Basic base64(<user>:)" on RPCs and as the username query
// parameter on /files; none is the sandbox's default user (root). root is
// "".
func userOf(name string) (string, error) {
	switch {
	case name == "" || name == "root":
		return "", nil
	case !userRe().MatchString(name):
		return "", fmt.Errorf("%w: user %q is not a user name", errdefs.ErrInvalid, name)
	}
	return name, nil
}

// rpcUser reads the user of an RPC from its Basic authorization.
func rpcUser(hdr http.Header) (string, error) {
	v, ok := strings.CutPrefix(hdr.Get("Authorization"), "Basic ")
	if !ok {
		return "", nil
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return "", fmt.Errorf("%w: Authorization: Basic is not base64", errdefs.ErrInvalid)
	}
	name, _, _ := strings.Cut(string(b), ":")
	return userOf(name)
}

// home is user's home directory, against which E2B resolves relative paths.
func home(user string) string {
	if user == "" {
		return "/root"
	}
	return "/home/" + user
}

// guestPath resolves p as envd does (relative to the user's home, "~"
// expanded) and checks it.
func guestPath(p, user string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%w: path is required", errdefs.ErrInvalid)
	case p == "~":
		p = home(user)
	case strings.HasPrefix(p, "~/"):
		p = home(user) + p[1:]
	case !strings.HasPrefix(p, "/"):
		p = home(user) + "/" + p
	}
	p = path.Clean(p)
	if err := guest.CheckPath(p); err != nil {
		return "", fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	return p, nil
}

// rpcError is err as a Connect error E2B's SDKs map the way envd's would
// be: not found, invalid argument, unauthenticated, rate limits and full
// disks, a sandbox gone mid-request as unavailable (the SDK's "timed out").
func rpcError(err error) error {
	if _, ok := errors.AsType[*connect.Error](err); ok {
		return err
	}
	if se, ok := guest.AsStartError(err); ok {
		return connect.NewError(connect.CodeInvalidArgument, se)
	}
	if guest.IsNoExec(err) {
		return connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	if errors.Is(err, sandbox.ErrNoSandbox) {
		return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is not running"))
	}
	status, _, msg := api.PublicError(err)
	code := connect.CodeInternal
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		code = connect.CodeInvalidArgument
	case http.StatusNotFound:
		code = connect.CodeNotFound
	case http.StatusConflict:
		code = connect.CodeAlreadyExists
	case http.StatusPreconditionFailed:
		code = connect.CodeFailedPrecondition
	case http.StatusTooManyRequests, http.StatusInsufficientStorage, http.StatusRequestEntityTooLarge:
		code = connect.CodeResourceExhausted
	case http.StatusServiceUnavailable:
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, errors.New(msg))
}
