package api

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fakeSecrets is the vault of a real manager (on the harness's catalog)
// and the live secrets of the fake's sandboxes: it records the values it
// was given, as the shim would get them.
type fakeSecrets struct {
	*sandbox.Manager
	f *fake

	mu     sync.Mutex
	values map[string]string // sandbox id + "/" + name
}

func (s *fakeSecrets) SetSecret(ctx context.Context, c sandbox.Caller, id string, sec netconf.Secret, value string) (sandbox.NetworkChange, error) {
	sb, err := s.f.lookup(c, id)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	if sec.Vault != "" {
		v, err := s.Store.GetVaultSecret(ctx, c.Tenant, sec.Vault)
		if err != nil {
			return sandbox.NetworkChange{}, fmt.Errorf("%w: no vault secret %q (%v)", errdefs.ErrInvalid, sec.Vault, err)
		}
		if len(sec.Hosts) == 0 {
			sec.Hosts = v.Hosts
		}
		value = "from-vault:" + sec.Vault
	}
	next := sb.Network
	next.Secrets = append(slices.DeleteFunc(slices.Clone(next.Secrets), func(x netconf.Secret) bool { return x.Name == sec.Name }), sec)
	vals := netconf.Values{}
	for _, x := range next.Secrets {
		vals[x.Name] = "v"
	}
	n, err := next.Normalize(vals)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	s.mu.Lock()
	if s.values == nil {
		s.values = map[string]string{}
	}
	s.values[id+"/"+sec.Name] = value
	s.mu.Unlock()
	s.f.mu.Lock()
	sb.Network = n
	s.f.sbs[id] = sb
	s.f.mu.Unlock()
	s.f.audit(c, id, "sandbox.secret.set", map[string]any{"name": sec.Name})
	return sandbox.NetworkChange{Network: n, Applied: "running"}, nil
}

func (s *fakeSecrets) RemoveSecret(_ context.Context, c sandbox.Caller, id, name string) (sandbox.NetworkChange, error) {
	sb, err := s.f.lookup(c, id)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	i := slices.IndexFunc(sb.Network.Secrets, func(x netconf.Secret) bool { return x.Name == name })
	if i < 0 {
		return sandbox.NetworkChange{}, fmt.Errorf("%w: no secret %q", errdefs.ErrNotFound, name)
	}
	sb.Network.Secrets = slices.Delete(slices.Clone(sb.Network.Secrets), i, i+1)
	s.f.mu.Lock()
	s.f.sbs[id] = sb
	s.f.mu.Unlock()
	return sandbox.NetworkChange{Network: sb.Network, Applied: "running", Closed: 1}, nil
}

func (s *fakeSecrets) value(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values[key]
}

// TestVaultRoutes: PUT, GET and DELETE /v1/secrets store, list (never a
// value) and remove a tenant's vault secrets, each tenant its own; bad
// bodies and names are 400, a missing secret 404; set and rm are audited
// by name, and the value is in no answer or event.
func TestVaultRoutes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	const value = "vault-route-value-93be"
	r := h.do(h.alice, "PUT", "/v1/secrets/GH_TOKEN", strings.NewReader(`{"value":"`+value+`","hosts":["api.github.com"]}`))
	if r.code != 200 || strings.Contains(string(r.body), value) {
		t.Fatalf("put: %d %s", r.code, r.body)
	}
	var v VaultSecret
	if err := json.Unmarshal(r.body, &v); err != nil || v.Name != "GH_TOKEN" || !slices.Equal(v.Hosts, []string{"api.github.com"}) {
		t.Fatalf("put answer %s %v", r.body, err)
	}
	list := func(key string) []VaultSecret {
		t.Helper()
		r := h.do(key, "GET", "/v1/secrets", nil)
		var l struct{ Secrets []VaultSecret }
		if r.code != 200 || json.Unmarshal(r.body, &l) != nil || strings.Contains(string(r.body), value) {
			t.Fatalf("list: %d %s", r.code, r.body)
		}
		return l.Secrets
	}
	if l := list(h.alice); len(l) != 1 || l[0].Name != "GH_TOKEN" {
		t.Fatalf("alice's list %+v", l)
	}
	if l := list(h.bob); len(l) != 0 {
		t.Fatalf("bob sees %+v", l)
	}
	for _, tc := range []struct {
		key, method, path, body string
		code                    int
	}{
		{h.alice, "PUT", "/v1/secrets/1BAD", `{"value":"x"}`, 400},
		{h.alice, "PUT", "/v1/secrets/OK", `{}`, 400},
		{h.alice, "PUT", "/v1/secrets/OK", `{"value":"x","extra":1}`, 400},
		{h.alice, "PUT", "/v1/secrets/OK", `{"value":"` + strings.Repeat("x", 16385) + `"}`, 400},
		{h.bob, "DELETE", "/v1/secrets/GH_TOKEN", ``, 404},
		{h.alice, "DELETE", "/v1/secrets/NOPE", ``, 404},
	} {
		if r := h.do(tc.key, tc.method, tc.path, strings.NewReader(tc.body)); r.code != tc.code {
			t.Errorf("%s %s %.40s: %d %s, want %d", tc.method, tc.path, tc.body, r.code, r.body, tc.code)
		}
	}
	if r := h.do(h.alice, "DELETE", "/v1/secrets/GH_TOKEN", nil); r.code != 204 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	if l := list(h.alice); len(l) != 0 {
		t.Fatalf("after delete %+v", l)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{Type: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		b, _ := json.Marshal(e.Detail)
		if strings.Contains(string(b), value) {
			t.Errorf("event %s holds the value", e.Action)
		}
		got = append(got, e.Action+" "+e.Tenant+" "+fmt.Sprint(e.Detail["name"]))
	}
	if want := []string{"secret.set alice GH_TOKEN", "secret.rm alice GH_TOKEN"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
}

// TestSandboxSecretRoutes: PUT and DELETE /v1/sandboxes/{id}/secrets/{name}
// hand the manager a value or a vault name (never both), answer with the
// network (no value) and keep other tenants out.
func TestSandboxSecretRoutes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	srv := h.secrets(t)
	const path = "/v1/sandboxes/aliceaaaaaaa/secrets/"
	const value = "live-route-value-61fd"
	r := h.do(h.alice, "PUT", path+"TOKEN", strings.NewReader(`{"value":"`+value+`","hosts":["api.example.com"]}`))
	if r.code != 200 || strings.Contains(string(r.body), value) {
		t.Fatalf("put: %d %s", r.code, r.body)
	}
	var st NetworkState
	if err := json.Unmarshal(r.body, &st); err != nil || st.Applied != "running" || len(st.Network.Secrets) != 1 || !netconf.ValidPlaceholder(st.Network.Secrets[0].Placeholder) {
		t.Fatalf("put answer %s %v", r.body, err)
	}
	if srv.value("aliceaaaaaaa/TOKEN") != value {
		t.Fatal("the manager did not get the value")
	}
	if r := h.do(h.alice, "PUT", "/v1/secrets/GH", strings.NewReader(`{"value":"x-vault","hosts":["api.github.com"]}`)); r.code != 200 {
		t.Fatalf("vault put: %d %s", r.code, r.body)
	}
	r = h.do(h.alice, "PUT", path+"GITHUB_TOKEN", strings.NewReader(`{"vault":"GH"}`))
	if r.code != 200 || json.Unmarshal(r.body, &st) != nil || len(st.Network.Secrets) != 2 || st.Network.Secrets[1].Vault != "GH" || !slices.Equal(st.Network.Secrets[1].Hosts, []string{"api.github.com"}) {
		t.Fatalf("put from the vault: %d %s", r.code, r.body)
	}
	for _, tc := range []struct {
		key, method, name, body string
		code                    int
	}{
		{h.alice, "PUT", "X", `{"value":"v","vault":"GH","hosts":["a.example"]}`, 400},
		{h.alice, "PUT", "X", `{"hosts":["a.example"]}`, 400},
		{h.alice, "PUT", "X", `{"vault":"NOPE"}`, 400},
		{h.bob, "PUT", "X", `{"value":"v","hosts":["a.example"]}`, 404},
		{h.bob, "DELETE", "TOKEN", ``, 404},
		{h.alice, "DELETE", "NOPE", ``, 404},
	} {
		if r := h.do(tc.key, tc.method, path+tc.name, strings.NewReader(tc.body)); r.code != tc.code {
			t.Errorf("%s %s %s: %d %s, want %d", tc.method, tc.name, tc.body, r.code, r.body, tc.code)
		}
	}
	r = h.do(h.alice, "DELETE", path+"TOKEN", nil)
	if r.code != 200 || json.Unmarshal(r.body, &st) != nil || len(st.Network.Secrets) != 1 || st.Closed != 1 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
}

// secrets returns the harness server's Secrets (the fake above).
func (h *harness) secrets(t *testing.T) *fakeSecrets {
	t.Helper()
	if h.sec == nil {
		t.Fatal("the harness has no secrets fake")
	}
	return h.sec
}
