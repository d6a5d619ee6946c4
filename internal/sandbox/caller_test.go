package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// These tests drive the manager's decisions (what a caller sees, quotas,
// the audit trail) on catalog rows, without booting: paused sandboxes,
// whose rows reconcile as they are and need no shim.

var (
	alice = Caller{Tenant: "alice", KeyID: "ka", Limits: Limits{MaxSandboxes: 3, MaxVCPUs: 4, MaxMemoryMiB: 2048}, Via: "api"}
	bob   = Caller{Tenant: "bob", KeyID: "kb", Via: "mcp"}
	admin = Caller{Tenant: "ops", KeyID: "kops", Admin: true, Via: "api"}
)

// newTestManager returns a manager on a fresh state dir with paused
// sandboxes aaaaaaaaaaaa (alice's, 1 vCPU, 512 MiB) and bbbbbbbbbbbb
// (bob's).
func newTestManager(t *testing.T) *Manager {
	t.Helper()
	root := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(root, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := &Manager{L: statedir.Layout{Root: root}, Store: st}
	addPaused(t, m, "aaaaaaaaaaaa", "alice")
	addPaused(t, m, "bbbbbbbbbbbb", "bob")
	return m
}

func addPaused(t *testing.T, m *Manager, id, tenant string) {
	t.Helper()
	now := time.Now()
	if err := m.Store.CreateSandbox(t.Context(), store.Sandbox{ID: id, Tenant: tenant, State: store.StatePaused, Image: "base",
		CPUs: 1, MemoryMiB: 512, DiskMiB: 2048, TimeoutSec: 600, CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		PausedAt: now, LifetimeLeft: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
}

func events(t *testing.T, m *Manager) []store.Event {
	t.Helper()
	evs, err := m.Store.ListEvents(t.Context(), store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestOtherTenantIsAbsent: another tenant's sandbox, a missing one and a
// malformed id give the same error, byte for byte, on every lifecycle
// method, and nothing happens to the sandbox or the audit trail.
func TestOtherTenantIsAbsent(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		call func(id string) error
	}{
		{"Get", func(id string) error { _, err := m.Get(ctx, alice, id); return err }},
		{"Remove", func(id string) error { return m.Remove(ctx, alice, id) }},
		{"SetTimeout", func(id string) error { return m.SetTimeout(ctx, alice, id, time.Minute) }},
		{"Pause", func(id string) error { _, err := m.Pause(ctx, alice, id, true); return err }},
		{"Resume", func(id string) error { _, err := m.Resume(ctx, alice, id); return err }},
		{"Touch", func(id string) error { return m.Touch(ctx, alice, id) }},
		{"Snapshot", func(id string) error { _, err := m.Snapshot(ctx, alice, id, "s", true); return err }},
		{"Fork", func(id string) error {
			_, err := m.Fork(ctx, alice, id, ForkOptions{Count: 1, Force: true})
			return err
		}},
		{"DialPort", func(id string) error { _, err := m.DialPort(ctx, alice, id, 80); return err }},
	} {
		other := tc.call("bbbbbbbbbbbb")
		absent := tc.call("cccccccccccc")
		malformed := tc.call("../etc")
		if !errors.Is(other, errdefs.ErrNotFound) || other.Error() != absent.Error() || other.Error() != malformed.Error() {
			t.Errorf("%s: other tenant %q, absent %q, malformed %q", tc.name, other, absent, malformed)
		}
	}
	sb, err := m.Store.GetSandbox(ctx, "bbbbbbbbbbbb")
	if err != nil || sb.State != store.StatePaused || sb.LifetimeLeft != 10*time.Minute {
		t.Fatalf("bob's sandbox after alice's attempts: %+v %v", sb, err)
	}
	if evs := events(t, m); len(evs) != 0 {
		t.Fatalf("refused calls were audited: %+v", evs)
	}
	// Its owner and an admin see it.
	for _, c := range []Caller{bob, admin, Local()} {
		if sb, err := m.Get(ctx, c, "bbbbbbbbbbbb"); err != nil || sb.Tenant != "bob" {
			t.Errorf("%+v: get: %+v %v", c, sb, err)
		}
	}
	// An admin gets the precise error for what does not exist.
	if _, err := m.Get(ctx, admin, "../etc"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("admin, malformed id: %v", err)
	}
}

// listIDs is the sorted ids of the sandboxes c sees.
func listIDs(t *testing.T, m *Manager, c Caller) []string {
	t.Helper()
	sbs, err := m.List(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID)
	}
	slices.Sort(out)
	return out
}

func TestListFiltersByTenant(t *testing.T) {
	m := newTestManager(t)
	ids := func(c Caller) []string { return listIDs(t, m, c) }
	for c, want := range map[*Caller][]string{
		&alice:            {"aaaaaaaaaaaa"},
		&bob:              {"bbbbbbbbbbbb"},
		&admin:            {"aaaaaaaaaaaa", "bbbbbbbbbbbb"},
		{Tenant: "carol"}: nil,
	} {
		if got := ids(*c); !slices.Equal(got, want) {
			t.Errorf("%s sees %v, want %v", c.Tenant, got, want)
		}
	}
	if got := ids(Local()); len(got) != 2 {
		t.Errorf("the local user sees %v", got)
	}
}

// TestAuditPerCaller: each lifecycle action is audited once, as its
// caller, with the surface it came through.
func TestAuditPerCaller(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	if err := m.SetTimeout(ctx, alice, "aaaaaaaaaaaa", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if sb, _ := m.Store.GetSandbox(ctx, "aaaaaaaaaaaa"); sb.LifetimeLeft != 2*time.Minute {
		t.Fatalf("timeout not set: %v", sb.LifetimeLeft)
	}
	// Pausing a paused sandbox does nothing, and is audited all the same.
	if res, err := m.Pause(ctx, Local(), "bbbbbbbbbbbb", false); err != nil || res.StateBytes != 0 {
		t.Fatalf("pause paused: %+v %v", res, err)
	}
	if err := m.Remove(ctx, admin, "bbbbbbbbbbbb"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Store.GetSandbox(ctx, "bbbbbbbbbbbb"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("removed sandbox still there: %v", err)
	}
	if _, err := m.PruneSnapshots(ctx, alice); !errors.Is(err, ErrNeedsAdmin) {
		t.Fatalf("tenant prune: %v", err)
	}
	if _, err := m.PruneSnapshots(ctx, admin); err != nil {
		t.Fatal(err)
	}
	type row struct{ tenant, key, id, action, via string }
	var got []row
	evs := events(t, m)
	for _, e := range evs {
		got = append(got, row{e.Tenant, e.KeyID, e.SandboxID, e.Action, fmt.Sprint(e.Detail["via"])})
	}
	want := []row{
		{"alice", "ka", "aaaaaaaaaaaa", "sandbox.timeout", "api"},
		{"", "", "bbbbbbbbbbbb", "sandbox.pause", "cli"},
		{"ops", "kops", "bbbbbbbbbbbb", "sandbox.delete", "api"},
		{"ops", "kops", "", "snapshot.prune", "api"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("audit:\n got %v\nwant %v", got, want)
	}
	if d := evs[0].Detail; d["timeout_s"] != float64(120) {
		t.Errorf("timeout detail: %v", d)
	}
	if d := evs[1].Detail; d["force"] != false || d["was"] != "paused" || d["state_bytes"] != float64(0) {
		t.Errorf("pause detail: %v", d)
	}
	if d := evs[3].Detail; d["freed_bytes"] != float64(0) {
		t.Errorf("prune detail: %v", d)
	}
}

// TestQuotaConcurrentCreates: creates in flight count against the quota,
// so concurrent reservations never exceed it; a release frees its share
// once.
func TestQuotaConcurrentCreates(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	// alice: 1 of 3 sandboxes used, so 2 of 16 concurrent creates fit.
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		releases []func()
		refused  []error
	)
	start := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			<-start
			rel, err := m.reserve(ctx, alice, alice.Tenant, 1, 1, 128, 1024)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
				return
			}
			releases = append(releases, rel)
		})
	}
	close(start)
	wg.Wait()
	if len(releases) != 2 || len(refused) != 14 {
		t.Fatalf("%d reserved, %d refused; want 2 and 14", len(releases), len(refused))
	}
	for _, err := range refused {
		q, ok := errors.AsType[*QuotaError](err)
		if !ok || !errors.Is(err, errdefs.ErrResourceExhausted) || q.Detail() != "max_sandboxes: the tenant uses 3 of 3; this sandbox needs 1 more" {
			t.Fatalf("refusal: %v", err)
		}
	}
	// Another tenant's quota is its own.
	if rel, err := m.reserve(ctx, bob, bob.Tenant, 1, 1, 128, 1024); err != nil {
		t.Fatalf("bob: %v", err)
	} else {
		rel()
	}
	releases[0]()
	releases[0]() // a second release frees nothing more
	rel, err := m.reserve(ctx, alice, alice.Tenant, 1, 1, 128, 1024)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := m.reserve(ctx, alice, alice.Tenant, 1, 1, 128, 1024); err == nil {
		t.Fatal("a double release freed two places")
	}
	rel()
	releases[1]()
	if len(m.quota.pending) != 0 {
		t.Fatalf("pending after every release: %v", m.quota.pending)
	}
}

func TestQuotaMessages(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	for _, tc := range []struct {
		n, cpus, mem int
		want         string
	}{
		{1, 4, 128, "max_vcpus: the tenant uses 1 of 4; this sandbox needs 4 more"},
		{1, 1, 2048, "max_memory_mb: the tenant uses 512 MiB of 2048 MiB; this sandbox needs 2048 MiB more"},
		// A fork of 3 into 2 free places: all or none, naming the third.
		{3, 1, 128, "max_sandboxes: the tenant uses 3 of 3; this sandbox needs 1 more"},
	} {
		_, err := m.reserve(ctx, alice, alice.Tenant, tc.n, tc.cpus, tc.mem, 1024)
		if q, ok := errors.AsType[*QuotaError](err); !ok || q.Detail() != tc.want || err.Error() != "resource exhausted: "+tc.want {
			t.Errorf("%+v: %v", tc, err)
		}
	}
	if len(m.quota.pending) != 0 {
		t.Fatalf("a refused reservation holds resources: %v", m.quota.pending)
	}
	// The local user has no quota; zero limits are the defaults.
	if rel, err := m.reserve(ctx, Local(), "", 100, 32, 64<<10, 1024); err != nil {
		t.Fatalf("local: %v", err)
	} else {
		rel()
	}
	if _, err := m.reserve(ctx, Caller{Tenant: "carol"}, "carol", DefaultLimits.MaxSandboxes+1, 1, 128, 1024); err == nil {
		t.Fatal("zero limits are unlimited")
	}
}

// TestCreateChecksQuotaFirst: an over-quota create, create from snapshot
// or fork is refused before anything is made or audited.
func TestCreateChecksQuotaFirst(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	full := alice
	full.Limits.MaxSandboxes = 1
	if _, err := m.Create(ctx, full, CreateOptions{}); !errors.As(err, new(*QuotaError)) {
		t.Fatalf("create: %v", err)
	}
	if err := m.Store.PutSnapshot(ctx, store.Snapshot{Tenant: "alice", Name: "snap", ID: "s1", CPUs: 1, MemoryMiB: 512, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateFromSnapshot(ctx, full, "snap", CreateOptions{}); !errors.As(err, new(*QuotaError)) {
		t.Fatalf("create from snapshot: %v", err)
	}
	// Bob has no snapshot of that name: another tenant's is not found.
	if _, err := m.CreateFromSnapshot(ctx, bob, "snap", CreateOptions{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob from alice's snapshot: %v", err)
	}
	// An admin's fork of alice's sandbox counts against alice's sandboxes.
	tight := admin
	tight.Limits = Limits{MaxSandboxes: 1}
	if _, err := m.Fork(ctx, tight, "aaaaaaaaaaaa", ForkOptions{Count: 1}); !errors.As(err, new(*QuotaError)) {
		t.Fatalf("fork: %v", err)
	}
	sbs, _ := m.List(ctx, admin)
	if len(sbs) != 2 || len(events(t, m)) != 0 {
		t.Fatalf("refused creates left %d sandboxes, %d events", len(sbs), len(events(t, m)))
	}
}

// TestSnapshotScope: a tenant lists, reads and removes its own snapshots
// only; fork bases are hidden unless an admin asks for all.
func TestSnapshotScope(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	for _, sn := range []store.Snapshot{
		{Tenant: "alice", Name: "a1", ID: "s1"},
		{Tenant: "alice", Name: template.ForkPrefix + "x", ID: "s2"},
		{Tenant: "bob", Name: "b1", ID: "s3"},
	} {
		sn.Created = time.Now()
		if err := m.Store.PutSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	names := func(c Caller, tenant string, all bool) []string {
		sns, err := m.ListSnapshots(ctx, c, tenant, all)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sn := range sns {
			out = append(out, sn.Tenant+"/"+sn.Name)
		}
		slices.Sort(out)
		return out
	}
	if got := names(alice, "bob", true); !slices.Equal(got, []string{"alice/a1"}) {
		t.Errorf("alice asking for bob's, all: %v", got)
	}
	if got := names(admin, "bob", false); !slices.Equal(got, []string{"bob/b1"}) {
		t.Errorf("admin asking for bob's: %v", got)
	}
	if got := names(admin, "", true); len(got) != 3 {
		t.Errorf("admin, all: %v", got)
	}
	if _, err := m.GetSnapshot(ctx, alice, "bob", "b1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("alice reads bob's snapshot: %v", err)
	}
	if err := m.RemoveSnapshot(ctx, alice, "bob", "b1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("alice removes bob's snapshot: %v", err)
	}
	if err := m.RemoveSnapshot(ctx, bob, "", "b1"); err != nil {
		t.Fatal(err)
	}
	evs := events(t, m)
	if len(evs) != 1 || evs[0].Action != "snapshot.delete" || evs[0].Tenant != "bob" || evs[0].Detail["name"] != "b1" || evs[0].Detail["via"] != "mcp" {
		t.Fatalf("audit: %+v", evs)
	}
}

func TestKeyCaller(t *testing.T) {
	k := store.APIKey{ID: "k1", Tenant: "t", MaxVCPUs: 8}
	c := KeyCaller(k, Limits{MaxSandboxes: 5}, "api")
	want := Caller{Tenant: "t", KeyID: "k1", Via: "api",
		Limits: Limits{MaxSandboxes: 5, MaxVCPUs: 8, MaxMemoryMiB: DefaultLimits.MaxMemoryMiB, MaxDiskMiB: DefaultLimits.MaxDiskMiB, MaxSnapshots: DefaultLimits.MaxSnapshots, MaxVolumes: DefaultLimits.MaxVolumes, RatePerMin: DefaultLimits.RatePerMin}}
	if c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	// Network limits: the key's, else the server's; negative (no limit)
	// counts as set.
	k.NetConnRate, k.NetDestsPerMin = 9, -1
	c = KeyCaller(k, Limits{NetDestsPerMin: 300, NetUDPRate: 40}, "api")
	if l := c.Limits; l.NetConnRate != 9 || l.NetDestsPerMin != -1 || l.NetUDPRate != 40 {
		t.Fatalf("network limits %+v", l)
	}
}
