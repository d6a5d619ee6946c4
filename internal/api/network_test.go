package api

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestNetworkSecretNeverLeaks creates a sandbox with a secret and checks
// that its value reaches the manager and nothing else: not the create,
// get, list or events responses, nor the audit trail, nor error bodies.
func TestNetworkSecretNeverLeaks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	const value = "sk-live-0123456789-do-not-leak"
	body := `{"network":{"mode":"deny","allow":["api.github.com","93.184.0.0/16:443"],
		"secrets":[{"name":"OPENAI_API_KEY","hosts":["api.openai.com"],"value":"` + value + `"}],
		"rate_bytes":1048576,"max_conns":256}}`
	var bodies []string
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(body))
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	bodies = append(bodies, string(r.body))
	var sb Sandbox
	if err := json.Unmarshal(r.body, &sb); err != nil {
		t.Fatal(err)
	}
	n := sb.Network
	if n.Mode != "deny" || len(n.Allow) != 2 || n.RateBytes != 1<<20 || n.MaxConns != 256 || len(n.Secrets) != 1 ||
		n.Secrets[0].Name != "OPENAI_API_KEY" || n.Secrets[0].Hosts[0] != "api.openai.com" || !netconf.ValidPlaceholder(n.Secrets[0].Placeholder) {
		t.Errorf("network in the response: %+v", n)
	}
	if o := h.fake.created[0]; o.Secrets["OPENAI_API_KEY"] != value || o.Network.Mode != "deny" || o.Network.Secrets[0].Name != "OPENAI_API_KEY" {
		t.Errorf("create options: %+v", o.Network)
	}
	for _, p := range []string{"/v1/sandboxes/" + sb.ID, "/v1/sandboxes", "/v1/events", "/v1/events?type=sandbox"} {
		r := h.do(h.alice, "GET", p, nil)
		if r.code != 200 {
			t.Fatalf("%s: %d %s", p, r.code, r.body)
		}
		bodies = append(bodies, string(r.body))
	}
	if !strings.Contains(bodies[3], `"secrets":["OPENAI_API_KEY"]`) {
		t.Errorf("sandbox.create event lacks the secret's name: %s", bodies[3])
	}
	// Refused creates: the value is not echoed in the error.
	for _, bad := range []string{
		`{"network":{"mode":"none","secrets":[{"name":"K","hosts":["a.example"],"value":"` + value + `"}]}}`,
		`{"network":{"secrets":[{"name":"K","hosts":["a.example:443"],"value":"` + value + `"}]}}`,
		`{"network":{"secrets":[{"name":"K","hosts":["a.example"],"value":"` + value + `\n"}]}}`,
		`{"network":{"secrets":[{"name":"K","hosts":["a.example"],"value":"` + value + `"},{"name":"K","hosts":["b.example"],"value":"` + value + `"}]}}`,
		`{"network":{"secrets":[{"name":"K","hosts":["a.example"],"value":"` + value + `","extra":1}]}}`,
		`{"network":{"secrets":[{"name":"1K","hosts":["a.example"],"value":` + `"` + value + `"}]}}`,
		`{"network":{"secrets":[{"name":"K","hosts":["a.example"],"value":7}]}}`,
	} {
		r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(bad))
		if r.code != 400 {
			t.Errorf("%s: %d %s", bad, r.code, r.body)
		}
		bodies = append(bodies, string(r.body))
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	bodies = append(bodies, toJSON(evs), h.logs.String())
	if !strings.Contains(h.logs.String(), "request refused") {
		t.Errorf("no debug log of the refused creates: %q", h.logs.String())
	}
	for _, b := range bodies {
		if strings.Contains(b, value) || strings.Contains(b, "sk-live") {
			t.Fatalf("the secret value leaked: %s", b)
		}
	}
}

func TestNetworkRequest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	for _, tc := range []struct {
		key, body string
		code      int
		msg       string
	}{
		{h.alice, `{"network":"none"}`, 201, ""},
		{h.alice, `{"network":null}`, 201, ""},
		{h.alice, `{"network":{"allow":["*.pythonhosted.org"]}}`, 201, ""},
		{h.alice, `{"network":"host"}`, 400, "network mode"},
		{h.alice, `{"network":{"mode":"none","allow":["a.example"]}}`, 400, "no allow rules"},
		{h.alice, `{"network":{"bogus":1}}`, 400, "unknown field"},
		{h.alice, `{"network":{"secrets":[{"name":"K","hosts":["a.example"]}]}}`, 400, "secret K has no value"},
		{h.alice, `{"network":{"max_conns":-1}}`, 400, "max connections"},
		{h.alice, `{"network":{"ports":[{"host_port":8080,"guest_port":8000}]}}`, 403, "admin key"},
		{h.admin, `{"network":{"ports":[{"host_ip":"127.0.0.1","host_port":8080,"guest_port":8000}]}}`, 201, ""},
		{h.admin, `{"network":{"ports":[{"host_ip":"nope","host_port":8080,"guest_port":8000}]}}`, 400, "host address"},
		{h.alice, `{"network":{"allow":["10.0.0.0/8"]}}`, 403, "needs an admin key"},
		{h.alice, `{"network":{"mode":"public","allow":["169.254.169.254:80"]}}`, 403, "needs an admin key"},
		{h.alice, `{"network":{"allow":["[fd00::1]"]}}`, 403, "needs an admin key"},
		{h.alice, `{"network":{"allow":["203.0.114.0/24:443","api.example.com"]}}`, 201, ""},
		{h.admin, `{"network":{"allow":["10.1.2.3:5432"]}}`, 201, ""},
	} {
		r := h.do(tc.key, "POST", "/v1/sandboxes", strings.NewReader(tc.body))
		if r.code != tc.code {
			t.Errorf("%s: %d %s", tc.body, r.code, r.body)
			continue
		}
		if tc.msg != "" {
			if e := r.err(t); !strings.Contains(e.Error.Message, tc.msg) {
				t.Errorf("%s: message %q lacks %q", tc.body, e.Error.Message, tc.msg)
			}
		}
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"network":{"ports":[{"guest_port":1}]}}`)); r.code != 403 || r.err(t).Error.Code != "permission_denied" {
		t.Errorf("ports as a tenant: %d %s", r.code, r.body)
	}
	h.fake.mu.Lock()
	defer h.fake.mu.Unlock()
	if got := h.fake.created[0].Network.Mode; got != "none" {
		t.Errorf("shorthand mode: %q", got)
	}
	if p := h.fake.created[3].Network.Ports; len(p) != 1 || p[0].GuestPort != 8000 || p[0].HostPort != 8080 {
		t.Errorf("ports: %+v", p)
	}
}

func TestEventsType(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	for _, e := range []store.Event{
		{Tenant: "alice", SandboxID: "aliceaaaaaaa", Action: "net.allow"},
		{Tenant: "alice", SandboxID: "aliceaaaaaaa", Action: "exec.start"},
		{Tenant: "alice", SandboxID: "aliceaaaaaaa", Action: "net.secret.inject"},
		{Tenant: "alice", SandboxID: "other0000000", Action: "net.deny"},
		{Tenant: "bob", SandboxID: "bobbbbbbbbbb", Action: "net.deny"},
	} {
		if _, err := h.st.AppendEvent(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	actions := func(q string) string {
		var out struct{ Events []store.Event }
		r := h.do(h.alice, "GET", "/v1/events"+q, nil)
		if err := json.Unmarshal(r.body, &out); err != nil || r.code != 200 {
			t.Fatalf("%s: %d %s", q, r.code, r.body)
		}
		var a []string
		for _, e := range out.Events {
			a = append(a, e.Action)
		}
		return strings.Join(a, ",")
	}
	if got := actions("?type=net&sandbox=aliceaaaaaaa"); got != "net.allow,net.secret.inject" {
		t.Errorf("type=net&sandbox: %s", got)
	}
	if got := actions("?type=net"); got != "net.allow,net.secret.inject,net.deny" {
		t.Errorf("type=net: %s", got)
	}
	if got := actions("?type=net.secret.inject"); got != "net.secret.inject" {
		t.Errorf("type=net.secret.inject: %s", got)
	}
}

// TestPreview proxies through the preview route to an in-test HTTP server
// that DialPort reaches over a pipe.
func TestPreview(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	h.fake.serveGuest(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Guest", "yes")
		w.WriteHeader(http.StatusTeapot)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"method": r.Method, "path": r.URL.EscapedPath(), "query": r.URL.RawQuery, "host": r.Host,
			"header": r.Header, "body": string(b),
		})
	}))

	type echo struct {
		Method, Path, Query, Host, Body string
		Header                          http.Header
	}
	call := func(key, method, path, body string, hdr map[string]string) (resp, echo) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, h.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var e echo
		_ = json.Unmarshal(b, &e)
		return resp{res.StatusCode, res.Header, b}, e
	}

	r, e := call(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/ports/8000/a/b%2Fc?x=1&k="+h.alice, "",
		map[string]string{"X-Leak": "Bearer " + h.alice, "X-Keep": "1", "Cookie": "c=1"})
	if r.code != http.StatusTeapot || r.hdr.Get("X-Guest") != "yes" {
		t.Fatalf("preview: %d %s", r.code, r.body)
	}
	if e.Method != "GET" || e.Path != "/a/b%2Fc" || e.Query != "x=1" || e.Host != "localhost:8000" {
		t.Errorf("guest saw %+v", e)
	}
	if e.Header.Get("Authorization") != "" || e.Header.Get("X-Leak") != "" || e.Header.Get("X-Keep") != "1" || e.Header.Get("Cookie") != "c=1" {
		t.Errorf("guest headers %v", e.Header)
	}
	if e.Header.Get("X-Forwarded-Prefix") != "/v1/sandboxes/aliceaaaaaaa/ports/8000" || e.Header.Get("X-Forwarded-For") == "" ||
		e.Header.Get("X-Forwarded-Proto") != "http" || e.Header.Get("X-Forwarded-Host") == "" {
		t.Errorf("forwarding headers %v", e.Header)
	}
	if strings.Contains(string(r.body), h.alice) {
		t.Error("the API key reached the guest")
	}
	r, e = call(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/ports/3000/", "payload", nil)
	if r.code != http.StatusTeapot || e.Method != "POST" || e.Path != "/" || e.Body != "payload" || e.Host != "localhost:3000" {
		t.Errorf("POST: %d %+v", r.code, e)
	}
	h.fake.mu.Lock()
	dials := strings.Join(h.fake.dials, " ")
	h.fake.mu.Unlock()
	if dials != "aliceaaaaaaa:8000 aliceaaaaaaa:3000" {
		t.Errorf("dials %q", dials)
	}
	// The client's address (as the server saw it) goes with each dial, for
	// the shim's net.inbound event.
	h.fake.mu.Lock()
	peers := strings.Join(h.fake.peers, " ")
	h.fake.mu.Unlock()
	if peers != "127.0.0.1 127.0.0.1" {
		t.Errorf("peers %q, want the test client's 127.0.0.1 each time", peers)
	}

	for _, tc := range []struct {
		key, path string
		code      int
		msg       string
	}{
		{h.bob, "/v1/sandboxes/aliceaaaaaaa/ports/8000/", 404, "sandbox not found"},
		{h.alice, "/v1/sandboxes/aliceaaaaaaa/ports/0/", 400, "port"},
		{h.alice, "/v1/sandboxes/aliceaaaaaaa/ports/65536/", 400, "port"},
		{h.alice, "/v1/sandboxes/aliceaaaaaaa/ports/http/", 400, "port"},
		{h.alice, "/v1/sandboxes/aliceaaaaaaa/ports/9/", 503, "unavailable"},
	} {
		r, _ := call(tc.key, "GET", tc.path, "", nil)
		if r.code != tc.code || !strings.Contains(string(r.body), tc.msg) {
			t.Errorf("%s: %d %s", tc.path, r.code, r.body)
		}
	}
	if r := h.do("", "GET", "/v1/sandboxes/aliceaaaaaaa/ports/8000/", nil); r.code != 401 {
		t.Errorf("without a key: %d", r.code)
	}
}

// TestPreviewDropsXAPIKey: a key sent in X-API-KEY (as E2B's SDKs send
// it) authenticates the preview route like a Bearer key and, like it,
// never reaches the guest: not the header, nor a copy of the key in
// another header or the query.
func TestPreviewDropsXAPIKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	h.fake.serveGuest(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"query": r.URL.RawQuery, "header": r.Header})
	}))

	req, _ := http.NewRequestWithContext(t.Context(), "GET", h.url+"/v1/sandboxes/aliceaaaaaaa/ports/8000/?x=1&k="+h.alice, nil)
	req.Header.Set("X-API-KEY", h.alice)
	req.Header.Set("X-Leak", "key "+h.alice)
	req.Header.Set("X-Keep", "1")
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var e struct {
		Query  string
		Header http.Header
	}
	if err := json.Unmarshal(b, &e); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("preview with X-API-KEY: %d %s", res.StatusCode, b)
	}
	if strings.Contains(string(b), h.alice) {
		t.Errorf("the API key reached the guest: %s", b)
	}
	if e.Header.Get("X-Keep") != "1" || e.Query != "x=1" {
		t.Errorf("the guest lost what was not the key: query %q, headers %v", e.Query, e.Header)
	}
}

// TestNetworkSecretHeader: a secret scoped to one header keeps its scope,
// canonicalised, through create and back; a framing header is refused.
func TestNetworkSecretHeader(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(
		`{"network":{"secrets":[{"name":"K","hosts":["api.example.com"],"header":"x-api-key","value":"v-123"}]}}`))
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var sb Sandbox
	if err := json.Unmarshal(r.body, &sb); err != nil {
		t.Fatal(err)
	}
	if n := sb.Network; len(n.Secrets) != 1 || n.Secrets[0].Header != "X-Api-Key" {
		t.Errorf("network in the response: %+v", n)
	}
	if o := h.fake.created[0]; o.Network.Secrets[0].Header != "x-api-key" { // the manager normalises
		t.Errorf("create options: %+v", o.Network)
	}
	r = h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(
		`{"network":{"secrets":[{"name":"K","hosts":["api.example.com"],"header":"Host","value":"v-123"}]}}`))
	if r.code != 400 || strings.Contains(string(r.body), "v-123") {
		t.Errorf("header Host: %d %s", r.code, r.body)
	}
}
