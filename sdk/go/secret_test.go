package airlock_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// secretServer answers the vault and sandbox secret routes with canned
// bodies and records each request as "METHOD path body".
func secretServer(t *testing.T) (*airlock.Client, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.EscapedPath()+" "+strings.TrimSpace(string(b)))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == "PUT" && r.URL.Path == "/v1/secrets/GH":
			_, _ = io.WriteString(w, `{"name":"GH","hosts":["api.github.com"],"created_at":"2026-11-26T10:00:00Z","updated_at":"2026-11-26T10:00:00Z"}`)
		case r.Method == "GET" && r.URL.Path == "/v1/secrets":
			_, _ = io.WriteString(w, `{"secrets":[{"name":"GH","hosts":[],"created_at":"2026-11-26T10:00:00Z","updated_at":"2026-11-26T10:00:00Z"}]}`)
		case r.Method == "DELETE" && r.URL.Path == "/v1/secrets/GH":
			w.WriteHeader(http.StatusNoContent)
		case r.Method == "DELETE" && r.URL.Path == "/v1/secrets/NOPE":
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"code":"not_found","message":"secret not found","request_id":"r1"}}`)
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes/sb1/secrets/"):
			_, _ = io.WriteString(w, `{"network":{"mode":"public","secrets":[{"name":"TOKEN","hosts":["api.github.com"],"placeholder":"airlock-secret-00000000000000000000000000000000","vault":"GH"}]},"applied":"running","closed":1}`)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return airlock.New(srv.URL, "key"), func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(seen) }
}

func TestVaultSecrets(t *testing.T) {
	t.Parallel()
	c, seen := secretServer(t)
	ctx := t.Context()
	v, err := c.SetVaultSecret(ctx, "GH", "s3cret-value", "api.github.com")
	if err != nil || v.Name != "GH" || !slices.Equal(v.Hosts, []string{"api.github.com"}) || v.CreatedAt.IsZero() {
		t.Fatalf("set: %+v %v", v, err)
	}
	list, err := c.ListVaultSecrets(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "GH" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := c.DeleteVaultSecret(ctx, "GH"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVaultSecret(ctx, "NOPE"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("delete a missing one: %v", err)
	}
	got := seen()
	var body map[string]any
	if err := json.Unmarshal([]byte(strings.TrimPrefix(got[0], "PUT /v1/secrets/GH ")), &body); err != nil || body["value"] != "s3cret-value" {
		t.Fatalf("set sent %q", got[0])
	}
	if got[1] != "GET /v1/secrets " || got[2] != "DELETE /v1/secrets/GH " {
		t.Fatalf("requests %q", got)
	}
}

func TestSandboxSecrets(t *testing.T) {
	t.Parallel()
	c, seen := secretServer(t)
	ctx := t.Context()
	st, err := c.SetSandboxSecret(ctx, "sb1", airlock.Secret{Name: "TOKEN", Vault: "GH"})
	if err != nil || st.Applied != airlock.AppliedRunning || st.Closed != 1 || len(st.Network.Secrets) != 1 || st.Network.Secrets[0].Vault != "GH" {
		t.Fatalf("set: %+v %v", st, err)
	}
	if _, err := c.SetSandboxSecret(ctx, "sb1", airlock.Secret{Name: "OTHER", Hosts: []string{"a.example"}, Value: "v-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveSandboxSecret(ctx, "sb1", "TOKEN"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`PUT /v1/sandboxes/sb1/secrets/TOKEN {"vault":"GH"}`,
		`PUT /v1/sandboxes/sb1/secrets/OTHER {"hosts":["a.example"],"value":"v-1"}`,
		`DELETE /v1/sandboxes/sb1/secrets/TOKEN `,
	}
	if got := seen(); !slices.Equal(got, want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
}
