package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/shim/shimtest"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// These tests drive the manager over running sandboxes: each one's shim
// runs in-process on the fake runtime (shimtest), and the manager talks to
// it over its socket as it does in production. A shim does not import this
// package, so its tests here can start real ones.

// running is a manager over a shimtest state dir.
type running struct {
	*shimtest.Env
	m *Manager
}

func newRunning(t *testing.T) *running {
	t.Helper()
	e := shimtest.New(t)
	// No free-space reserve: the refusals tested here are the quotas', not
	// the test machine's disk.
	return &running{Env: e, m: &Manager{L: e.L, Store: e.Store, DiskReserve: -1}}
}

// startInProcess makes r's manager start every shim in this process on the
// fake runtime (Manager.StartShim), from the document it would give `airlock
// shim`.
func (r *running) startInProcess(t *testing.T) {
	t.Helper()
	r.m.StartShim = r.Starter(t, func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error {
		return shim.Run(context.Background(), shim.Config{
			StateDir: doc.StateDir, ID: doc.ID, Ready: ready, Lock: lock, Runtime: r.Runtime, Secrets: doc.Secrets,
			DNS: doc.DNS, TestDialMap: doc.TestDialMap, DiskReserve: doc.DiskReserve,
		})
	})
}

// start starts a running sandbox of tenant, as a create leaves it (the
// catalog row in the shim's hands, the guest answering), with its row and
// the shim's configuration changed by opts. The shim is shut down at the
// end of the test if it still runs.
func (r *running) start(t *testing.T, tenant string, opts ...func(*store.Sandbox, *shim.Config)) string {
	t.Helper()
	id := statedir.NewID()
	sb := r.Row(id, time.Hour)
	sb.Tenant = tenant
	cfg := shim.Config{StateDir: r.L.Root, ID: id, Runtime: r.Runtime}
	for _, o := range opts {
		o(&sb, &cfg)
	}
	s := r.Start(t, sb, func(ready io.WriteCloser) error {
		cfg.Ready = ready
		return shim.Run(context.Background(), cfg)
	})
	t.Cleanup(func() {
		if r.m.shimAlive(id) {
			c := shimclient.New(r.L.Socket(id))
			defer c.Close()
			if err := c.Shutdown(context.Background()); err != nil {
				t.Errorf("shut down %s: %v", id, err)
			}
		}
		s.Wait(t)
	})
	return id
}

// sandboxDirs lists the state dir's sandbox directories.
func (r *running) sandboxDirs(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(r.L.Sandboxes())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// actions returns the audit trail of sandbox id (every sandbox if ""), as
// "action tenant via" lines.
func (r *running) actions(t *testing.T, id string) []string {
	t.Helper()
	evs, err := r.Store.ListEvents(t.Context(), store.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%s %s %v", e.Action, e.Tenant, e.Detail["via"]))
	}
	return out
}

func run(t *testing.T, m *Manager, c Caller, id string, argv ...string) (string, int, error) {
	t.Helper()
	st, err := m.Exec(t.Context(), c, id, guest.ExecSpec{Argv: argv}, false)
	if err != nil {
		return "", 0, err
	}
	defer st.Close()
	var out bytes.Buffer
	ex, err := guest.Drain(st, &out, io.Discard)
	if err != nil {
		return out.String(), 0, err
	}
	return out.String(), ex.Code, nil
}

// TestManagerRunningTenancy: on running sandboxes, a caller sees, runs
// commands in and removes its own tenant's only; another tenant's sandbox
// is not found exactly like a missing one, and nothing happens to it; an
// admin sees and removes any. A remove ends the shim and leaves no row and
// no directory, and is audited once, as its caller, with its surface.
func TestManagerRunningTenancy(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	a := r.start(t, "alice")
	b := r.start(t, "bob")
	missing := statedir.NewID()

	for _, tc := range []struct {
		name string
		call func(id string) error
	}{
		{"Get", func(id string) error { _, err := r.m.Get(ctx, alice, id); return err }},
		{"Exec", func(id string) error { _, _, err := run(t, r.m, alice, id, "true"); return err }},
		{"Stats", func(id string) error { _, err := r.m.Stats(ctx, alice, id); return err }},
		{"ListExecs", func(id string) error { _, err := r.m.ListExecs(ctx, alice, id); return err }},
		{"Pause", func(id string) error { _, err := r.m.Pause(ctx, alice, id, true); return err }},
		{"Remove", func(id string) error { return r.m.Remove(ctx, alice, id) }},
	} {
		other, absent := tc.call(b), tc.call(missing)
		if !errors.Is(other, errdefs.ErrNotFound) || other.Error() != absent.Error() {
			t.Errorf("%s: another tenant's sandbox %q, a missing one %q", tc.name, other, absent)
		}
	}
	if sb, err := r.m.Get(ctx, bob, b); err != nil || sb.State != store.StateRunning || sb.Tenant != "bob" {
		t.Fatalf("bob's sandbox after alice's attempts: %+v %v", sb, err)
	}
	if got := r.actions(t, ""); len(got) != 0 {
		t.Fatalf("refused calls left an audit trail: %q", got)
	}

	ids := func(c Caller) []string { return listIDs(t, r.m, c) }
	both := []string{a, b}
	slices.Sort(both)
	for c, want := range map[*Caller][]string{&alice: {a}, &bob: {b}, &admin: both, {Tenant: "carol"}: nil} {
		if got := ids(*c); !slices.Equal(got, want) {
			t.Errorf("%q lists %v, want %v", c.Tenant, got, want)
		}
	}

	// Its owner and an admin remove it.
	if err := r.m.Remove(ctx, bob, b); err != nil {
		t.Fatalf("bob removes his sandbox: %v", err)
	}
	if err := r.m.Remove(ctx, admin, a); err != nil {
		t.Fatalf("an admin removes alice's sandbox: %v", err)
	}
	for _, id := range []string{a, b} {
		if _, err := r.Store.GetSandbox(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: row after remove: %v", id, err)
		}
		if r.m.shimAlive(id) {
			t.Errorf("%s: shim alive after remove", id)
		}
	}
	if dirs := r.sandboxDirs(t); len(dirs) != 0 {
		t.Errorf("directories left after remove: %v", dirs)
	}
	if got, want := r.actions(t, a), []string{"sandbox.delete ops api"}; !slices.Equal(got, want) {
		t.Errorf("alice's sandbox's audit trail %q, want %q", got, want)
	}
	if got, want := r.actions(t, b), []string{"sandbox.delete bob mcp"}; !slices.Equal(got, want) {
		t.Errorf("bob's sandbox's audit trail %q, want %q", got, want)
	}
	if ids(admin) != nil {
		t.Errorf("an admin still lists %v", ids(admin))
	}
}

// TestManagerExec: a command runs through the manager's one exec path with
// its output and exit code; the shim records its start and exit once each,
// as the caller's tenant and key.
func TestManagerExec(t *testing.T) {
	r := newRunning(t)
	id := r.start(t, "alice")
	out, code, err := run(t, r.m, alice, id, "echo", "hello")
	if err != nil || code != 0 || out != "hello\n" {
		t.Fatalf("echo hello: %q, exit %d, %v", out, code, err)
	}
	if _, code, err = run(t, r.m, alice, id, "exit", "7"); err != nil || code != 7 {
		t.Fatalf("exit 7: exit %d, %v", code, err)
	}
	// A bad spec is refused before the sandbox is asked.
	if _, _, err := run(t, r.m, alice, id); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("an empty argv: %v", err)
	}
	evs, err := r.Store.ListEvents(t.Context(), store.EventFilter{SandboxID: id, Type: "exec"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Action+" "+e.Tenant+" "+e.KeyID)
	}
	want := []string{"exec.start alice ka", "exec.exit alice ka", "exec.start alice ka", "exec.exit alice ka"}
	if !slices.Equal(got, want) {
		t.Fatalf("exec events %q, want %q", got, want)
	}
	infos, err := r.m.ListExecs(t.Context(), alice, id)
	if err != nil || len(infos) != 2 {
		t.Fatalf("execs: %+v %v", infos, err)
	}
}

// TestManagerAuditsOnceWithVia: what the manager does for a caller is
// audited once per action, as the caller, with the surface it came
// through.
func TestManagerAuditsOnceWithVia(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	id := r.start(t, "alice")
	viaMCP := alice
	viaMCP.Via = "mcp"
	if err := r.m.SetTimeout(ctx, alice, id, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.WriteFile(ctx, viaMCP, id, "/tmp/f", 0o644, strings.NewReader("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.CreateContext(ctx, alice, id, guest.ContextSpec{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	// Reads are not audited.
	if _, err := r.m.Get(ctx, alice, id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.Stats(ctx, alice, id); err != nil {
		t.Fatal(err)
	}
	got := r.actions(t, id)
	want := []string{"sandbox.timeout alice api", "file.write alice mcp", "context.create alice api"}
	if !slices.Equal(got, want) {
		t.Fatalf("audit trail %q, want %q", got, want)
	}
}

// TestManagerSecretsAcrossPause: a sandbox with secrets pauses, and its
// resume binds the values again from their sealed copy; without that copy
// the resume is refused with a reason (never the value), and the sandbox
// stays paused.
func TestManagerSecretsAcrossPause(t *testing.T) {
	r := newRunning(t)
	vals := netconf.Values{"API_TOKEN": "s3cret-value"}
	id := r.start(t, "alice", func(sb *store.Sandbox, c *shim.Config) {
		c.Secrets = vals
		n, err := netconf.Spec{Secrets: []netconf.Secret{{Name: "API_TOKEN", Hosts: []string{"api.test"}}}}.Normalize(c.Secrets)
		if err != nil {
			t.Fatal(err)
		}
		sb.Network = n
	})
	if err := r.m.sealSecrets(id, vals); err != nil { // as create does
		t.Fatal(err)
	}
	// Shims the manager starts (the resume's) run here; the values they
	// were given are recorded.
	var mu sync.Mutex
	var given netconf.Values
	r.m.StartShim = r.Starter(t, func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error {
		mu.Lock()
		given = doc.Secrets
		mu.Unlock()
		return shim.Run(context.Background(), shim.Config{StateDir: doc.StateDir, ID: doc.ID, Ready: ready, Lock: lock, Runtime: r.Runtime, Secrets: doc.Secrets})
	})
	if _, err := r.m.Pause(t.Context(), alice, id, false); err != nil {
		t.Fatalf("pause of a sandbox with secrets: %v", err)
	}
	if sb, err := r.m.Resume(t.Context(), alice, id); err != nil || sb.State != store.StateRunning {
		t.Fatalf("resume of a sandbox with secrets: %+v %v", sb, err)
	}
	if _, code, err := run(t, r.m, alice, id, "true"); err != nil || code != 0 {
		t.Fatalf("exec after the resume: exit %d, %v", code, err)
	}
	mu.Lock()
	got := given
	mu.Unlock()
	if len(got) != 1 || got["API_TOKEN"] != "s3cret-value" {
		t.Fatalf("the resumed shim was given %v; want the sealed values", got)
	}

	if _, err := r.m.Pause(t.Context(), alice, id, false); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(r.m.L.Dir(id), sealedSecretsFile)); err != nil {
		t.Fatal(err)
	}
	_, err := r.m.Resume(t.Context(), alice, id)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "sealed secret values") || strings.Contains(err.Error(), "s3cret-value") {
		t.Fatalf("resume without the sealed values: %v", err)
	}
	if sb, err := r.m.Get(t.Context(), alice, id); err != nil || sb.State != store.StatePaused || !strings.Contains(sb.Reason, "sealed secret values") {
		t.Fatalf("after the refused resume: %+v %v", sb, err)
	}
}

// TestManagerCreateRefusedLeavesNothing: a create over any of the tenant's
// quotas is a *QuotaError naming it, and one whose shim never comes up
// fails; neither leaves a catalog row, a sandbox directory or an audit
// event behind, and neither holds quota afterwards.
func TestManagerCreateRefusedLeavesNothing(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	existing := r.start(t, "alice") // 1 vCPU, 256 MiB
	tight := Caller{Tenant: "alice", KeyID: "ka", Via: "api", Limits: Limits{MaxSandboxes: 2, MaxVCPUs: 2, MaxMemoryMiB: 1024}}
	full := tight
	full.Limits.MaxSandboxes = 1
	for _, tc := range []struct {
		name  string
		c     Caller
		o     CreateOptions
		quota string
	}{
		{"sandboxes", full, CreateOptions{}, "max_sandboxes"},
		{"vcpus", tight, CreateOptions{CPUs: 2}, "max_vcpus"},
		{"memory", tight, CreateOptions{MemoryMiB: 1024}, "max_memory_mb"},
	} {
		_, err := r.m.Create(ctx, tc.c, tc.o)
		q, ok := errors.AsType[*QuotaError](err)
		if !ok || q.Quota != tc.quota || !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Errorf("%s: %v, want a %s quota error", tc.name, err, tc.quota)
		}
	}
	// Within quota, but the shim cannot start: the row and directory made
	// for it are removed again.
	r.m.Exe = "/nonexistent/airlock"
	if _, err := r.m.Create(ctx, tight, CreateOptions{}); err == nil || errors.As(err, new(*QuotaError)) {
		t.Fatalf("a create whose shim cannot start: %v", err)
	}
	sbs, err := r.m.List(ctx, admin)
	if err != nil || len(sbs) != 1 || sbs[0].ID != existing {
		t.Fatalf("after the refused creates: %+v %v", sbs, err)
	}
	if dirs := r.sandboxDirs(t); !slices.Equal(dirs, []string{existing}) {
		t.Fatalf("sandbox directories after the refused creates: %v", dirs)
	}
	if got := r.actions(t, ""); len(got) != 0 {
		t.Fatalf("refused creates were audited: %q", got)
	}
	if len(r.m.quota.pending) != 0 {
		t.Fatalf("refused creates hold quota: %v", r.m.quota.pending)
	}
}

// TestManagerCreateExecRemove: a create through the manager's one path
// (row, shim lock, shim started with its document, readiness) gives a
// running sandbox whose shim holds the lock; a command runs in it; a
// remove ends the shim and frees everything: no row, no directory, no
// guest, no quota held; create and delete are audited once each.
func TestManagerCreateExecRemove(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx := t.Context()
	sb, err := r.m.Create(ctx, alice, CreateOptions{MemoryMiB: 256, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.State != store.StateRunning || sb.Tenant != "alice" || sb.MemoryMiB != 256 || sb.Metadata["k"] != "v" {
		t.Fatalf("created %+v", sb)
	}
	if !r.m.shimAlive(sb.ID) {
		t.Fatal("no shim holds the lock of the created sandbox")
	}
	if _, err := r.m.takeShimLock(sb.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the shim lock of a running sandbox was free: %v", err)
	}
	if r.Runtime.Live() != 1 {
		t.Fatalf("%d guests, want 1", r.Runtime.Live())
	}
	if out, code, err := run(t, r.m, alice, sb.ID, "echo", "hello"); err != nil || code != 0 || out != "hello\n" {
		t.Fatalf("echo hello: %q, exit %d, %v", out, code, err)
	}
	if err := r.m.Remove(ctx, alice, sb.ID); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := r.Store.GetSandbox(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("row after remove: %v", err)
	}
	if r.m.shimAlive(sb.ID) {
		t.Error("shim alive after remove")
	}
	if dirs := r.sandboxDirs(t); len(dirs) != 0 {
		t.Errorf("directories left after remove: %v", dirs)
	}
	if n := r.Runtime.Live(); n != 0 {
		t.Errorf("%d guests left after remove", n)
	}
	if len(r.m.quota.pending) != 0 {
		t.Errorf("quota held after remove: %v", r.m.quota.pending)
	}
	evs, err := r.Store.ListEvents(ctx, store.EventFilter{SandboxID: sb.ID, Type: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Action+" "+e.Tenant)
	}
	if want := []string{"sandbox.create alice", "sandbox.delete alice"}; !slices.Equal(got, want) {
		t.Errorf("audit trail %q, want %q", got, want)
	}
}

// TestManagerCreateNetworkLimits: a sandbox gets its tenant's outbound
// abuse limits (an admin's setting), whatever its creator asks for; zero
// limits are netconf's defaults.
func TestManagerCreateNetworkLimits(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx := t.Context()
	c := alice
	c.Limits.NetConnRate, c.Limits.NetDestsPerMin = 7, -1
	sb, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Network: netconf.Spec{ConnRate: 50000, UDPRate: 60000}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	stored, err := r.Store.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n := stored.Network; n.ConnRate != 7 || n.DestsPerMin != -1 || n.UDPRate != netconf.DefaultUDPRate {
		t.Fatalf("network limits %d %d %d, want 7, -1 (none) and the default %d", n.ConnRate, n.DestsPerMin, n.UDPRate, netconf.DefaultUDPRate)
	}
	if err := r.m.Remove(ctx, c, sb.ID); err != nil {
		t.Fatal(err)
	}
}
