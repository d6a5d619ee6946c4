package sandbox

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

func testManager(t *testing.T) *Manager {
	t.Helper()
	root := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(root, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &Manager{L: statedir.Layout{Root: root}, Store: st}
}

func addSandbox(t *testing.T, m *Manager, id string, state store.State) {
	t.Helper()
	now := time.Now()
	if err := m.Store.CreateSandbox(t.Context(), store.Sandbox{ID: id, State: state, Image: "base", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(m.L.Dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
}

// TestCollectTemplates: a template of an older kernel goes with the last
// sandbox whose disk it backs; a current one stays (it is a cache), and so
// does a live snapshot's template until PruneTemplates.
func TestCollectTemplates(t *testing.T) {
	m := testManager(t)
	ctx := t.Context()
	bc := statedir.BootConfig{Kernel: filepath.Join(m.L.Root, "vmlinux-new"), Initrd: filepath.Join(m.L.Root, "initrd-new")}
	for _, p := range []string{bc.Kernel, bc.Initrd} {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.L.SaveBootConfig(bc); err != nil {
		t.Fatal(err)
	}
	mkTemplate := func(id, kernel string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(m.L.Templates(), id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := template.MarkBuilt(filepath.Join(m.L.Templates(), id), template.Key{Kernel: kernel, Initrd: bc.Initrd}); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(id string) bool {
		_, err := os.Stat(filepath.Join(m.L.Templates(), id))
		return err == nil
	}
	mkTemplate("current", bc.Kernel)
	mkTemplate("old", "vmlinux-old")
	// A named snapshot taken before the upgrade, and its template.
	if err := m.Store.PutSnapshot(ctx, store.Snapshot{Name: "named", ID: "snap1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	mkTemplate(template.SnapshotID("snap1"), "vmlinux-old")
	addSandbox(t, m, "aaaaaaaaaaaa", store.StatePaused)
	addSandbox(t, m, "bbbbbbbbbbbb", store.StatePaused)
	for _, id := range []string{"aaaaaaaaaaaa", "bbbbbbbbbbbb"} {
		if err := m.Store.AddRefs(ctx, store.SandboxObj(id), store.RoleDisk, store.TemplateObj("old")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := m.PruneTemplates(ctx); err != nil || n != 1 || !exists("old") || exists(template.SnapshotID("snap1")) {
		t.Fatalf("prune with the old template held: %d, %v; old kept %v", n, err, exists("old"))
	}
	mkTemplate(template.SnapshotID("snap1"), "vmlinux-old")
	if err := m.Remove(ctx, Local(), "aaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	if !exists("old") {
		t.Fatal("old template freed while a sandbox's disk is backed by it")
	}
	if err := m.Remove(ctx, Local(), "bbbbbbbbbbbb"); err != nil {
		t.Fatal(err)
	}
	if exists("old") || !exists("current") || !exists(template.SnapshotID("snap1")) {
		t.Fatalf("after the last holder: old %v, current %v, snapshot's %v", exists("old"), exists("current"), exists(template.SnapshotID("snap1")))
	}
}

// TestReconcile: an alive sandbox is settled only when its shim lock is
// free, and only if the row is still as read.
func TestReconcile(t *testing.T) {
	m := testManager(t)
	ctx := t.Context()
	addSandbox(t, m, "aaaaaaaaaaaa", store.StateRunning)
	lock, err := m.takeShimLock("aaaaaaaaaaaa")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.takeShimLock("aaaaaaaaaaaa"); err == nil {
		t.Fatal("shim lock taken twice")
	}
	sb, err := m.Get(ctx, Local(), "aaaaaaaaaaaa")
	if err != nil || sb.State != store.StateRunning {
		t.Fatalf("with the lock held: %s, %v", sb.State, err)
	}
	lock.Close()
	if sb, _ = m.Get(ctx, Local(), "aaaaaaaaaaaa"); sb.State != store.StateFailed || sb.Reason == "" {
		t.Fatalf("with the lock free: %s %q", sb.State, sb.Reason)
	}
	if evs, err := m.Store.ListEvents(ctx, store.EventFilter{SandboxID: "aaaaaaaaaaaa", Type: "sandbox.fail"}); err != nil || len(evs) != 1 || evs[0].Detail["reaped"] != true {
		t.Fatalf("reaped sandbox.fail events: %+v %v", evs, err)
	}
	if sb, _ = m.Get(ctx, Local(), "aaaaaaaaaaaa"); sb.State != store.StateFailed {
		t.Fatal(sb.State)
	}
	if evs, _ := m.Store.ListEvents(ctx, store.EventFilter{SandboxID: "aaaaaaaaaaaa", Type: "sandbox.fail"}); len(evs) != 1 {
		t.Fatalf("a second read of a failed sandbox recorded %d sandbox.fail events, want 1", len(evs))
	}

	// Died resuming or pausing, saved state whole: paused (again); a
	// pause records the lifetime left. Without the saved state: failed.
	for id, st := range map[string]store.State{"bbbbbbbbbbbb": store.StateResuming, "cccccccccccc": store.StatePausing} {
		addSandbox(t, m, id, st)
		if err := os.MkdirAll(m.L.PauseDir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.L.PauseDir(id), statedir.PauseManifestFile), []byte("{}"), 0o400); err != nil {
			t.Fatal(err)
		}
		if sb, _ = m.Get(ctx, Local(), id); sb.State != store.StatePaused || (st == store.StatePausing && sb.LifetimeLeft < 50*time.Minute) {
			t.Fatalf("died %s: %s, %s left", st, sb.State, sb.LifetimeLeft)
		}
	}
	addSandbox(t, m, "dddddddddddd", store.StatePausing)
	if sb, _ = m.Get(ctx, Local(), "dddddddddddd"); sb.State != store.StateFailed {
		t.Fatalf("died pausing without a whole save: %s", sb.State)
	}

	// A stale read: the row moved on (resumed by a new generation) after
	// it was read; the verdict on the old row changes nothing.
	stale, err := m.Store.GetSandbox(ctx, "bbbbbbbbbbbb")
	if err != nil {
		t.Fatal(err)
	}
	stale.State = store.StatePausing
	lock, err = m.takeShimLock("bbbbbbbbbbbb")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Store.Transition(ctx, "bbbbbbbbbbbb", store.Change{To: store.StateResuming, From: store.StatePaused, Claim: true}); err != nil {
		t.Fatal(err)
	}
	lock.Close() // the owner of generation 2 is gone too, but the verdict on the stale read must not say so
	if got := m.Reconcile(ctx, stale); got.State != store.StateResuming || got.Gen != 2 {
		t.Fatalf("stale verdict: %s gen %d", got.State, got.Gen)
	}
	stale.State, stale.Gen = store.StateResuming, 1
	if got := m.Reconcile(ctx, stale); got.State != store.StateResuming || got.Gen != 2 {
		t.Fatalf("verdict on an older generation: %s gen %d", got.State, got.Gen)
	}
	// The current generation's owner gone: settled.
	if sb, _ = m.Get(ctx, Local(), "bbbbbbbbbbbb"); sb.State != store.StatePaused || sb.Gen != 2 {
		t.Fatalf("owner of generation 2 gone: %s gen %d", sb.State, sb.Gen)
	}
}

// TestFreezeRecordsReferences: a snapshot of a paused sandbox holds what
// the sandbox's disk was backed by and the sandbox holds the snapshot; a
// freeze whose row cannot be recorded puts the sandbox's disk back.
func TestFreezeRecordsReferences(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img (make deps)")
	}
	m := testManager(t)
	ctx := t.Context()
	const id = "aaaaaaaaaaaa"
	addSandbox(t, m, id, store.StatePaused)
	sb, err := m.Store.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Store.AddRefs(ctx, store.SandboxObj(id), store.RoleDisk, store.TemplateObj("t1")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(m.L.PauseDir(id), statedir.PauseStateDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.L.PauseDir(id), statedir.PauseStateDir, "state.bin"), []byte("state"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.L.PauseDir(id), statedir.PauseManifestFile), []byte(`{"version":1}`), 0o400); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", m.L.RootDisk(id), "16M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	sn, err := m.freeze(ctx, sb, "one")
	if err != nil {
		t.Fatal(err)
	}
	targets := func(o store.Obj) []store.Obj {
		ts, err := m.Store.Targets(ctx, o, "")
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	if got := targets(store.SnapshotObj(sn.ID)); len(got) != 1 || got[0] != store.TemplateObj("t1") {
		t.Fatalf("snapshot holds %v", got)
	}
	if got := targets(store.SandboxObj(id)); len(got) != 2 || got[0] != store.SnapshotObj(sn.ID) {
		t.Fatalf("sandbox holds %v", got)
	}
	if err := m.RemoveSnapshot(ctx, Local(), "", "one"); err == nil {
		t.Fatal("removed a snapshot the sandbox's disk is backed by")
	}
	// The same name again (a race past the check in snapshot): refused,
	// and the sandbox's disk is the one it had.
	if _, err := m.freeze(ctx, sb, "one"); err == nil {
		t.Fatal("second snapshot named one")
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", m.L.RootDisk(id)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Backing string `json:"backing-filename"`
	}
	_ = json.Unmarshal(out, &info)
	if info.Backing != filepath.Join(m.L.SnapshotDir(sn.ID), statedir.SnapshotDisk) {
		t.Fatalf("after the refused freeze the disk is backed by %q", info.Backing)
	}
	if got := targets(store.SandboxObj(id)); len(got) != 2 {
		t.Fatalf("after the refused freeze the sandbox holds %v", got)
	}
	snaps, _ := os.ReadDir(m.L.SnapshotsDir())
	if len(snaps) != 1 {
		t.Fatalf("snapshot dirs left: %d", len(snaps))
	}
}
