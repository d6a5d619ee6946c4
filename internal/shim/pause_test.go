package shim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// noSaveRuntime creates fake instances that cannot save their state, as
// gVisor's cannot.
type noSaveRuntime struct{ runtime.Runtime }

func (r noSaveRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	in, err := r.Runtime.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	snap, _ := in.(runtime.Snapshotter) // the shim builds a template first
	return noSaveInstance{in, snap}, nil
}

// noSaveInstance hides the optional abilities of the instance it wraps but
// Snapshotter.
type noSaveInstance struct {
	runtime.Instance
	runtime.Snapshotter
}

// TestShimPauseUnsupportedBeforeBusy: a runtime that cannot pause says so
// even while a command runs, instead of asking to wait for it or to force
// (which would fail in turn), and the command goes on.
func TestShimPauseUnsupportedBeforeBusy(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour, func(_ *store.Sandbox, cfg *Config) { cfg.Runtime = noSaveRuntime{cfg.Runtime} })
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := runStream(ctx, sc, guest.ExecSpec{Argv: []string{"sleep", "60"}}, io.Discard)
		done <- err
	}()
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return h.s.busy() > 0 }) {
		t.Fatal("the exec never ran")
	}
	for _, force := range []bool{false, true} {
		_, err := sc.Pause(t.Context(), force)
		if !errors.Is(err, errdefs.ErrUnsupported) {
			t.Errorf("pause (force %v) while a command runs: %v; want unsupported", force, err)
		}
	}
	if h.s.busy() == 0 {
		t.Error("the refused pause ended the command")
	}
	select {
	case err := <-done:
		t.Fatalf("the exec ended: %v", err)
	default:
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("the cancelled exec stream ended without an error")
	}
	if err := sc.Shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	h.wait(t)
}

// TestShimForcedPauseSaysSo: a forced pause ends running execs, and each
// stream's output ends by saying the sandbox was paused, not stopped.
func TestShimForcedPauseSaysSo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	st, err := sc.Exec(t.Context(), guest.ExecSpec{Argv: []string{"sleep", "60"}}, shimclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return h.s.busy() > 0 }) {
		t.Fatal("the exec never ran")
	}
	if _, err := sc.Pause(t.Context(), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("pause while a command runs: %v; want failed precondition", err)
	}
	if _, err := sc.Pause(t.Context(), true); err != nil {
		t.Fatalf("forced pause: %v", err)
	}
	var stderr bytes.Buffer
	for {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("exec stream: %v (stderr %q)", err, stderr.String())
		}
		if ev.Kind == guest.ExecStderr {
			stderr.Write(ev.Data)
		}
		if ev.Kind == guest.ExecExited {
			if ev.Exit.Signal != 9 {
				t.Errorf("exit %+v; want killed", ev.Exit)
			}
			break
		}
	}
	if want := "[airlock: the sandbox was paused (force); the process was killed]\n"; stderr.String() != want {
		t.Errorf("stderr %q; want %q", stderr.String(), want)
	}
	h.wait(t)
	sb, err := h.st.GetSandbox(t.Context(), h.id)
	if err != nil || sb.State != store.StatePaused {
		t.Fatalf("after the pause: %+v %v", sb, err)
	}
}

// TestShimLiveSnapshot: Snapshot saves the running guest into a new
// directory of the state dir's snapshots (the state, the root disk frozen
// under a second name, the manifest) and carries on: the guest answers
// again over a new agent channel, with a new root disk overlay backed by
// the frozen one. A directory elsewhere, or not empty, is refused with
// nothing changed; a runtime that cannot save says so.
func TestShimLiveSnapshot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	echo := func(when string) {
		t.Helper()
		var out bytes.Buffer
		if st, err := runStream(t.Context(), sc, guest.ExecSpec{Argv: []string{"echo", when}}, &out); err != nil || st.Code != 0 || out.String() != when+"\n" {
			t.Fatalf("exec %s: %v %v %q", when, st, err, out.String())
		}
	}
	echo("before")

	for _, bad := range []string{t.TempDir(), h.l.SnapshotsDir() + "/../x", h.l.SnapshotDir("missing")} {
		if _, err := sc.Snapshot(t.Context(), bad, false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("snapshot into %s: %v; want invalid", bad, err)
		}
	}
	full := h.l.SnapshotDir("full")
	if err := os.MkdirAll(filepath.Join(full, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Snapshot(t.Context(), full, false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("snapshot into a directory that is not empty: %v", err)
	}
	if n := len(h.rt.Instance(h.id).Saves()); n != 0 {
		t.Fatalf("refused snapshots saved %d times", n)
	}
	echo("after the refusals")

	root := h.l.RootDisk(h.id)
	before, err := os.Stat(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := h.l.SnapshotDir("live")
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	res, err := sc.Snapshot(t.Context(), dir, false)
	if err != nil {
		t.Fatal(err)
	}
	saves := h.rt.Instance(h.id).Saves()
	if len(saves) != 1 || !saves[0].Opts.KeepRunning || saves[0].Opts.NewRootDisk != root+".next" || saves[0].Dir != filepath.Join(dir, statedir.PauseStateDir) {
		t.Fatalf("saves %+v", saves)
	}
	var man statedir.PauseManifest
	if b, err := os.ReadFile(filepath.Join(dir, statedir.PauseManifestFile)); err != nil || json.Unmarshal(b, &man) != nil || man.StateBytes != res.StateBytes || len(man.StateSHA256) != 64 {
		t.Fatalf("manifest %+v (%v), result %+v", man, err, res)
	}
	frozen, err := os.Stat(filepath.Join(dir, statedir.SnapshotDisk))
	if err != nil || !os.SameFile(frozen, before) {
		t.Fatalf("the snapshot's disk is not the root disk as it was: %v", err)
	}
	now, err := os.Stat(root)
	if err != nil || os.SameFile(now, before) {
		t.Fatalf("the root disk was not replaced by the new overlay: %v", err)
	}
	if out, err := exec.Command("qemu-img", "info", "--output=json", "-U", root).Output(); err != nil || !strings.Contains(string(out), `"backing-filename": "`+filepath.Join(dir, statedir.SnapshotDisk)+`"`) {
		t.Fatalf("the new root disk is not backed by the snapshot's: %v\n%s", err, out)
	}
	echo("after the snapshot")

	if err := sc.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.wait(t)

	h2 := newHarness(t, time.Hour, func(_ *store.Sandbox, cfg *Config) { cfg.Runtime = noSaveRuntime{cfg.Runtime} })
	sc2 := shimclient.New(h2.l.Socket(h2.id))
	defer sc2.Close()
	dir2 := h2.l.SnapshotDir("live")
	if err := os.MkdirAll(dir2, 0o711); err != nil {
		t.Fatal(err)
	}
	if _, err := sc2.Snapshot(t.Context(), dir2, false); !errors.Is(err, errdefs.ErrUnsupported) {
		t.Errorf("snapshot on a runtime that cannot save: %v", err)
	}
	if err := sc2.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	h2.wait(t)
}
