package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

const vaultValue = "ghp-vault-value-7f3a9c1e5b"

// TestVaultSecrets: a vault secret is sealed in the catalog (its value in
// no row, file or event in clear), seen only by its tenant, listed
// without its value, limited in size and kept apart per tenant; set and
// rm are audited by name.
func TestVaultSecrets(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	v, err := m.SetVaultSecret(ctx, alice, "GH_TOKEN", []string{"API.GitHub.com"}, vaultValue)
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "GH_TOKEN" || !slices.Equal(v.Hosts, []string{"api.github.com"}) || v.Created.IsZero() {
		t.Fatalf("set: %+v", v)
	}
	// Bob has a vault of his own.
	if list, err := m.VaultSecrets(ctx, bob); err != nil || len(list) != 0 {
		t.Fatalf("bob's vault: %+v %v", list, err)
	}
	if err := m.DeleteVaultSecret(ctx, bob, "GH_TOKEN"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob removed alice's secret: %v", err)
	}
	if list, err := m.VaultSecrets(ctx, alice); err != nil || len(list) != 1 || list[0].Name != "GH_TOKEN" {
		t.Fatalf("alice's vault: %+v %v", list, err)
	}
	// The sealed row opens only for its tenant and name.
	row, err := m.Store.GetVaultSecret(ctx, "alice", "GH_TOKEN")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(row.Sealed, []byte(vaultValue)) {
		t.Fatal("the catalog row holds the value in clear")
	}
	if plain, err := m.unseal(row.Sealed, vaultAAD("alice", "GH_TOKEN")); err != nil || string(plain) != vaultValue {
		t.Fatalf("unseal: %q %v", plain, err)
	}
	if _, err := m.unseal(row.Sealed, vaultAAD("bob", "GH_TOKEN")); err == nil {
		t.Fatal("alice's sealed value opened as bob's")
	}
	if _, err := m.unseal(row.Sealed, vaultAAD("alice", "OTHER")); err == nil {
		t.Fatal("a sealed value opened under another name")
	}
	// Refusals: bad name, empty or too large a value, a control character.
	for _, tc := range []struct{ name, value string }{
		{"1BAD", "value-9d8c7b"}, {"a-b", "value-9d8c7b"}, {"OK", ""}, {"OK", strings.Repeat("x", MaxVaultValue+1)}, {"OK", "value-\n9d8c7b"},
	} {
		if _, err := m.SetVaultSecret(ctx, alice, tc.name, nil, tc.value); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("set %q (%d bytes): %v, want invalid", tc.name, len(tc.value), err)
		} else if tc.value != "" && strings.Contains(err.Error(), tc.value) {
			t.Errorf("the error holds the value: %v", err)
		}
	}
	if _, err := m.SetVaultSecret(ctx, alice, "OK", []string{"10.0.0.1"}, "v"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an address as host: %v", err)
	}
	if err := m.DeleteVaultSecret(ctx, alice, "GH_TOKEN"); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range events(t, m) {
		actions = append(actions, e.Action+" "+e.Tenant+" "+e.Detail["name"].(string))
		if strings.Contains(string(mustJSON(t, e.Detail)), vaultValue) {
			t.Errorf("event %s holds the value", e.Action)
		}
	}
	if want := []string{"secret.set alice GH_TOKEN", "secret.rm alice GH_TOKEN"}; !slices.Equal(actions, want) {
		t.Errorf("audit %q, want %q", actions, want)
	}
	catalogHasNoValue(t, m.L.Root, vaultValue)
}

// catalogHasNoValue fails if any file under root (the catalog and its WAL)
// holds value.
func catalogHasNoValue(t *testing.T, root, value string) {
	t.Helper()
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(value)) {
			t.Errorf("%s holds the secret value", p)
		}
		return nil
	})
}

// TestVaultLimit: a tenant's vault is full at MaxVaultSecrets.
func TestVaultLimit(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	for i := range MaxVaultSecrets {
		if _, err := m.Store.PutVaultSecret(ctx, store.VaultSecret{Tenant: "alice", Name: "S" + strings.Repeat("x", i%7) + string(rune('A'+i%26)) + string(rune('A'+i/26)), Sealed: []byte{1}}, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.SetVaultSecret(ctx, alice, "ONE_MORE", nil, "v"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a secret over the limit: %v", err)
	}
	if _, err := m.SetVaultSecret(ctx, bob, "ONE_MORE", nil, "v"); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
}

// TestCreateWithVaultSecret: a create that names a vault secret gets its
// value (the shim's document has it, the sealed file keeps it for a
// resume), the vault's hosts where it names none, and is refused a host
// the vault secret does not allow, a secret another tenant holds, or both
// a value and a vault name.
func TestCreateWithVaultSecret(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx := t.Context()
	if _, err := r.m.SetVaultSecret(ctx, alice, "GH", []string{"*.github.com"}, vaultValue); err != nil {
		t.Fatal(err)
	}
	asked := []netconf.Secret{{Name: "GITHUB_TOKEN", Vault: "GH"}}
	sb, err := r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 256, Network: netconf.Spec{Secrets: asked}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(asked[0].Hosts) != 0 {
		t.Error("create changed the caller's spec")
	}
	sec := sb.Network.Secrets
	if len(sec) != 1 || sec[0].Name != "GITHUB_TOKEN" || sec[0].Vault != "GH" || !slices.Equal(sec[0].Hosts, []string{"*.github.com"}) || !netconf.ValidPlaceholder(sec[0].Placeholder) {
		t.Fatalf("stored secrets %+v", sec)
	}
	if sb.Env["GITHUB_TOKEN"] != sec[0].Placeholder {
		t.Fatalf("env %v", sb.Env)
	}
	vals, err := r.m.openSecrets(sb.ID)
	if err != nil || vals["GITHUB_TOKEN"] != vaultValue {
		t.Fatalf("sealed values: %v", err)
	}
	catalogHasNoValue(t, r.m.L.Root, vaultValue)
	if err := r.m.Remove(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    Caller
		sec  netconf.Secret
		vals netconf.Values
	}{
		{"host outside the vault's", alice, netconf.Secret{Name: "T", Vault: "GH", Hosts: []string{"evil.example"}}, nil},
		{"another tenant's", bob, netconf.Secret{Name: "T", Vault: "GH"}, nil},
		{"no such secret", alice, netconf.Secret{Name: "T", Vault: "NOPE"}, nil},
		{"value and vault", alice, netconf.Secret{Name: "T", Vault: "GH"}, netconf.Values{"T": "x"}},
	} {
		_, err := r.m.Create(ctx, tc.c, CreateOptions{MemoryMiB: 256, Network: netconf.Spec{Secrets: []netconf.Secret{tc.sec}}, Secrets: tc.vals})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", tc.name, err)
		}
	}
	// A narrower host under the vault's wildcard is fine.
	sb, err = r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 256, Network: netconf.Spec{Secrets: []netconf.Secret{{Name: "T", Vault: "GH", Hosts: []string{"api.github.com"}}}}})
	if err != nil {
		t.Fatalf("a host under the vault's wildcard: %v", err)
	}
	if err := r.m.Remove(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
