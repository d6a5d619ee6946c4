package airlock

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestBrowserProxy serves a fake server's DevTools routes through
// BrowserProxy: the key is added, the client's cookie and Origin are not
// passed on, JSON answers point at the proxy, a path outside the prefix is
// 404, and a WebSocket goes through both ways.
func TestBrowserProxy(t *testing.T) {
	const id = "abcdefghijklmnopqrst"
	var seen http.Header
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Clone()
		if r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		base := "/v1/sandboxes/" + id + "/browser/cdp"
		switch r.URL.Path {
		case base + "/json/version":
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"Browser": "Chrome/1", "webSocketDebuggerUrl": "ws://" + r.Host + base})
		case base:
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			typ, b, err := c.Read(r.Context())
			if err == nil {
				_ = c.Write(r.Context(), typ, append([]byte("echo:"), b...))
			}
			_ = c.Close(websocket.StatusNormalClosure, "")
		default:
			http.NotFound(w, r)
		}
	}))
	defer upstream.Close()
	c := New(upstream.URL, "k")
	proxy := httptest.NewServer(c.BrowserProxy(id, "/secret"))
	defer proxy.Close()

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, proxy.URL+"/secret/json/version", nil)
	req.Header.Set("Cookie", "airlock_session=s")
	req.Header.Set("Origin", "http://evil.example")
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]string
	err = json.NewDecoder(res.Body).Decode(&v)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("json/version: %d %v", res.StatusCode, err)
	}
	if want := "ws://" + strings.TrimPrefix(proxy.URL, "http://") + "/secret"; v["webSocketDebuggerUrl"] != want {
		t.Errorf("webSocketDebuggerUrl %q, want %q", v["webSocketDebuggerUrl"], want)
	}
	if seen.Get("Cookie") != "" || seen.Get("Origin") != "" {
		t.Errorf("passed on: cookie %q, origin %q", seen.Get("Cookie"), seen.Get("Origin"))
	}
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodGet, proxy.URL+"/json/version", nil)
	if res, err := hc.Do(req); err != nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("outside the prefix: %v %v", res, err)
	} else {
		res.Body.Close()
	}

	ws, _, err := websocket.Dial(t.Context(), v["webSocketDebuggerUrl"], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ws.CloseNow() }()
	if err := ws.Write(t.Context(), websocket.MessageText, []byte(`{"id":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, b, err := ws.Read(t.Context()); err != nil || string(b) != `echo:{"id":1}` {
		t.Fatalf("websocket through the proxy: %q %v", b, err)
	}
}
