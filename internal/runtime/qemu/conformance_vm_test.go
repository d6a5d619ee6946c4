package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
)

// TestVMConformance runs the runtime conformance suite against real QEMU
// guests (vm tier).
func TestVMConformance(t *testing.T) {
	f := newVMFixture(t)
	dir := world(t)
	base := baseDisk(t, dir)
	var n atomic.Int64
	spec := func(t *testing.T) runtime.Spec {
		i := n.Add(1)
		disk := filepath.Join(dir, fmt.Sprintf("root-%d.qcow2", i))
		overlay(t, disk, base, "raw")
		s := f.spec(t, disk)
		s.ID = fmt.Sprintf("conf-%d", i)
		return s
	}
	runtimetest.Run(t, runtimetest.Harness{
		Runtime: f.rt,
		Spec:    spec,
		CloneSpec: func(t *testing.T, tmpl runtime.Spec, snap string) runtime.Spec {
			// Clones' QEMUs open the template's overlay by path, as
			// their own uids: it must be world-readable from now on.
			if err := os.Chmod(tmpl.RootDisk, 0o444); err != nil {
				t.Fatal(err)
			}
			s := spec(t)
			os.Remove(s.RootDisk)
			overlay(t, s.RootDisk, tmpl.RootDisk, "qcow2")
			s.RestoreFrom = snap
			return s
		},
		BrokenSpec: func(t *testing.T) runtime.Spec {
			s := spec(t)
			s.Kernel = filepath.Join(dir, "no-such-kernel")
			return s
		},
		InUse:       func(t *testing.T) int { return uidsInUse(t, f.rt.cfg.StateDir) },
		BootTimeout: 10 * time.Second * f.scale,
	})
}

// uidsInUse counts the VMM uids whose lock is held.
func uidsInUse(t *testing.T, stateDir string) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(stateDir, "run", "uids"))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		fh, err := os.Open(filepath.Join(stateDir, "run", "uids", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			n++
		}
		fh.Close()
	}
	return n
}
