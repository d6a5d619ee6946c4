package browser

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/coder/websocket"
)

const browserID = "0d0c5a8e-4b8f-4f38-9b0a-7c2f1c0d2a11"

// fakeChromium answers like Chromium's DevTools port: /json/version,
// /json/list and WebSockets that echo, recording each request's headers.
type fakeChromium struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []http.Header
}

func newFakeChromium(t *testing.T) *fakeChromium {
	f := &fakeChromium{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		h := r.Header.Clone()
		h.Set("X-Host", r.Host)
		f.seen = append(f.seen, h)
		f.mu.Unlock()
		if r.Host != upstreamHost {
			http.Error(w, "Host header is specified and is not an IP address or localhost.", http.StatusInternalServerError)
			return
		}
		switch r.URL.Path {
		case "/json/version":
			_ = json.NewEncoder(w).Encode(Version{Browser: "Chrome/156.0", ProtocolVersion: "1.3", WebSocketDebuggerURL: "ws://127.0.0.1:9223/devtools/browser/" + browserID})
		case "/json/list":
			_ = json.NewEncoder(w).Encode([]target{
				{ID: "ABCDEF0123456789ABCDEF0123456789", Type: "page", URL: "about:blank", WebSocketDebuggerURL: "ws://127.0.0.1:9223/devtools/page/ABCDEF0123456789ABCDEF0123456789"},
				{ID: "worker1", Type: "service_worker", URL: "https://a.test/sw.js", WebSocketDebuggerURL: "ws://127.0.0.1:9223/devtools/page/worker1"},
			})
		case "/devtools/browser/" + browserID, "/devtools/page/ABCDEF0123456789ABCDEF0123456789":
			c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
			if err != nil {
				return
			}
			c.SetReadLimit(1 << 20)
			for {
				typ, b, err := c.Read(context.Background())
				if err != nil {
					return
				}
				if err := c.Write(context.Background(), typ, b); err != nil {
					return
				}
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeChromium) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.srv.Listener.Addr().String())
}

func (f *fakeChromium) last() http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[len(f.seen)-1]
}

const prefix = "/v1/sandboxes/abc/browser/cdp"

var testClient = &http.Client{Timeout: 30 * time.Second}

func newProxy(t *testing.T, d Dialer) *httptest.Server {
	pub, _ := url.Parse("ws://api.example:7070" + prefix + "?token=t1")
	p := &Proxy{Dial: d, Public: pub, Prefix: prefix}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, prefix) {
			http.NotFound(w, r)
			return
		}
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func getJSONT(t *testing.T, u string, v any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if v != nil && res.StatusCode == http.StatusOK {
		if err := json.NewDecoder(res.Body).Decode(v); err != nil {
			t.Fatal(err)
		}
	}
	return res.StatusCode
}

func TestProxyDiscovery(t *testing.T) {
	f := newFakeChromium(t)
	s := newProxy(t, f.dial)
	for _, path := range []string{prefix, prefix + "/", prefix + "/json/version", prefix + "/json/version/"} {
		var v Version
		if code := getJSONT(t, s.URL+path, &v); code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		if v.Browser != "Chrome/156.0" || v.WebSocketDebuggerURL != "ws://api.example:7070"+prefix+"?token=t1" {
			t.Errorf("%s: %+v", path, v)
		}
	}
	var ts []target
	if code := getJSONT(t, s.URL+prefix+"/json/list", &ts); code != http.StatusOK || len(ts) != 2 {
		t.Fatalf("json/list: %d %+v", code, ts)
	}
	if want := "ws://api.example:7070" + prefix + "/devtools/page/ABCDEF0123456789ABCDEF0123456789?token=t1"; ts[0].WebSocketDebuggerURL != want {
		t.Errorf("page's URL %q, want %q", ts[0].WebSocketDebuggerURL, want)
	}
	if ts[1].WebSocketDebuggerURL != "" {
		t.Errorf("a service worker got a WebSocket URL through the proxy: %q", ts[1].WebSocketDebuggerURL)
	}
	for path, want := range map[string]int{
		prefix + "/json/new":                      http.StatusNotFound,
		prefix + "/devtools/page/bad%21id":        http.StatusBadRequest,
		prefix + "/devtools/page/x/y":             http.StatusBadRequest,
		prefix + "/devtools/browser/" + browserID: http.StatusBadRequest, // not an upgrade
	} {
		if code := getJSONT(t, s.URL+path, nil); code != want {
			t.Errorf("%s: %d, want %d", path, code, want)
		}
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.URL+prefix+"/json/version", nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", res.StatusCode)
	}
}

// TestProxyWebSocket: the handshake reaches Chromium with Host 127.0.0.1
// and without the client's credentials, cookies or Origin; messages pass
// both ways.
func TestProxyWebSocket(t *testing.T) {
	f := newFakeChromium(t)
	s := newProxy(t, f.dial)
	for _, path := range []string{prefix, prefix + "/devtools/page/ABCDEF0123456789ABCDEF0123456789"} {
		h := http.Header{"Authorization": {"Bearer secret-key"}, "Cookie": {"airlock_session=s"}, "Origin": {"http://evil.example"}, "X-Api-Key": {"k"}}
		c, _, err := websocket.Dial(t.Context(), "ws"+strings.TrimPrefix(s.URL, "http")+path, &websocket.DialOptions{HTTPHeader: h})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if err := c.Write(t.Context(), websocket.MessageText, []byte(`{"id":1,"method":"Browser.getVersion"}`)); err != nil {
			t.Fatal(err)
		}
		_, b, err := c.Read(t.Context())
		if err != nil || string(b) != `{"id":1,"method":"Browser.getVersion"}` {
			t.Fatalf("%s: echo %q %v", path, b, err)
		}
		_ = c.CloseNow()
		seen := f.last()
		if seen.Get("X-Host") != upstreamHost {
			t.Errorf("%s: Host %q", path, seen.Get("X-Host"))
		}
		for _, k := range []string{"Authorization", "Cookie", "Origin", "X-Api-Key"} {
			if seen.Get(k) != "" {
				t.Errorf("%s: %s reached the browser: %q", path, k, seen.Get(k))
			}
		}
	}
}

func TestProxyUpstreamDown(t *testing.T) {
	down := func(context.Context) (net.Conn, error) { return nil, errors.New("guest port 9222: nothing listens") }
	s := newProxy(t, down)
	if code := getJSONT(t, s.URL+prefix+"/json/version", nil); code != http.StatusBadGateway {
		t.Errorf("json/version with the browser down: %d", code)
	}
	var failed error
	pub, _ := url.Parse("ws://x" + prefix)
	p := &Proxy{Dial: down, Public: pub, Prefix: prefix, Fail: func(w http.ResponseWriter, _ *http.Request, err error) {
		failed = err
		w.WriteHeader(http.StatusTeapot)
	}}
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, prefix+"/json/version", nil))
	if rec.Code != http.StatusTeapot || failed == nil {
		t.Errorf("Fail hook: %d %v", rec.Code, failed)
	}
}

// TestTransport drives a chromedp Transport over the proxy's WebSocket:
// a message written comes back (the fake echoes) decoded.
func TestTransport(t *testing.T) {
	f := newFakeChromium(t)
	tr, err := Dial(t.Context(), f.dial)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Write(t.Context(), &cdproto.Message{ID: 7, Method: "Target.getTargets"}); err != nil {
		t.Fatal(err)
	}
	var msg cdproto.Message
	if err := tr.Read(t.Context(), &msg); err != nil || msg.ID != 7 || msg.Method != "Target.getTargets" {
		t.Fatalf("read back %+v %v", msg, err)
	}
}

func TestValidTarget(t *testing.T) {
	for path, want := range map[string]bool{
		"/devtools/browser/" + browserID:                  true,
		"/devtools/page/ABCDEF0123456789ABCDEF0123456789": true,
		"/devtools/page/":                                 false,
		"/devtools/page/a/b":                              false,
		"/devtools/page/..":                               false,
		"/devtools/page/" + strings.Repeat("a", 65):       false,
		"/devtools/page/a%2Fb":                            false,
	} {
		if got := validTarget(path); got != want {
			t.Errorf("validTarget(%q) = %v", path, got)
		}
	}
}
