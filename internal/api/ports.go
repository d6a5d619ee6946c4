package api

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// MaxPreviewBody caps the request body of one preview request (streamed,
// never buffered).
const MaxPreviewBody = 64 << 20

// previewHost is the fake upstream host of preview requests: the proxy's
// transport dials <sandbox id>.sandbox:<port> through Ports.DialPort.
const previewHost = ".sandbox"

var (
	errNoPorts     = &Error{http.StatusServiceUnavailable, "unavailable", "port previews are not available on this server"}
	errBadPort     = &Error{http.StatusBadRequest, "invalid", "port must be 1-65535"}
	errPreviewBody = &Error{http.StatusRequestEntityTooLarge, "too_large", "preview request body is larger than 64 MiB"}
)

// newPreviewProxy returns the reverse proxy of the preview route. Its
// transport keeps no idle connections: every request dials the guest port
// afresh, so nothing outlives a request or a sandbox.
func (s *Server) newPreviewProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			id, ok := strings.CutSuffix(host, previewHost)
			port, perr := strconv.ParseUint(p, 10, 16)
			if !ok || perr != nil {
				return nil, errors.New("preview: bad upstream address")
			}
			t, _ := ctx.Value(previewKey{}).(previewTarget)
			return s.cfg.Ports.DialPort(ctx, t.caller, id, uint16(port))
		},
		DisableKeepAlives:      true,
		DisableCompression:     true, // pass the client's Accept-Encoding through
		ResponseHeaderTimeout:  5 * time.Minute,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &httputil.ReverseProxy{
		Rewrite:       s.rewritePreview,
		Transport:     tr,
		FlushInterval: -1, // server-sent events and streamed responses pass at once
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ErrorHandler:  s.previewError,
	}
}

// preview serves /v1/sandboxes/{id}/ports/{port}/{path...}: HTTP (and
// upgrades such as WebSocket) to the guest's port, with the route prefix
// stripped and the client's airlock credentials removed.
func (s *Server) preview(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.cfg.Ports == nil {
		s.fail(w, r, errNoPorts)
		return
	}
	port, err := strconv.ParseUint(r.PathValue("port"), 10, 16)
	if err != nil || port == 0 {
		s.fail(w, r, errBadPort)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, MaxPreviewBody)
	}
	c := callerOf(r)
	c.Peer = remoteIP(r)
	ctx := context.WithValue(r.Context(), previewKey{}, previewTarget{id: sb.ID, port: uint16(port), caller: c})
	s.previewProxy.ServeHTTP(w, r.WithContext(ctx))
}

type previewKey struct{}

type previewTarget struct {
	id     string
	port   uint16
	caller sandbox.Caller
	host   bool // on a preview host: the path is the guest's as it is
}

// rewritePreview points the outbound request at the guest port: the path
// after the route prefix, the query as sent, Host localhost:<port> (what dev
// servers accept by default), X-Forwarded-For/-Host/-Proto and
// X-Forwarded-Prefix set, and the API key dropped wherever it appears.
func (s *Server) rewritePreview(pr *httputil.ProxyRequest) {
	t, _ := pr.In.Context().Value(previewKey{}).(previewTarget)
	port := strconv.Itoa(int(t.port))
	if t.host {
		out := pr.Out
		out.URL.Scheme, out.URL.Host = "http", t.id+previewHost+":"+port
		out.Host = "localhost:" + port
		pr.SetXForwarded()
		stripKey(out, pr.In.Header)
		stripPreviewToken(out)
		return
	}
	// Segments: "", "v1", "sandboxes", id, "ports", port, rest.
	parts := strings.SplitN(pr.In.URL.EscapedPath(), "/", 7)
	rest := ""
	if len(parts) == 7 {
		rest = parts[6]
	}
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = t.id + previewHost + ":" + port
	out.URL.RawPath = "/" + rest
	if p, err := url.PathUnescape(out.URL.RawPath); err == nil {
		out.URL.Path = p
	} else {
		out.URL.Path, out.URL.RawPath = "/"+pr.In.PathValue("path"), ""
	}
	out.Host = "localhost:" + port
	pr.SetXForwarded()
	out.Header.Set("X-Forwarded-Prefix", "/v1/sandboxes/"+t.id+"/ports/"+port)
	stripKey(out, pr.In.Header)
}

// stripKey removes the airlock API key from an outbound request: the
// headers a key authenticates with (Authorization, X-API-KEY as E2B's SDKs
// send it) and Proxy-Authorization, the dashboard's session cookie, and any
// other header or query parameter that carries a key the inbound request
// sent in either header.
func stripKey(out *http.Request, in http.Header) {
	var keys []string
	if tok, ok := strings.CutPrefix(in.Get("Authorization"), "Bearer "); ok && strings.TrimSpace(tok) != "" {
		keys = append(keys, strings.TrimSpace(tok))
	}
	if tok := strings.TrimSpace(in.Get("X-API-KEY")); tok != "" {
		keys = append(keys, tok)
	}
	out.Header.Del("Authorization")
	out.Header.Del("Proxy-Authorization")
	out.Header.Del("X-API-KEY")
	stripSessionCookie(out.Header)
	for _, key := range keys {
		for name, vals := range out.Header {
			for _, v := range vals {
				if strings.Contains(v, key) {
					out.Header.Del(name)
					break
				}
			}
		}
		if strings.Contains(out.URL.RawQuery, key) || strings.Contains(out.URL.RawQuery, url.QueryEscape(key)) {
			q := out.URL.Query()
			for name, vals := range q {
				for _, v := range vals {
					if strings.Contains(v, key) {
						q.Del(name)
						break
					}
				}
			}
			out.URL.RawQuery = q.Encode()
		}
	}
}

// previewError answers a failed proxy round trip: the manager's categories
// (no such sandbox, not running, network down) as usual, anything else as
// 502 naming the port.
func (s *Server) previewError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client left
	}
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		s.fail(w, r, errPreviewBody)
		return
	}
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrFailedPrecondition, errdefs.ErrUnavailable, errdefs.ErrResourceExhausted} {
		if errors.Is(err, c) {
			s.fail(w, r, err)
			return
		}
	}
	s.log.Debug("preview failed", "request_id", requestID(r), "err", err)
	t, _ := r.Context().Value(previewKey{}).(previewTarget)
	s.fail(w, r, &Error{http.StatusBadGateway, "bad_gateway", "no HTTP answer from guest port " + strconv.Itoa(int(t.port))})
}

// remoteIP is the IP address of r's client as this server saw it (never a
// forwarding header, which the client writes), "" when the connection has
// none (the CLI's in-process pipes, a unix socket). The shim records it as
// the peer of the preview request's connection (net.inbound).
func remoteIP(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	return ap.Addr().Unmap().String()
}
