package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// SetSecret takes vault secrets only (as MCP gives them), known to the
// fake's vault: "GH" for api.github.com.
func (f *fake) SetSecret(ctx context.Context, c sandbox.Caller, id string, sec netconf.Secret, value string) (sandbox.NetworkChange, error) {
	sb, err := f.Get(ctx, c, id)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	if value != "" || sec.Vault != "GH" {
		return sandbox.NetworkChange{}, fmt.Errorf("%w: secret %s: no secret %q in the vault", errdefs.ErrInvalid, sec.Name, sec.Vault)
	}
	if len(sec.Hosts) == 0 {
		sec.Hosts = []string{"api.github.com"}
	}
	sec.Placeholder = netconf.NewPlaceholder()
	f.mu.Lock()
	sb = f.sbs[id]
	sb.Network.Secrets = append(slices.DeleteFunc(slices.Clone(sb.Network.Secrets), func(s netconf.Secret) bool { return s.Name == sec.Name }), sec)
	f.sbs[id] = sb
	f.mu.Unlock()
	f.audit(c, id, "sandbox.secret.set", map[string]any{"name": sec.Name, "vault": sec.Vault})
	return sandbox.NetworkChange{Network: sb.Network, Applied: "running"}, nil
}

func (f *fake) RemoveSecret(ctx context.Context, c sandbox.Caller, id, name string) (sandbox.NetworkChange, error) {
	sb, err := f.Get(ctx, c, id)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb = f.sbs[id]
	i := slices.IndexFunc(sb.Network.Secrets, func(s netconf.Secret) bool { return s.Name == name })
	if i < 0 {
		return sandbox.NetworkChange{}, fmt.Errorf("%w: sandbox %s has no secret %q", errdefs.ErrNotFound, id, name)
	}
	sb.Network.Secrets = slices.Delete(slices.Clone(sb.Network.Secrets), i, i+1)
	f.sbs[id] = sb
	return sandbox.NetworkChange{Network: sb.Network, Applied: "running", Closed: 2}, nil
}

// TestCreateWithVaultSecrets: sandbox_create's secrets reach the manager
// as vault references (never values); one without vault, or with
// from_snapshot, is refused.
func TestCreateWithVaultSecrets(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()
	txt, res := call(t, cs, "sandbox_create", map[string]any{"secrets": []map[string]any{
		{"vault": "GH"}, {"vault": "NPM", "name": "NPM_TOKEN", "hosts": []string{"registry.npmjs.org"}},
	}})
	if res.IsError {
		t.Fatalf("create: %s", txt)
	}
	var sb sandboxView
	if err := json.Unmarshal([]byte(txt), &sb); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	got := f.sbs[sb.ID].Network.Secrets
	f.mu.Unlock()
	want := []netconf.Secret{{Name: "GH", Vault: "GH"}, {Name: "NPM_TOKEN", Vault: "NPM", Hosts: []string{"registry.npmjs.org"}}}
	if len(got) != 2 || got[0].Name != want[0].Name || got[0].Vault != want[0].Vault || got[1].Name != want[1].Name || got[1].Vault != want[1].Vault || !slices.Equal(got[1].Hosts, want[1].Hosts) {
		t.Fatalf("the manager got secrets %+v, want %+v", got, want)
	}
	for _, args := range []map[string]any{
		{"secrets": []map[string]any{{"name": "X", "hosts": []string{"a.example"}}}},
		{"secrets": []map[string]any{{"vault": "GH"}}, "from_snapshot": "snap"},
		{"secrets": []map[string]any{{"vault": "GH", "value": "sk-x"}}},
	} {
		if txt, res := call(t, cs, "sandbox_create", args); !res.IsError {
			t.Errorf("%v: created %s", args, txt)
		}
	}
}

// TestSecretSetRemove: sandbox_secret_set gives a running sandbox a vault
// secret through the manager (no value), sandbox_secret_remove takes it
// away; a missing vault secret or sandbox is an error that names it.
func TestSecretSetRemove(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()
	txt, res := call(t, cs, "sandbox_create", map[string]any{})
	if res.IsError {
		t.Fatalf("create: %s", txt)
	}
	var sb sandboxView
	if err := json.Unmarshal([]byte(txt), &sb); err != nil {
		t.Fatal(err)
	}
	txt, res = call(t, cs, "sandbox_secret_set", map[string]any{"sandbox_id": sb.ID, "vault": "GH", "name": "GITHUB_TOKEN"})
	if res.IsError {
		t.Fatalf("set: %s", txt)
	}
	var out struct {
		Secrets []struct {
			Name, Vault string
			Hosts       []string
		}
		Applied string
		Closed  int `json:"closed_connections"`
	}
	if err := json.Unmarshal([]byte(txt), &out); err != nil || out.Applied != "running" || len(out.Secrets) != 1 ||
		out.Secrets[0].Name != "GITHUB_TOKEN" || out.Secrets[0].Vault != "GH" || out.Secrets[0].Hosts[0] != "api.github.com" || strings.Contains(txt, "airlock-secret-") {
		t.Fatalf("set: %s (%v)", txt, err)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"sandbox_secret_set", map[string]any{"sandbox_id": sb.ID, "vault": "NOPE"}, "NOPE"},
		{"sandbox_secret_set", map[string]any{"sandbox_id": sb.ID, "name": "X"}, "vault"},
		{"sandbox_secret_set", map[string]any{"sandbox_id": "nosuchsandboxaaaaaaa", "vault": "GH"}, "not found"},
		{"sandbox_secret_remove", map[string]any{"sandbox_id": sb.ID, "name": "NOPE"}, "NOPE"},
	} {
		if txt, res := call(t, cs, tc.tool, tc.args); !res.IsError || !strings.Contains(txt, tc.want) {
			t.Errorf("%s %v: %q, want an error with %q", tc.tool, tc.args, txt, tc.want)
		}
	}
	txt, res = call(t, cs, "sandbox_secret_remove", map[string]any{"sandbox_id": sb.ID, "name": "GITHUB_TOKEN"})
	if res.IsError || json.Unmarshal([]byte(txt), &out) != nil || len(out.Secrets) != 0 || out.Closed != 2 {
		t.Fatalf("remove: %s", txt)
	}
}
