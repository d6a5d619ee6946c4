package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestNodeAcceptsOnlyTheControlTier: a node's API takes the node token
// with the caller it names, and nothing else: no tenant key (even one of
// the node's own catalog), no wrong token, no caller without a tenant or
// with bad limits; the named caller sees its own tenant's sandboxes only.
func TestNodeAcceptsOnlyTheControlTier(t *testing.T) {
	f, st := newFakeOnCatalog(t)
	f.add("aliceaaaaaaa", "alice")
	f.add("bobbbbbbbbbb", "bob")
	_, bobKey, err := st.CreateKey(t.Context(), store.APIKey{Tenant: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	token := strings.Repeat("n", MinNodeToken)
	if _, err := New(Config{Sandboxes: f, Files: f, Events: st, Keys: st, NodeToken: []byte("short")}); err == nil {
		t.Fatal("a short node token was accepted")
	}
	s, err := New(Config{Sandboxes: f, Files: f, Execs: f, Contexts: f, Ports: f, Snapshots: f, Events: st, Keys: st, NodeToken: []byte(token)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	get := func(auth, caller, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		if caller != "" {
			req.Header.Set(NodeCallerHeader, caller)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	alice := NodeCaller(store.APIKey{ID: "k1", Tenant: "alice", MaxSandboxes: 3})
	for _, c := range []struct {
		name, auth, caller string
		want               int
	}{
		{"no token", "", alice, http.StatusUnauthorized},
		{"a tenant key of the node's catalog", bobKey, alice, http.StatusUnauthorized},
		{"a wrong token", strings.Repeat("x", MinNodeToken), alice, http.StatusUnauthorized},
		{"the token with no caller", token, "", http.StatusBadRequest},
		{"a caller with no tenant (the local admin)", token, `{"Admin":true}`, http.StatusBadRequest},
		{"a caller with negative limits", token, NodeCaller(store.APIKey{Tenant: "alice", MaxSandboxes: -1}), http.StatusBadRequest},
		{"a revoked caller", token, NodeCaller(store.APIKey{Tenant: "alice", Revoked: true}), http.StatusBadRequest},
		{"a caller with an unknown field", token, `{"Tenant":"alice","Sudo":true}`, http.StatusBadRequest},
		{"a caller over the size bound", token, `{"Tenant":"alice","ID":"` + strings.Repeat("a", maxNodeCaller) + `"}`, http.StatusBadRequest},
	} {
		if code, body := get(c.auth, c.caller, "/v1/sandboxes"); code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
		}
	}
	code, body := get(token, alice, "/v1/sandboxes")
	if code != http.StatusOK || !strings.Contains(body, "aliceaaaaaaa") || strings.Contains(body, "bobbbbbbbbbb") {
		t.Fatalf("alice through the control tier: %d %s", code, body)
	}
	if code, _ := get(token, alice, "/v1/sandboxes/bobbbbbbbbbb"); code != http.StatusNotFound {
		t.Fatalf("alice read bob's sandbox through the node: %d", code)
	}
}
