package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// warmIDs are the running sandboxes of pool name, waited for until there
// are want.
func (r *running) warmIDs(t *testing.T, name string, want int) []string {
	t.Helper()
	var ids []string
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		ids = ids[:0]
		sbs, err := r.Store.ListSandboxes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if sb.Tenant == WarmTenant && sb.Metadata[warmPoolKey] == name && sb.State == store.StateRunning {
				ids = append(ids, sb.ID)
			}
		}
		st, err := r.m.WarmPools(t.Context())
		return err == nil && len(ids) == want && st[name].Ready == want
	}) {
		t.Fatalf("pool %s: want %d ready sandboxes, has %v", name, want, ids)
	}
	return slices.Clone(ids)
}

// TestWarmPoolClaim: a pool fills to its size in the background; a
// create that fits takes one of its sandboxes, which is then the
// creator's, with the creator's environment, policy, lifetime and
// metadata, and audited as the creator's create from the pool; the pool
// refills; other tenants and creates that do not fit get no warm
// sandbox; a smaller pool and a deleted pool remove what they no longer
// need.
func TestWarmPoolClaim(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { r.m.RunWarm(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	for _, bad := range []struct {
		name string
		p    WarmPool
	}{{"Bad_Name", WarmPool{Size: 1}}, {"big", WarmPool{Size: MaxWarmPool + 1}}, {"cpus", WarmPool{CPUs: 1000, Size: 1}}} {
		if err := r.m.SetWarmPool(bad.name, bad.p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("pool %s %+v: %v, want invalid", bad.name, bad.p, err)
		}
	}
	if err := r.m.SetWarmPool("py", WarmPool{MemoryMiB: 256, Size: 2}); err != nil {
		t.Fatal(err)
	}
	warm := r.warmIDs(t, "py", 2)
	// The admin sees warm sandboxes; a tenant does not.
	if sbs, err := r.m.List(ctx, alice); err != nil || len(sbs) != 0 {
		t.Fatalf("alice lists %d sandboxes (%v), want none", len(sbs), err)
	}
	if _, err := r.m.Get(ctx, alice, warm[0]); !errors.Is(err, ErrNoSandbox) {
		t.Fatalf("alice gets a warm sandbox: %v", err)
	}

	// A sandbox whose warm kernel is starting is not counted ready, and a
	// create takes another first.
	w := r.m.warmState()
	setWarming := func(on bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if on {
			w.warming[warm[0]] = true
		} else {
			delete(w.warming, warm[0])
		}
	}
	setWarming(true)
	if st, err := r.m.WarmPools(ctx); err != nil || st["py"].Ready != 1 {
		t.Fatalf("with one sandbox warming: %+v %v, want 1 ready", st["py"], err)
	}
	sb, err := r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 256, Timeout: time.Hour, Env: map[string]string{"GREETING": "hello-warm"},
		Metadata: map[string]string{"job": "7"}, Network: netconf.Spec{Mode: "deny", Allow: []string{"pypi.org"}}})
	setWarming(false)
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != warm[1] {
		t.Fatalf("create got %s, not %s (the other of %v is warming)", sb.ID, warm[1], warm)
	}
	row, err := r.Store.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if row.Tenant != "alice" || row.Source != "warm:py" || row.Metadata["job"] != "7" || row.Metadata[warmPoolKey] != "" ||
		row.Network.Mode != "deny" || !slices.Equal(row.Network.Allow, []string{"pypi.org"}) || time.Until(row.ExpiresAt) < 59*time.Minute {
		t.Fatalf("claimed row %+v", row)
	}
	out, code, err := run(t, r.m, alice, sb.ID, "env")
	if err != nil || code != 0 || !strings.Contains(out, "GREETING=hello-warm") {
		t.Fatalf("env in the claimed sandbox: %q %d %v", out, code, err)
	}
	if got := r.actions(t, sb.ID); !slices.Contains(got, "sandbox.create alice api") {
		t.Fatalf("audit of the claimed sandbox %q", got)
	}

	// The pool refills to 2 without the claimed one.
	refilled := r.warmIDs(t, "py", 2)
	if slices.Contains(refilled, sb.ID) {
		t.Fatalf("the claimed sandbox is still in the pool: %v", refilled)
	}
	// A create with a secret takes one too: the secret's value is sealed
	// for a resume, the guest sees its placeholder.
	withSecret, err := r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 256, Network: netconf.Spec{Secrets: []netconf.Secret{{Name: "API_TOKEN", Hosts: []string{"api.example.com"}}}},
		Secrets: netconf.Values{"API_TOKEN": "the-real-value-77"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(refilled, withSecret.ID) || withSecret.Source != "warm:py" {
		t.Fatalf("a create with a secret got %s (%q), not one of %v", withSecret.ID, withSecret.Source, refilled)
	}
	if vals, err := r.m.openSecrets(withSecret.ID); err != nil || vals["API_TOKEN"] != "the-real-value-77" {
		t.Fatalf("the claimed sandbox's sealed secrets: %v", err)
	}
	out, _, err = run(t, r.m, alice, withSecret.ID, "env")
	if ph := withSecret.Network.Secrets[0].Placeholder; err != nil || !strings.Contains(out, "API_TOKEN="+ph) || strings.Contains(out, "the-real-value-77") {
		t.Fatalf("env with a secret: %q %v", out, err)
	}
	catalogHasNoValue(t, r.m.L.Root, "the-real-value-77")
	if err := r.m.Remove(ctx, alice, withSecret.ID); err != nil {
		t.Fatal(err)
	}
	refilled = r.warmIDs(t, "py", 2)

	// Creates that a warm sandbox cannot serve start their own.
	other, err := r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 384})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(refilled, other.ID) || other.Source != "" {
		t.Fatalf("a 384 MiB create took warm sandbox %s (%q)", other.ID, other.Source)
	}

	// Shrinking removes the extra one, deleting removes the rest.
	if err := r.m.SetWarmPool("py", WarmPool{MemoryMiB: 256, Size: 1}); err != nil {
		t.Fatal(err)
	}
	r.warmIDs(t, "py", 1)
	r.m.DeleteWarmPool("py")
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		sbs, err := r.Store.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return !slices.ContainsFunc(sbs, func(sb store.Sandbox) bool { return sb.Tenant == WarmTenant })
	}) {
		t.Fatal("the deleted pool's sandboxes are still there")
	}
	if err := r.m.Remove(ctx, alice, other.ID); err != nil {
		t.Fatal(err)
	}
	// The claimed sandbox's shim records what it does itself (here, the
	// end of its lifetime) as alice's, not the pool's.
	if err := r.m.SetTimeout(ctx, alice, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { return slices.Contains(r.actions(t, sb.ID), "sandbox.expire alice <nil>") }) {
		t.Fatalf("no sandbox.expire of alice: %q", r.actions(t, sb.ID))
	}
}
