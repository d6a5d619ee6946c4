package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Limits are a tenant's quotas. Zero fields of a key take the server's
// defaults (Config.Defaults, then DefaultLimits); the manager checks them.
type Limits = sandbox.Limits

// DefaultLimits apply to keys that set no limit of their own (secure by
// default: no key is unlimited).
var DefaultLimits = sandbox.DefaultLimits

// Config is what a Server needs. Sandboxes, Files, Events and Keys are
// required; a nil Execs answers exec routes with 503, a nil Contexts the
// code and context routes, a nil Ports the preview route, a nil Snapshots
// the snapshot and fork routes (and create with from_snapshot), a nil
// Volumes the volume routes, a nil Templates the template routes, a nil
// Browsers the browser routes, a nil Secrets the vault and sandbox secret
// routes (and a create that names a vault secret is refused by the
// manager it reaches, if it has no vault).
type Config struct {
	Sandboxes Sandboxes
	Files     Files
	Execs     Execs
	Contexts  Contexts
	Ports     Ports
	Snapshots Snapshots
	Volumes   Volumes
	Secrets   Secrets
	Templates Templates
	Browsers  Browsers
	Events    Events
	Keys      Keys
	Log       *slog.Logger // nil: discard
	Defaults  Limits       // zero: DefaultLimits
	// PreviewDomain, if set, serves each sandbox port at its own host,
	// <port>-<sandbox id>.<PreviewDomain> (hostpreview.go); it needs Ports
	// and Secret. A port in it (localhost:7070) is for the URLs handed
	// out; requests match on the host name.
	PreviewDomain string
	// Secret (at least 32 bytes, the same for every server of the state
	// dir) derives each sandbox's preview token.
	Secret []byte
	// AccessLog, if set, gets one Info line per request when it ends
	// (accesslog.go says what a line holds and what it never does).
	AccessLog *slog.Logger
	// NodeToken, if set (at least MinNodeToken bytes), makes this a
	// cluster node's API: the control tier's token and the caller it
	// names are the only authentication (nodeauth.go).
	NodeToken []byte
	// Mover, on a node, serves the control tier's routes that move paused
	// sandboxes between nodes (nodemove.go).
	Mover Mover
}

// Validate checks c and fills in defaults.
func (c *Config) Validate() error {
	if c.Sandboxes == nil || c.Files == nil || c.Events == nil || c.Keys == nil {
		return errors.New("api: Sandboxes, Files, Events and Keys are required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Defaults == (Limits{}) {
		c.Defaults = DefaultLimits
	}
	if c.NodeToken != nil && len(c.NodeToken) < MinNodeToken {
		return fmt.Errorf("api: a node token must have at least %d bytes", MinNodeToken)
	}
	if c.PreviewDomain != "" {
		if c.Ports == nil || len(c.Secret) < 32 {
			return errors.New("api: PreviewDomain needs Ports and a Secret of at least 32 bytes")
		}
		if err := validPreviewDomain(c.PreviewDomain); err != nil {
			return err
		}
	}
	return nil
}

// MaxJSONBody caps every JSON request body.
const MaxJSONBody = 1 << 20

// Server is the API's http.Handler. Safe for concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics
	// previewProxy serves the preview route (ports.go).
	previewProxy *httputil.ReverseProxy
	// deniedAudit caps how fast failed authentications are written to the
	// audit trail, so unauthenticated floods cannot fill the catalog.
	deniedAudit *rate.Limiter

	// byHeader routes requests that carry a header to another handler
	// (RouteByHeader), ahead of the route table.
	byHeader []headerRoute
	// inflight counts the requests being served (InFlight, WaitIdle).
	inflight inFlight
	sess     sessions // the dashboard's sign-ins (session.go)
	// usageTimeout bounds one guest sample of the usage route
	// (usageRouteTimeout; tests shorten it before serving).
	usageTimeout time.Duration

	// limiters are the per-tenant request buckets.
	limiters TenantLimiters
}

// route is one entry of the route table; auth is false only for /healthz,
// /metrics and the API's own spec.
type route struct {
	pattern string // "METHOD /path" (Go 1.22 ServeMux pattern); no method: all methods
	auth    bool
	h       func(s *Server, w http.ResponseWriter, r *http.Request)
}

// routes is the one route table: the mux is built from it, and a test
// checks it against api/openapi.yaml.
var routes = []route{
	{"GET /healthz", false, (*Server).healthz},
	{"GET /metrics", false, nil}, // filled in by New (promhttp)
	{"GET /v1/openapi.yaml", false, (*Server).openAPI},
	{"POST /v1/sandboxes", true, (*Server).createSandbox},
	{"GET /v1/sandboxes", true, (*Server).listSandboxes},
	{"GET /v1/sandboxes/{id}", true, (*Server).getSandbox},
	{"DELETE /v1/sandboxes/{id}", true, (*Server).deleteSandbox},
	{"POST /v1/sandboxes/{id}/timeout", true, (*Server).setTimeout},
	{"POST /v1/sandboxes/{id}/pause", true, (*Server).pauseSandbox},
	{"POST /v1/sandboxes/{id}/resume", true, (*Server).resumeSandbox},
	{"POST /v1/sandboxes/{id}/keepalive", true, (*Server).keepalive},
	{"GET /v1/sandboxes/{id}/usage", true, (*Server).sandboxUsage},
	{"GET /v1/sandboxes/{id}/network", true, (*Server).getNetwork},
	{"PUT /v1/sandboxes/{id}/network", true, (*Server).setNetwork},
	{"PUT /v1/sandboxes/{id}/secrets/{name}", true, (*Server).putSandboxSecret},
	{"DELETE /v1/sandboxes/{id}/secrets/{name}", true, (*Server).deleteSandboxSecret},
	{"GET /v1/sandboxes/{id}/logs", true, (*Server).sandboxLogs},
	{"POST /v1/sandboxes/{id}/snapshot", true, (*Server).snapshotSandbox},
	{"POST /v1/sandboxes/{id}/fork", true, (*Server).forkSandbox},
	{"GET /v1/snapshots", true, (*Server).listSnapshots},
	{"GET /v1/snapshots/{name}", true, (*Server).getSnapshot},
	{"DELETE /v1/snapshots/{name}", true, (*Server).deleteSnapshot},
	{"POST /v1/snapshots/prune", true, (*Server).pruneSnapshots},
	{"POST /v1/volumes", true, (*Server).createVolume},
	{"GET /v1/volumes", true, (*Server).listVolumes},
	{"GET /v1/volumes/{name}", true, (*Server).getVolume},
	{"POST /v1/volumes/{name}/resize", true, (*Server).resizeVolume},
	{"DELETE /v1/volumes/{name}", true, (*Server).deleteVolume},
	{"POST /v1/templates/{name}/build", true, (*Server).buildTemplate},
	{"GET /v1/templates", true, (*Server).listTemplates},
	{"GET /v1/templates/{name}", true, (*Server).getTemplate},
	{"GET /v1/templates/{name}/log", true, (*Server).templateLog},
	{"DELETE /v1/templates/{name}", true, (*Server).deleteTemplate},
	{"POST /v1/templates/prune", true, (*Server).pruneTemplates},
	{"PUT /v1/secrets/{name}", true, (*Server).putVaultSecret},
	{"GET /v1/secrets", true, (*Server).listVaultSecrets},
	{"DELETE /v1/secrets/{name}", true, (*Server).deleteVaultSecret},
	{"POST /v1/sandboxes/{id}/exec", true, (*Server).exec},
	{"GET /v1/sandboxes/{id}/pty", true, (*Server).pty},
	{"GET /v1/sandboxes/{id}/execs", true, (*Server).listExecs},
	{"GET /v1/sandboxes/{id}/execs/{exec_id}", true, (*Server).getExec},
	{"GET /v1/sandboxes/{id}/execs/{exec_id}/stream", true, (*Server).streamExec},
	{"POST /v1/sandboxes/{id}/execs/{exec_id}/stdin", true, (*Server).execStdin},
	{"POST /v1/sandboxes/{id}/execs/{exec_id}/signal", true, (*Server).execSignal},
	{"POST /v1/sandboxes/{id}/code", true, (*Server).runCode},
	{"GET /v1/sandboxes/{id}/contexts", true, (*Server).listContexts},
	{"POST /v1/sandboxes/{id}/contexts", true, (*Server).createContext},
	{"DELETE /v1/sandboxes/{id}/contexts/{ctx}", true, (*Server).deleteContext},
	{"POST /v1/sandboxes/{id}/contexts/{ctx}/restart", true, (*Server).restartContext},
	{"POST /v1/sandboxes/{id}/contexts/{ctx}/interrupt", true, (*Server).interruptContext},
	{"PUT /v1/sandboxes/{id}/files", true, (*Server).writeFile},
	{"GET /v1/sandboxes/{id}/files", true, (*Server).readFile},
	{"DELETE /v1/sandboxes/{id}/files", true, (*Server).deleteFile},
	{"PUT /v1/sandboxes/{id}/files/archive", true, (*Server).writeArchive},
	{"GET /v1/sandboxes/{id}/files/archive", true, (*Server).readArchive},
	{"GET /v1/sandboxes/{id}/files/list", true, (*Server).listFiles},
	{"GET /v1/sandboxes/{id}/files/stat", true, (*Server).statFile},
	{"POST /v1/sandboxes/{id}/files/mkdir", true, (*Server).mkdir},
	{"POST /v1/sandboxes/{id}/files/rename", true, (*Server).renameFile},
	{"/v1/sandboxes/{id}/ports/{port}/{path...}", true, (*Server).preview},
	{"GET /v1/sandboxes/{id}/preview", true, (*Server).previewLink},
	{"POST /v1/sandboxes/{id}/browser", true, (*Server).startBrowser},
	{"GET /v1/sandboxes/{id}/browser", true, (*Server).getBrowser},
	{"GET /v1/sandboxes/{id}/browser/cdp", true, (*Server).browserCDP},
	{"GET /v1/sandboxes/{id}/browser/cdp/{path...}", true, (*Server).browserCDP},
	{"GET /v1/sandboxes/{id}/browser/vnc", true, (*Server).browserVNC},
	{"GET /v1/events", true, (*Server).listEvents},
	{"GET /v1/server", true, (*Server).serverOverview},
	{"GET /v1/keys", true, (*Server).listKeys},
	{"PATCH /v1/keys/{key_id}", true, (*Server).updateKey},
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Log, mux: http.NewServeMux(),
		deniedAudit:  rate.NewLimiter(10, 20),
		usageTimeout: usageRouteTimeout,
	}
	s.metrics = newMetrics(cfg.Sandboxes, cfg.Snapshots)
	if cfg.Execs != nil {
		// Every exec start of the API, its terminals and the adapters
		// given Server.Execs is counted and timed by tenant.
		s.cfg.Execs = meteredExecs{cfg.Execs, s.metrics}
	}
	s.previewProxy = s.newPreviewProxy()
	for _, rt := range routes {
		var h http.Handler
		if rt.h == nil {
			h = s.metrics.handler()
		} else {
			fn := rt.h
			h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fn(s, w, r) })
		}
		if rt.auth {
			h = s.authenticate(h)
		}
		s.mux.Handle(rt.pattern, s.instrument(rt.pattern, h))
	}
	s.mountDashboard()
	s.mountNodeRoutes()
	s.mux.Handle("/", s.instrument("other", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, errNoRoute)
	})))
	return s, nil
}

// HandleAuthenticated serves h at pattern behind the API's key check and
// rate limit (used for /mcp); h reads the key with KeyOf and the caller
// with CallerOf. Call it before serving.
func (s *Server) HandleAuthenticated(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.instrument(pattern, s.authenticate(h)))
}

// HandlePublic mounts h at pattern without the key check: h does its own
// authentication (E2B's signed file URLs). Call it before serving.
func (s *Server) HandlePublic(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.instrument(pattern, h))
}

type headerRoute struct {
	header string
	h      http.Handler
}

// RouteByHeader serves every request that carries header (any value) with
// h instead of the route table: E2B's SDKs send in-sandbox traffic to the
// same origin as the control plane and tell it apart by E2b-Sandbox-Id. h
// does its own authentication. Call it before serving.
func (s *Server) RouteByHeader(header string, h http.Handler) {
	s.byHeader = append(s.byHeader, headerRoute{header, s.instrument("header "+header, h)})
}

// Execs returns Config.Execs with the server's exec metrics (count and
// start latency by tenant), for adapters that start execs on their own
// (E2B), or nil if the server has none.
func (s *Server) Execs() Execs { return s.cfg.Execs }

// KeyOf returns the key a request was authenticated with.
func KeyOf(ctx context.Context) (store.APIKey, bool) {
	a, ok := ctx.Value(keyCtx{}).(authed)
	return a.key, ok
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.add()
	defer s.inflight.done()
	id := newRequestID()
	w.Header().Set("X-Request-Id", id)
	ctx := context.WithValue(r.Context(), requestIDKey{}, id)
	if s.cfg.AccessLog != nil {
		// Logged when the request ends, after a panic's answer below; the
		// mux sets r.Pattern on this r.
		rec, aw, t0 := &accessRecord{}, &accessWriter{ResponseWriter: w}, time.Now()
		ctx = context.WithValue(ctx, accessKey{}, rec)
		w = aw
		defer func() { s.logAccess(r, aw, rec, time.Since(t0)) }()
	}
	r = r.WithContext(ctx)
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler { //nolint:errorlint // a recovered panic value, compared as net/http documents
				panic(v)
			}
			s.log.Error("handler panic", "request_id", id, "route", r.Pattern, "panic", v)
			s.fail(w, r, errors.New("panic"))
		}
	}()
	if s.cfg.PreviewDomain != "" {
		if t, ok := s.previewHost(r.Host); ok {
			s.hostPreview(w, r, t)
			return
		}
	}
	for _, hr := range s.byHeader {
		if r.Header.Get(hr.header) != "" {
			hr.h.ServeHTTP(w, r)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// ErrStopping is the cause of the context of requests the server cut at
// the end of a graceful stop's drain.
var ErrStopping = errors.New("the server is stopping")

// NewHTTPServer returns an http.Server for s with the API's protections:
// header size and read-header timeouts, idle timeouts. There is no overall
// read or write timeout (uploads and exec streams are long); handlers set
// rolling deadlines instead. A graceful stop calls srv.Shutdown, which lets
// in-flight requests finish; cancel ends the ones still running when the
// drain's time is up (exec streams write an error line saying the exec
// goes on and where to re-attach; the sessions keep running in their shims).
func (s *Server) NewHTTPServer(addr string) (srv *http.Server, cancel func()) {
	base, stop := context.WithCancelCause(context.Background())
	cancel = func() { stop(ErrStopping) }
	srv = &http.Server{
		Addr:              addr,
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(_ net.Listener) context.Context { return base },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return srv, cancel
}

type requestIDKey struct{}

func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
}

// auditRequest records an event as the request's key.
func (s *Server) audit(r *http.Request, sandboxID, action string, detail map[string]any) {
	k := keyOf(r)
	if _, err := s.cfg.Events.AppendEvent(context.WithoutCancel(r.Context()), store.Event{
		Tenant: k.Tenant, KeyID: k.ID, SandboxID: sandboxID, Action: action, Detail: detail,
	}); err != nil {
		s.log.Error("audit", "request_id", requestID(r), "action", action, "err", err)
	}
}
