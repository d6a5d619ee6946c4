package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// The access log (Config.AccessLog) has one line per request, written when
// the request ends (a streamed exec or a terminal's WebSocket when its
// stream ends):
//
//	msg=request method=GET path=/v1/sandboxes status=200 bytes=312
//	duration_ms=1.84 remote=127.0.0.1:50322 request_id=... route="GET /v1/sandboxes"
//	tenant=alice key_id=... (the last two once a key authenticated the request)
//
// path is the URL's path alone: never its query (a preview token or an E2B
// file signature may ride in it), and no header: neither Authorization,
// X-API-KEY nor cookies. bytes counts the response body written through
// the server (not what a WebSocket sends after the upgrade, status 101).
// A path is cut at maxLogPath bytes.

// maxLogPath caps the path an access log line carries.
const maxLogPath = 512

// accessRecord is what the handlers of a request learn for its access
// log line. authenticate fills it on the request's goroutine before the
// handler runs; ServeHTTP reads it after the handler returned.
type accessRecord struct {
	tenant, keyID string
}

type accessKey struct{}

// noteKey records the key that authenticated r for the access log.
func noteKey(r *http.Request, k store.APIKey) {
	if rec, ok := r.Context().Value(accessKey{}).(*accessRecord); ok {
		rec.tenant, rec.keyID = k.Tenant, k.ID
	}
}

// logPath is p as an access log carries it: at most maxLogPath bytes,
// cut on a rune boundary.
func logPath(p string) string {
	if len(p) <= maxLogPath {
		return p
	}
	p = p[:maxLogPath]
	for len(p) > 0 && !utf8.ValidString(p) {
		p = p[:len(p)-1]
	}
	return p + "..."
}

// accessWriter records the status code and the body bytes of a response.
// Flush, Hijack, deadlines and full duplex pass through Unwrap (what
// http.ResponseController and the WebSocket library use); Flush is also a
// method, for handlers that assert http.Flusher (Connect).
type accessWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *accessWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *accessWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *accessWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *accessWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// logAccess writes r's access log line.
func (s *Server) logAccess(r *http.Request, w *accessWriter, rec *accessRecord, took time.Duration) {
	code := w.code
	if code == 0 {
		code = http.StatusOK
	}
	attrs := make([]slog.Attr, 0, 11)
	attrs = append(attrs,
		slog.String("method", r.Method),
		slog.String("path", logPath(r.URL.Path)),
		slog.Int("status", code),
		slog.Int64("bytes", w.bytes),
		slog.Float64("duration_ms", float64(took.Microseconds())/1000),
		slog.String("remote", r.RemoteAddr),
		slog.String("request_id", requestID(r)),
	)
	if r.Pattern != "" {
		attrs = append(attrs, slog.String("route", r.Pattern))
	}
	if rec.keyID != "" {
		attrs = append(attrs, slog.String("tenant", rec.tenant), slog.String("key_id", rec.keyID))
	}
	s.cfg.AccessLog.LogAttrs(context.WithoutCancel(r.Context()), slog.LevelInfo, "request", attrs...)
}

// inFlight counts the requests being served (hijacked ones, WebSockets,
// too: they count until their handler returns).
type inFlight struct {
	mu sync.Mutex
	n  int
	// idle is closed when n falls to 0; nil while n is 0.
	idle chan struct{}
}

func (f *inFlight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
}

func (f *inFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 {
		close(f.idle)
		f.idle = nil
	}
}

func (f *inFlight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// wait returns nil once no request is in flight, or ctx's cause.
func (f *inFlight) wait(ctx context.Context) error {
	for {
		f.mu.Lock()
		ch := f.idle
		f.mu.Unlock()
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// InFlight returns how many requests the server is serving now (streams
// and WebSockets included). Safe for concurrent use.
func (s *Server) InFlight() int { return s.inflight.count() }

// WaitIdle returns nil once no request is in flight, or ctx's cause. After
// http.Server.Shutdown it waits for what Shutdown does not: WebSockets
// (hijacked connections). Safe for concurrent use.
func (s *Server) WaitIdle(ctx context.Context) error { return s.inflight.wait(ctx) }
