package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// TestSnapshotRefsGuardRemoval: a snapshot backing a sandbox's or another
// snapshot's disk cannot be removed; prune frees unused fork bases and
// orphaned files only.
func TestSnapshotRefsGuardRemoval(t *testing.T) {
	root := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(root, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := &Manager{L: statedir.Layout{Root: root}, Store: st}
	mk := func(name, id string) {
		t.Helper()
		if err := os.MkdirAll(m.L.SnapshotDir(id), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.L.SnapshotDir(id), statedir.SnapshotDisk), make([]byte, 8192), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := st.PutSnapshot(t.Context(), store.Snapshot{Name: name, ID: id, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	mk("base", "s1")
	mk("child", "s2")
	mk(template.ForkPrefix+"x", "s3")
	// s2 was taken of a sandbox started from s1; sandbox a runs from s2.
	if err := st.AddRefs(t.Context(), store.SnapshotObj("s2"), store.RoleDisk, store.SnapshotObj("s1")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(m.L.Dir("aaaaaaaaaaaa"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := st.AddRefs(t.Context(), store.SandboxObj("aaaaaaaaaaaa"), store.RoleDisk, store.SnapshotObj("s1"), store.SnapshotObj("s2")); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(t.Context(), store.Snapshot{Name: "base", ID: "s9"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	for _, name := range []string{"base", "child"} {
		if err := m.RemoveSnapshot(t.Context(), Local(), "", name); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("rm %s while in use: %v", name, err)
		}
	}
	// An orphan directory (no row, nobody refers to it), old enough.
	orphan := m.L.SnapshotDir("s4")
	if err := os.MkdirAll(orphan, 0o711); err != nil {
		t.Fatal(err)
	}
	// The gVisor agent copies the kept s2 and the orphan s4 name: the
	// first stays, the second goes with s4.
	agent := map[string]string{"s2": strings.Repeat("2", 64), "s4": strings.Repeat("4", 64)}
	for id, sum := range agent {
		if err := os.MkdirAll(filepath.Join(m.L.SnapshotDir(id), statedir.PauseStateDir), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.L.SnapshotDir(id), statedir.PauseStateDir, gvisor.AgentStateFile), []byte(sum+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(m.L.Agents(), 0o700); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(m.L.Agents(), "sha256-"+sum)
		if err := os.WriteFile(p, []byte("agent"), 0o555); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-2 * time.Hour)
		_ = os.Chtimes(p, old, old)
	}
	old := time.Now().Add(-time.Hour)
	_ = os.Chtimes(orphan, old, old)
	if _, err := m.PruneSnapshots(t.Context(), Local()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"s1": true, "s2": true, "s3": false, "s4": false} {
		if _, err := os.Stat(m.L.SnapshotDir(id)); (err == nil) != want {
			t.Errorf("after prune, %s exists = %v, want %v", id, err == nil, want)
		}
		if sum := agent[id]; sum != "" {
			if _, err := os.Stat(filepath.Join(m.L.Agents(), "sha256-"+sum)); (err == nil) != want {
				t.Errorf("after prune, %s's agent copy exists = %v, want %v", id, err == nil, want)
			}
		}
	}
	// Once the sandbox is gone, child then base can go.
	if err := st.DeleteSandbox(t.Context(), "aaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveSnapshot(t.Context(), Local(), "", "base"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("rm base while child refers to it: %v", err)
	}
	for _, name := range []string{"child", "base"} {
		if err := m.RemoveSnapshot(t.Context(), Local(), "", name); err != nil {
			t.Errorf("rm %s: %v", name, err)
		}
	}
	if err := ValidateSnapshotName(template.ForkPrefix + "x"); err == nil {
		t.Error("a fork-base name is accepted from users")
	}
}

// TestRemoveFreesForkBase: the unlisted snapshot forks start from goes
// with the last sandbox whose disk it backs.
func TestRemoveFreesForkBase(t *testing.T) {
	root := t.TempDir()
	st, err := store.Open(t.Context(), filepath.Join(root, "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := &Manager{L: statedir.Layout{Root: root}, Store: st}
	if err := os.MkdirAll(m.L.SnapshotDir("base1"), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(t.Context(), store.Snapshot{Name: template.ForkPrefix + "a", ID: "base1", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"aaaaaaaaaaaa", "bbbbbbbbbbbb"} {
		if err := st.CreateSandbox(t.Context(), store.Sandbox{ID: id, State: store.StatePaused, Image: "base", CreatedAt: time.Now(), ExpiresAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(m.L.Dir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := st.AddRefs(t.Context(), store.SandboxObj(id), store.RoleDisk, store.SnapshotObj("base1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Remove(t.Context(), Local(), "aaaaaaaaaaaa"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.L.SnapshotDir("base1")); err != nil {
		t.Fatal("fork base removed while a sandbox still uses it")
	}
	if err := m.Remove(t.Context(), Local(), "bbbbbbbbbbbb"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.L.SnapshotDir("base1")); err == nil {
		t.Fatal("fork base kept after its last sandbox")
	}
}
