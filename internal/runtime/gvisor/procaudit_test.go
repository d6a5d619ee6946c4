package gvisor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// TestProcEventsFromTheSentry: with Spec.ProcAudit, runsc's Sentry
// reports the programs the guest runs (exec with argv, cwd, parent; the
// exit with its code) through the instance's sink; without it there is
// no stream. Also logs whether an exec with a non-UTF-8 argument is
// reported (gVisor's encoder refuses it: see SECURITY.md).
func TestProcEventsFromTheSentry(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t)
	spec.ProcAudit = true
	in, c := boot(t, f, spec)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := in.ProcEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := in.ProcEvents(ctx); err == nil {
		t.Error("a second ProcEvents succeeded")
	}
	events := make(chan runtime.ProcEvent, 100)
	go func() {
		defer close(events)
		for {
			e, lost, err := st.Next()
			if err != nil {
				return
			}
			if lost > 0 {
				t.Logf("%d events lost", lost)
			}
			events <- e
		}
	}()
	if r := run(t, c, "", "sh", "-c", "cd /tmp && /bin/true \"$(printf 'a\\377b')\"; /bin/sh -c 'exit 3'; /bin/true after"); r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	var sh, child, exit3 *runtime.ProcEvent
	var sawBad bool
	timeout := time.After(20 * time.Second)
	for sh == nil || child == nil || exit3 == nil {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			switch {
			case !e.Exit && len(e.Argv) == 3 && e.Argv[0] == "sh" && e.Argv[1] == "-c":
				sh = &e
			case !e.Exit && slices.Equal(e.Argv, []string{"/bin/sh", "-c", "exit 3"}):
				child = &e
			case e.Exit && child != nil && e.PID == child.PID:
				exit3 = &e
			case !e.Exit && len(e.Argv) == 2 && e.Argv[1] == "a\xffb":
				sawBad = true
			}
		case <-timeout:
			t.Fatalf("not on record: sh %v, child %v, its exit %v", sh, child, exit3)
		}
	}
	if !sh.Agent || sh.Path != "/bin/busybox" || sh.Time.IsZero() {
		t.Errorf("sh's exec: %+v", sh)
	}
	if child.PPID != sh.PID || child.Agent || child.Cwd != "/tmp" || child.UID != 0 {
		t.Errorf("the child's exec: %+v (sh %+v)", child, sh)
	}
	if exit3.ExitCode != 3 || exit3.Path != child.Path {
		t.Errorf("the child's exit: %+v", exit3)
	}
	t.Logf("an exec with a non-UTF-8 argument reported: %v", sawBad)
	_ = in.Kill()
	for range events {
	}

	// Without ProcAudit: no stream.
	in2, _ := boot(t, f, f.spec(t))
	if _, err := in2.ProcEvents(ctx); err == nil {
		t.Error("ProcEvents without Spec.ProcAudit succeeded")
	}
}
