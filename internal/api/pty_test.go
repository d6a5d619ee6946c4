package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestPTYWebSocket: the terminal route starts a terminal exec with the
// query's command and size, relays its output as binary messages between
// a started and an exit control message, and refuses what it must before
// upgrading (another tenant's sandbox, a bad size, no key).
func TestPTYWebSocket(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	wsURL := "ws" + strings.TrimPrefix(h.url, "http") + "/v1/sandboxes/aliceaaaaaaa/pty?cmd=sh&cmd=-l&rows=30&cols=100&env=A=1"
	ctx := t.Context()
	c, res, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + h.alice}}})
	if err != nil {
		t.Fatalf("dial: %v (%v)", err, res)
	}
	defer func() { _ = c.CloseNow() }()
	var msgs []string
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("read: %v after %q", err, msgs)
			}
			break
		}
		if typ == websocket.MessageBinary {
			msgs = append(msgs, "bin:"+string(b))
			continue
		}
		var m ptyControl
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		switch m.Type {
		case "started":
			msgs = append(msgs, "started:"+m.ExecID)
		case "exit":
			msgs = append(msgs, "exit:"+string(rune('0'+m.Exit.Code)))
		default:
			msgs = append(msgs, m.Type+":"+m.Error)
		}
	}
	if got := strings.Join(msgs, " "); got != "started:"+fakeExecID+" bin:out\xff bin: exit:3" {
		t.Fatalf("messages %q", got)
	}
	h.fake.mu.Lock()
	start := h.fake.starts[len(h.fake.starts)-1]
	h.fake.mu.Unlock()
	if strings.Join(start.Argv, " ") != "sh -l" || !start.Stdin || !strings.Contains(strings.Join(start.Env, " "), "A=1") {
		t.Fatalf("start %+v", start)
	}
	// A plain GET is told to upgrade, and starts nothing.
	n := len(h.fake.starts)
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/pty", nil); r.code != http.StatusUpgradeRequired || len(h.fake.starts) != n {
		t.Fatalf("plain GET: %d %s", r.code, r.body)
	}
	// Refusals are plain HTTP answers before any upgrade.
	for _, tc := range []struct {
		key, path string
		code      int
	}{
		{h.bob, "/v1/sandboxes/aliceaaaaaaa/pty", 404},
		{h.alice, "/v1/sandboxes/aliceaaaaaaa/pty?rows=0", 400},
		{h.alice, "/v1/sandboxes/aliceaaaaaaa/pty?env=novalue", 400},
		{"", "/v1/sandboxes/aliceaaaaaaa/pty", 401},
	} {
		hdr := http.Header{}
		if tc.key != "" {
			hdr.Set("Authorization", "Bearer "+tc.key)
		}
		_, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.url, "http")+tc.path, &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil || res == nil || res.StatusCode != tc.code {
			t.Errorf("%s with key %q: %v %v, want %d", tc.path, tc.key, res, err, tc.code)
		}
	}
}
