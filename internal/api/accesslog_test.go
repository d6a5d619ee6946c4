package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func newJSONLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewJSONHandler(w, nil)) }

// accessLine waits for the access log line of the request whose path and
// method match, and returns it raw and decoded.
func accessLine(t *testing.T, o *obsServer, method, path string) (string, map[string]any) {
	t.Helper()
	var raw string
	var line map[string]any
	ok := testutil.WaitFor(t, 10*time.Second, func() bool {
		for l := range strings.Lines(o.accessLines.String()) {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("access log line %q: %v", l, err)
			}
			if m["method"] == method && m["path"] == path {
				raw, line = l, m
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no access log line for %s %s in:\n%s", method, path, o.accessLines.String())
	}
	return raw, line
}

// TestAccessLog: one line per request with method, path, status, bytes,
// duration, remote address, tenant and key id; never the query string, an
// Authorization header or a cookie; a streamed exec logs when it ends.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, true)
	o.f.add("accessalice1", "alice")
	const secret = "tok3n-in-the-query"
	code, body := o.do(t, o.alice, "GET", "/v1/sandboxes?token="+secret+"&preview_token="+secret, "",
		"Cookie", "airlock_preview="+secret+"-cookie", "X-Preview-Token", secret+"-header")
	if code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	raw, l := accessLine(t, o, "GET", "/v1/sandboxes")
	for k, want := range map[string]any{
		"msg": "request", "status": float64(200), "bytes": float64(len(body)),
		"route": "GET /v1/sandboxes", "tenant": "alice", "key_id": o.aliceKeyID,
	} {
		if l[k] != want {
			t.Errorf("%s = %v, want %v (line %s)", k, l[k], want, raw)
		}
	}
	if d, ok := l["duration_ms"].(float64); !ok || d < 0 {
		t.Errorf("duration_ms = %v", l["duration_ms"])
	}
	if r, _ := l["remote"].(string); !strings.HasPrefix(r, "127.0.0.1:") {
		t.Errorf("remote = %v", l["remote"])
	}
	if id, _ := l["request_id"].(string); len(id) != 16 {
		t.Errorf("request_id = %v", l["request_id"])
	}
	for _, s := range []string{secret, "token", "?", o.alice, strings.TrimPrefix(o.alice, "e2b_"), "Bearer", "Cookie"} {
		if strings.Contains(raw, s) {
			t.Errorf("the access log line has %q: %s", s, raw)
		}
	}

	// Unauthenticated: no tenant, no key id.
	if code, _ := o.do(t, "", "GET", "/v1/events", ""); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	_, l = accessLine(t, o, "GET", "/v1/events")
	if l["status"] != float64(401) || l["tenant"] != nil || l["key_id"] != nil {
		t.Errorf("unauthenticated line: %v", l)
	}

	// A streamed exec: the line is written when the stream ends, with the
	// bytes of the whole stream.
	code, body = o.do(t, o.alice, "POST", "/v1/sandboxes/accessalice1/exec", `{"cmd":["echo","hi"]}`)
	if code != 200 || !strings.Contains(string(body), `"type":"exit"`) {
		t.Fatalf("exec: %d %s", code, body)
	}
	_, l = accessLine(t, o, "POST", "/v1/sandboxes/accessalice1/exec")
	if l["status"] != float64(200) || l["bytes"] != float64(len(body)) || l["route"] != "POST /v1/sandboxes/{id}/exec" {
		t.Errorf("exec line: %v (body %d bytes)", l, len(body))
	}
}

// TestNoAccessLog: without Config.AccessLog nothing is logged and requests
// are served as before.
func TestNoAccessLog(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, false)
	if code, _ := o.do(t, "", "GET", "/healthz", ""); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	if s := o.accessLines.String(); s != "" {
		t.Errorf("access log without AccessLog: %s", s)
	}
}

// TestInFlight: the count and WaitIdle, which a graceful stop waits on
// after http.Server.Shutdown (that does not wait for WebSockets).
func TestInFlight(t *testing.T) {
	t.Parallel()
	var f inFlight
	if err := f.wait(t.Context()); err != nil {
		t.Fatalf("wait with none in flight: %v", err)
	}
	f.add()
	f.add()
	if f.count() != 2 {
		t.Fatalf("count = %d", f.count())
	}
	stop := errors.New("drain is over")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(stop)
	if err := f.wait(ctx); !errors.Is(err, stop) {
		t.Fatalf("wait with requests in flight and ctx done = %v, want its cause", err)
	}
	done := make(chan error, 1)
	go func() { done <- f.wait(t.Context()) }()
	f.done()
	select {
	case err := <-done:
		t.Fatalf("wait returned %v with one request still in flight", err)
	default:
	}
	f.done()
	if err := <-done; err != nil {
		t.Fatalf("wait: %v", err)
	}
	if f.count() != 0 {
		t.Fatalf("count = %d", f.count())
	}
}
