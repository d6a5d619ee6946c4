package shim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
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
