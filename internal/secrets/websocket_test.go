package secrets

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
)

// wsHandler is an upstream that accepts a WebSocket handshake, reflecting
// the Authorization header in its 101, and then echoes bytes until EOF.
func wsHandler(h *harness) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.reqs = append(h.reqs, seen{r.Method, r.RequestURI, r.Host, r.Header.Clone(), "", false, r.Proto})
		h.mu.Unlock()
		if r.Header.Get("Upgrade") != "websocket" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\nX-Echo: %s\r\n\r\n",
			r.Header.Get("Authorization"))
		if brw.Flush() != nil {
			return
		}
		_, _ = io.Copy(conn, brw)
	}
}

func TestInterceptWebSocket(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, testSecrets, wsHandler(h))
	g := h.connect(t, "api.test", nil)

	if _, err := io.WriteString(g, "GET /ws?k="+ph1+" HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\n"+
		"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(g.br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "websocket" {
		t.Fatalf("status %d, header %v", resp.StatusCode, resp.Header)
	}
	assertNoValue(t, "101 header", fmt.Sprint(resp.Header))
	if resp.Header.Get("X-Echo") != "Bearer "+ph1 {
		t.Errorf("reflection not replaced by the placeholder: %q", resp.Header.Get("X-Echo"))
	}
	got := h.seen()
	if len(got) != 1 || got[0].header.Get("Authorization") != "Bearer "+apiValue || got[0].uri != "/ws?k="+apiValue ||
		got[0].header.Get("Sec-WebSocket-Key") != "dGhlIHNhbXBsZSBub25jZQ==" || got[0].header.Get("Connection") != "Upgrade" {
		t.Fatalf("upstream saw %+v", got)
	}

	// After the 101 the bytes go both ways untouched: no injection.
	frames := "\x81\x05hello" + ph1
	if _, err := io.WriteString(g, frames); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(frames))
	if _, err := io.ReadFull(g.br, buf); err != nil || string(buf) != frames {
		t.Fatalf("echo %q, %v; want %q", buf, err, frames)
	}
	if err := g.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(g.br); err != nil || len(rest) != 0 {
		t.Errorf("after close: %q, %v", rest, err)
	}
	if err := <-g.serve; err != nil {
		t.Errorf("Serve: %v", err)
	}
	g.serve <- nil
	evs := h.audit()
	if len(evs) != 1 || evs[0].Action != ActionInject || !slices.Equal(evs[0].Secrets, []string{"API_KEY"}) || evs[0].Path != "/ws" {
		t.Errorf("events = %+v", evs)
	}
}

func TestInterceptWebSocketRefusals(t *testing.T) {
	t.Parallel()
	const ws = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
	const key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	tests := map[string]struct {
		raw    string
		status int
	}{
		"no key":           {"GET / HTTP/1.1\r\nHost: api.test\r\n" + ws + "\r\n", 501},
		"two keys":         {"GET / HTTP/1.1\r\nHost: api.test\r\n" + ws + key + key + "\r\n", 501},
		"version 8":        {"GET / HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 8\r\n" + key + "\r\n", 501},
		"post":             {"POST / HTTP/1.1\r\nHost: api.test\r\n" + ws + key + "\r\n", 501},
		"no connection":    {"GET / HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n" + key + "\r\n", 501},
		"other protocol":   {"GET / HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", 501},
		"two upgrades":     {"GET / HTTP/1.1\r\nHost: api.test\r\n" + ws + "Upgrade: websocket\r\n" + key + "\r\n", 501},
		"with body":        {"GET / HTTP/1.1\r\nHost: api.test\r\n" + ws + key + "Content-Length: 1\r\n\r\nx", 400},
		"foreign in frame": {"GET / HTTP/1.1\r\nHost: api.test\r\n" + ws + key + "X-Key: " + ph2 + "\r\n\r\n", 403},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := &harness{}
			h.start(t, testSecrets, wsHandler(h))
			g := h.connect(t, "api.test", nil)
			resp, body := g.do(t, tt.raw)
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if got := h.seen(); len(got) != 0 {
				t.Errorf("upstream saw %+v", got)
			}
		})
	}
}

// An upstream that answers a WebSocket handshake with a normal response
// keeps the connection an HTTP one only if it says so; a 101 to a request
// that was not a WebSocket handshake is an upstream failure.
func TestInterceptWebSocketDeclined(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, testSecrets, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, "no websockets here", http.StatusBadRequest)
	})
	g := h.connect(t, "api.test", nil)
	resp, body := g.do(t, "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest || body != "no websockets here\n" {
		t.Errorf("status %d: %q", resp.StatusCode, body)
	}
	if err := <-g.serve; err != nil {
		t.Errorf("Serve: %v", err)
	}
	g.serve <- nil
}
