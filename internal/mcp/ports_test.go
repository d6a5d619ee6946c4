package mcp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCreatePorts: sandbox_create publishes ports for a session whose key
// is an admin's (the HTTP API's rule); a tenant's session and a stdio
// session (the local user's agent, not an admin) are refused and nothing
// is created; ports with from_snapshot are refused.
func TestCreatePorts(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	keys := map[string]Principal{"kadmin": {Tenant: "ops", KeyID: "kadmin", Admin: true}, "ka": {Tenant: "a", KeyID: "ka"}}
	srv := httptest.NewServer(h.HTTPHandler(func(r *http.Request) (Principal, bool) {
		p, ok := keys[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		return p, ok
	}))
	var sessions []*sdk.ClientSession
	defer func() {
		// Sessions first: srv.Close waits for their connections.
		for _, cs := range sessions {
			_ = cs.Close()
		}
		if err := h.Close(t.Context()); err != nil {
			t.Error(err)
		}
		srv.Close()
	}()
	open := func(key string) *sdk.ClientSession {
		c := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil)
		cs, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: &http.Client{Transport: bearer{key}}, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, cs)
		return cs
	}
	ports := []map[string]any{{"guest_port": 8080}, {"guest_port": 5432, "host_port": 15432, "host_ip": "127.0.0.1"}}

	txt, res := call(t, open("kadmin"), "sandbox_create", map[string]any{"ports": ports})
	if res.IsError {
		t.Fatalf("admin create: %s", txt)
	}
	var sb sandboxView
	if err := json.Unmarshal([]byte(txt), &sb); err != nil {
		t.Fatal(err)
	}
	if len(sb.Ports) != 2 || sb.Ports[0].GuestPort != 8080 || sb.Ports[1].HostIP != "127.0.0.1" ||
		sb.Ports[1].GuestPort != 5432 || sb.Ports[1].HostPort != 15432 {
		t.Fatalf("admin create: ports %+v in %s", sb.Ports, txt)
	}
	f.mu.Lock()
	stored := f.sbs[sb.ID].Network.Ports
	f.mu.Unlock()
	if len(stored) != 2 || stored[1].HostPort != 15432 || stored[1].GuestPort != 5432 {
		t.Fatalf("the manager got ports %+v", stored)
	}

	before := len(f.ids())
	if txt, res := call(t, open("ka"), "sandbox_create", map[string]any{"ports": ports}); !res.IsError || !strings.Contains(txt, "admin key") {
		t.Errorf("tenant: %q, want refused for want of an admin key", txt)
	}
	stdio, end := connect(t, newHandler(t, f, nil))
	txt, res = call(t, stdio, "sandbox_create", map[string]any{"ports": ports})
	end()
	if !res.IsError || !strings.Contains(txt, "admin key") {
		t.Errorf("stdio: %q, want refused for want of an admin key", txt)
	}
	for _, args := range []map[string]any{
		{"ports": []map[string]any{{"guest_port": 0}}},                  // no guest port
		{"ports": ports, "from_snapshot": "s1"},                         // not with a snapshot
		{"ports": []map[string]any{{"guest_port": 80, "host_ip": "x"}}}, // not an address
	} {
		if txt, res := call(t, open("kadmin"), "sandbox_create", args); !res.IsError {
			t.Errorf("%v: created %s", args, txt)
		}
	}
	if n := len(f.ids()); n != before {
		t.Fatalf("refused creates made sandboxes: %d, then %d", before, n)
	}
}
