package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestVMSaveState covers StateSaver on one cold-booted 512 MiB guest: a live
// snapshot (the guest keeps running on a new overlay, the old disk stays
// frozen), a pause and its resume, a restore of the live snapshot into a
// Snapshottable instance that then becomes a template, and a clone of it.
func TestVMSaveState(t *testing.T) {
	f := newVMFixture(t)
	dir := world(t)
	disk0 := filepath.Join(dir, "disk0.qcow2")
	overlay(t, disk0, baseDisk(t, dir), "raw")
	spec := f.spec(t, disk0)
	spec.MemoryMiB = 512
	logConsoleOnFailure(t, spec.RunDir)
	in, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = in.Kill() }()
	ac := f.dialAgent(t, in)
	ramMarker, diskMarker := []byte("in guest RAM only\n"), []byte("on the root disk\n")
	vmWriteFile(t, ac, "/dev/shm/ram-marker", ramMarker)
	vmWriteFile(t, ac, "/disk-marker", diskMarker)
	ac.Close()
	saver := in.(runtime.StateSaver)

	// Live snapshot.
	live := mkdir(t, dir, "live")
	disk1 := filepath.Join(dir, "disk1.qcow2")
	overlay(t, disk1, disk0, "qcow2")
	t0 := time.Now()
	if err := saver.SaveState(t.Context(), live, runtime.SaveOptions{KeepRunning: true, NewRootDisk: disk1}); err != nil {
		t.Fatal(err)
	}
	t.Logf("live SaveState: %v (incl. %v settle)", time.Since(t0), snapshotSettle)
	logSnapshotFiles(t, live)
	sum0 := fileSum(t, disk0)
	if err := os.Chmod(disk0, 0o444); err != nil {
		t.Fatal(err)
	}

	// The guest runs on, writing to disk1 only.
	ac = f.dialAgent(t, in)
	if got := runtimetest.ReadFile(t, ac, "/dev/shm/ram-marker"); !bytes.Equal(got, ramMarker) {
		t.Fatalf("after live snapshot: ram marker %q", got)
	}
	up1 := ac.Info.GetUptimeSeconds()
	vmWriteFile(t, ac, "/after-live", bytes.Repeat([]byte("x"), 1<<20))
	vmWriteFile(t, ac, "/dev/shm/after-live", []byte("y"))
	// Its clock advances (polled: no guess at how long that takes).
	var up2 float64
	var infoErr error
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		info, err := ac.Agent.Info(t.Context(), connect.NewRequest(&agentv1.InfoRequest{}))
		if infoErr = err; err != nil {
			return true
		}
		up2 = info.Msg.GetUptimeSeconds()
		return up2 > up1
	}) || infoErr != nil {
		t.Errorf("guest uptime %v then %v (%v): not running?", up1, up2, infoErr)
	}
	ac.Close()

	// Pause.
	paused := mkdir(t, dir, "paused")
	t0 = time.Now()
	if err := saver.SaveState(t.Context(), paused, runtime.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	pauseTook := time.Since(t0)
	if es, _ := in.Wait(t.Context()); !es.Requested {
		t.Errorf("paused instance exit %+v", es)
	}
	t.Logf("pause (SaveState, instance ended): %v (incl. %v settle)", pauseTook, snapshotSettle)
	logSnapshotFiles(t, paused)
	if got := fileSum(t, disk0); got != sum0 {
		t.Fatal("the disk frozen by the live snapshot was written after it")
	}
	if err := os.Chmod(disk1, 0o444); err != nil {
		t.Fatal(err)
	}

	// Resume, a few times for the timing; the first one checks the markers.
	var times []time.Duration
	for i := range 3 {
		rs := f.spec(t, filepath.Join(t.TempDir(), "resume.qcow2"))
		rs.ID, rs.MemoryMiB, rs.RestoreFrom = fmt.Sprintf("resume-%d", i), 512, paused
		overlay(t, rs.RootDisk, disk1, "qcow2")
		t0 := time.Now()
		r, err := f.rt.Create(t.Context(), rs)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		started := time.Since(t0)
		rac := f.dialAgent(t, r)
		times = append(times, time.Since(t0))
		t.Logf("resume %d: running after %v, agent answered after %v", i, started, times[i])
		if i == 0 {
			for p, want := range map[string][]byte{
				"/dev/shm/ram-marker": ramMarker, "/disk-marker": diskMarker,
				"/dev/shm/after-live": []byte("y"), "/after-live": bytes.Repeat([]byte("x"), 1<<20),
			} {
				if got := runtimetest.ReadFile(t, rac, p); !bytes.Equal(got, want) {
					t.Errorf("resumed guest: %s has %d bytes, want %d", p, len(got), len(want))
				}
			}
		}
		rac.Close()
		_ = r.Kill()
		_, _ = r.Wait(t.Context())
	}
	slices.Sort(times)
	t.Logf("resume to first agent answer: median %v (min %v, max %v)", times[len(times)/2], times[0], times[len(times)-1])

	// The live snapshot, restored into a template-capable instance: the
	// guest as it was then (no /after-live), which becomes a template.
	ls := f.spec(t, filepath.Join(dir, "disk-fork.qcow2"))
	ls.ID, ls.MemoryMiB, ls.RestoreFrom, ls.Snapshottable = "fork-tmpl", 512, live, true
	overlay(t, ls.RootDisk, disk0, "qcow2")
	fk, err := f.rt.Create(t.Context(), ls)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := fk.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fk.Kill() }()
	fac := f.dialAgent(t, fk)
	t.Logf("restore of the live snapshot (Snapshottable): agent answered after %v", time.Since(t0))
	checkForkView(t, fac, ramMarker, diskMarker)
	fac.Close()
	tmpl := mkdir(t, dir, "fork-tmpl")
	t0 = time.Now()
	if err := fk.(runtime.Snapshotter).SaveSnapshot(t.Context(), tmpl); err != nil {
		t.Fatal(err)
	}
	t.Logf("SaveSnapshot of the restored instance: %v (incl. %v settle)", time.Since(t0), snapshotSettle)
	logSnapshotFiles(t, tmpl)
	if err := os.Chmod(ls.RootDisk, 0o444); err != nil {
		t.Fatal(err)
	}
	cs := f.spec(t, filepath.Join(dir, "clone.qcow2"))
	cs.ID, cs.MemoryMiB, cs.RestoreFrom = "fork-clone", 512, tmpl
	overlay(t, cs.RootDisk, ls.RootDisk, "qcow2")
	c, err := f.rt.Create(t.Context(), cs)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Kill() }()
	cac := f.dialAgent(t, c)
	t.Logf("clone of the fork template: agent answered after %v", time.Since(t0))
	checkForkView(t, cac, ramMarker, diskMarker)
	cac.Close()

	// A template clone (how most sandboxes run: RAM mapped privately from
	// the template's file) pauses and resumes too.
	cpaused := mkdir(t, dir, "clone-paused")
	if err := c.(runtime.StateSaver).SaveState(t.Context(), cpaused, runtime.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	logSnapshotFiles(t, cpaused)
	if err := os.Chmod(cs.RootDisk, 0o444); err != nil {
		t.Fatal(err)
	}
	rs := f.spec(t, filepath.Join(t.TempDir(), "clone-resume.qcow2"))
	rs.ID, rs.MemoryMiB, rs.RestoreFrom = "clone-resume", 512, cpaused
	overlay(t, rs.RootDisk, cs.RootDisk, "qcow2")
	r, err := f.rt.Create(t.Context(), rs)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Kill() }()
	rac := f.dialAgent(t, r)
	defer rac.Close()
	checkForkView(t, rac, ramMarker, diskMarker)
}

// checkForkView checks a guest restored from the live snapshot: the
// markers written before it, nothing written after.
func checkForkView(t *testing.T, ac *agentapi.Client, ramMarker, diskMarker []byte) {
	t.Helper()
	if got := runtimetest.ReadFile(t, ac, "/dev/shm/ram-marker"); !bytes.Equal(got, ramMarker) {
		t.Errorf("ram marker %q", got)
	}
	if got := runtimetest.ReadFile(t, ac, "/disk-marker"); !bytes.Equal(got, diskMarker) {
		t.Errorf("disk marker %q", got)
	}
	for _, p := range []string{"/after-live", "/dev/shm/after-live"} {
		_, err := ac.Files.Stat(t.Context(), connect.NewRequest(&agentv1.StatRequest{Path: p}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("stat %s (written after the live snapshot): %v, want not found", p, err)
		}
	}
}

func mkdir(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func logSnapshotFiles(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		t.Logf("%s/%s: %d bytes (%d allocated) mode %v uid %d", filepath.Base(dir), e.Name(), fi.Size(), st.Blocks*512, fi.Mode(), st.Uid)
		if fi.Mode().Perm() != 0o444 || st.Uid != 0 {
			t.Errorf("%s: mode %v uid %d", e.Name(), fi.Mode(), st.Uid)
		}
	}
}

func vmWriteFile(t *testing.T, c *agentapi.Client, path string, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	st := c.Files.Write(ctx)
	if err := st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{Path: path, Mode: 0o644}}}); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	for b := data; len(b) > 0; {
		n := min(len(b), agentapi.ChunkSize)
		if err := st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: b[:n]}}); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
		b = b[n:]
	}
	if _, err := st.CloseAndReceive(); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}
