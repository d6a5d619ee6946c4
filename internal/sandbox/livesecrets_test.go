package sandbox

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// secretEvents returns sandbox id's sandbox.secret.* events as "action
// name applied" lines, failing if any holds value.
func secretEvents(t *testing.T, st *store.Store, id, value string) []string {
	t.Helper()
	evs, err := st.ListEvents(t.Context(), store.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if strings.Contains(string(mustJSON(t, e.Detail)), value) {
			t.Errorf("event %s holds the value", e.Action)
		}
		if strings.HasPrefix(e.Action, "sandbox.secret.") {
			out = append(out, e.Action+" "+e.Detail["name"].(string)+" "+e.Detail["applied"].(string))
		}
	}
	return out
}

// TestLiveSecretsRunning: a running sandbox gets a vault secret and a
// given one live (the row's network and environment, the sealed values,
// the shim's answer), loses one, and every change is audited by name; the
// value is nowhere in the catalog in clear.
func TestLiveSecretsRunning(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx := t.Context()
	sb, err := r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 256, Env: map[string]string{"PLAIN": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.SetVaultSecret(ctx, alice, "GH", []string{"api.github.com"}, vaultValue); err != nil {
		t.Fatal(err)
	}
	ch, err := r.m.SetSecret(ctx, alice, sb.ID, netconf.Secret{Name: "GITHUB_TOKEN", Vault: "GH"}, "")
	if err != nil {
		t.Fatalf("set from the vault: %v", err)
	}
	if ch.Applied != "running" || len(ch.Network.Secrets) != 1 || ch.Network.Secrets[0].Vault != "GH" || !slices.Equal(ch.Network.Secrets[0].Hosts, []string{"api.github.com"}) {
		t.Fatalf("change %+v", ch)
	}
	ph := ch.Network.Secrets[0].Placeholder
	const given = "given-value-55e1"
	if _, err := r.m.SetSecret(ctx, alice, sb.ID, netconf.Secret{Name: "OTHER", Hosts: []string{"other.example"}}, given); err != nil {
		t.Fatal(err)
	}
	row, err := r.Store.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Env["GITHUB_TOKEN"] != ph || !netconf.ValidPlaceholder(row.Env["OTHER"]) || row.Env["PLAIN"] != "x" || row.Env["SSL_CERT_FILE"] == "" || len(row.Network.Secrets) != 2 {
		t.Fatalf("row env %v network %+v", row.Env, row.Network)
	}
	vals, err := r.m.openSecrets(sb.ID)
	if err != nil || vals["GITHUB_TOKEN"] != vaultValue || vals["OTHER"] != given {
		t.Fatalf("sealed values: %v", err)
	}
	// Replacing keeps the placeholder the guest already has.
	if ch, err := r.m.SetSecret(ctx, alice, sb.ID, netconf.Secret{Name: "GITHUB_TOKEN", Hosts: []string{"api.github.com"}}, "replaced-value-1"); err != nil || ch.Network.Secrets[1].Placeholder != ph {
		t.Fatalf("replace: %+v %v", ch, err)
	}
	// Refusals change nothing.
	for _, tc := range []struct {
		name  string
		c     Caller
		sec   netconf.Secret
		value string
		want  error
	}{
		{"plain env name", alice, netconf.Secret{Name: "PLAIN", Hosts: []string{"a.example"}}, "v-1234", errdefs.ErrInvalid},
		{"no value", alice, netconf.Secret{Name: "X", Hosts: []string{"a.example"}}, "", errdefs.ErrInvalid},
		{"no host", alice, netconf.Secret{Name: "X"}, "v-1234", errdefs.ErrInvalid},
		{"host outside the vault's", alice, netconf.Secret{Name: "X", Vault: "GH", Hosts: []string{"evil.example"}}, "", errdefs.ErrInvalid},
		{"another tenant", bob, netconf.Secret{Name: "X", Hosts: []string{"a.example"}}, "v-1234", ErrNoSandbox},
	} {
		if _, err := r.m.SetSecret(ctx, tc.c, sb.ID, tc.sec, tc.value); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := r.m.RemoveSecret(ctx, alice, sb.ID, "NOPE"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("remove a secret it does not have: %v", err)
	}
	ch, err = r.m.RemoveSecret(ctx, alice, sb.ID, "OTHER")
	if err != nil || ch.Applied != "running" || len(ch.Network.Secrets) != 1 {
		t.Fatalf("remove: %+v %v", ch, err)
	}
	row, _ = r.Store.GetSandbox(ctx, sb.ID)
	if _, ok := row.Env["OTHER"]; ok || len(row.Network.Secrets) != 1 {
		t.Fatalf("after remove: env %v network %+v", row.Env, row.Network)
	}
	if vals, err := r.m.openSecrets(sb.ID); err != nil || len(vals) != 1 || vals["OTHER"] != "" {
		t.Fatalf("sealed after remove: %d values, %v", len(vals), err)
	}
	want := []string{"sandbox.secret.set GITHUB_TOKEN running", "sandbox.secret.set OTHER running", "sandbox.secret.set GITHUB_TOKEN running", "sandbox.secret.rm OTHER running"}
	if got := secretEvents(t, r.Store, sb.ID, vaultValue); !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	secretEvents(t, r.Store, sb.ID, given)
	catalogHasNoValue(t, r.m.L.Root, vaultValue)
	catalogHasNoValue(t, r.m.L.Root, given)
	if err := r.m.Remove(ctx, alice, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestLiveSecretsPaused: a paused sandbox's new secret is stored and
// sealed for its resume.
func TestLiveSecretsPaused(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	const id = "aaaaaaaaaaaa"
	if err := os.MkdirAll(m.L.Dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	ch, err := m.SetSecret(ctx, alice, id, netconf.Secret{Name: "TOKEN", Hosts: []string{"api.example.com"}}, "paused-value-77")
	if err != nil || ch.Applied != "resume" {
		t.Fatalf("set: %+v %v", ch, err)
	}
	vals, err := m.openSecrets(id)
	if err != nil || vals["TOKEN"] != "paused-value-77" {
		t.Fatalf("sealed: %v", err)
	}
	row, _ := m.Store.GetSandbox(ctx, id)
	if row.Env["TOKEN"] != ch.Network.Secrets[0].Placeholder {
		t.Fatalf("env %v", row.Env)
	}
	if row.Env["NODE_EXTRA_CA_CERTS"] == "" {
		t.Fatalf("env %v: no CA variables with a secret", row.Env)
	}
	if ch, err := m.RemoveSecret(ctx, alice, id, "TOKEN"); err != nil || ch.Applied != "resume" || len(ch.Network.Secrets) != 0 {
		t.Fatalf("remove: %+v %v", ch, err)
	}
	if row, _ := m.Store.GetSandbox(ctx, id); len(row.Env) != 0 {
		t.Fatalf("env after the last secret went: %v", row.Env)
	}
	if got := secretEvents(t, m.Store, id, "paused-value-77"); !slices.Equal(got, []string{"sandbox.secret.set TOKEN resume", "sandbox.secret.rm TOKEN resume"}) {
		t.Errorf("events %q", got)
	}
}
