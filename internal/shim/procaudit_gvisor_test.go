package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor/monitor"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor/monitor/monitortest"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// watcher is an instance whose runtime reports the guest's execs
// (runtime.ProcWatcher), as the gvisor runtime's does.
type watcher struct {
	runtime.Instance
	conn *monitor.Conn
	err  error
}

func (w watcher) ProcEvents(ctx context.Context) (runtime.ProcStream, error) {
	if w.err != nil {
		return nil, w.err
	}
	if err := w.conn.WaitStarted(time.Now().Add(10 * time.Second)); err != nil {
		return nil, err
	}
	return w.conn, nil
}

// sentrySink connects a fake Sentry to a monitor sink as runsc does.
func sentrySink(t *testing.T) (*monitortest.Sentry, *monitor.Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := monitor.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *monitor.Conn, 1)
	go func() {
		c, err := ln.Accept(context.Background(), func(pid int) bool { return pid == os.Getpid() })
		if err != nil {
			t.Error(err)
		}
		ch <- c
	}()
	s, err := monitortest.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	c := <-ch
	if c == nil {
		t.FailNow()
	}
	t.Cleanup(func() { s.Close(); c.Close() })
	return s, c
}

// TestProcAuditFromTheSentry: gVisor's trace points (real protobuf
// messages from the Sentry's side of the sink) go through the same
// checks, redaction and folding as the agent's events: python -> sh -> id
// on record with parents and exit, a loop of 1,000 execs folded, the
// Sentry's drops counted, and the stream's end said.
func TestProcAuditFromTheSentry(t *testing.T) {
	t.Parallel()
	s, conn := sentrySink(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Start())
	// The agent refuses ProcEvents (gVisor's has no connector): it is not
	// asked when the runtime reports.
	ac, st := dialProcAgent(t, procAgent{version: agentapi.VersionProcAudit, refuse: true})
	sb := store.Sandbox{ID: "sentrysentrysentry01", Tenant: "alice", Env: map[string]string{"TOKEN": "tok-0123456789"}}
	clk := clock.NewFake(time.Now())
	p := startProcAudit(ac, watcher{conn: conn}, st, sb.ID, newOwner(sb.Tenant, sb.Env), slog.New(slog.DiscardHandler), clk)
	if p == nil {
		t.Fatal("no audit")
	}
	must(s.Exec(monitortest.Exec{PID: 40, PPID: 1, Path: "/usr/bin/python3.11", Cwd: "/root", Argv: []string{"python3", "-c", "os.system('id') # tok-0123456789"}, Env: []string{"TOKEN=tok-0123456789"}, TimeNs: time.Now().UnixNano()}))
	must(s.Exec(monitortest.Exec{PID: 41, PPID: 40, Path: "/usr/bin/dash", Cwd: "/root", Argv: []string{"sh", "-c", "id"}}))
	must(s.Exec(monitortest.Exec{PID: 42, PPID: 41, UID: 1000, EUID: 1000, Path: "/usr/bin/id", Cwd: "/root", Argv: []string{"id"}}))
	must(s.Exit(42, 0))
	must(s.Exit(41, 0))
	must(s.Exit(40, 0))
	const loop = 1000
	sent := 6
	for i := range int32(loop) {
		must(s.Exec(monitortest.Exec{PID: 100 + i, PPID: 41, Path: "/usr/bin/true", Cwd: "/", Argv: []string{"/bin/true"}}))
		must(s.Exit(100+i, 0))
		sent += 2
	}
	s.Dropped = 4
	must(s.Exec(monitortest.Exec{PID: 50, PPID: 1, Path: "/usr/bin/sleep", Argv: []string{"sleep", "1"}}))
	sent += 1 + 4
	list := func() []store.Event {
		evs, err := st.ListEvents(t.Context(), store.EventFilter{SandboxID: sb.ID, Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	testutil.WaitFor(t, 30*time.Second, func() bool {
		return slices.ContainsFunc(list(), func(e store.Event) bool { return e.Detail["path"] == "/usr/bin/sleep" })
	})
	// The sandbox's end closes the Sentry's end: the trail says so.
	s.Close()
	testutil.WaitFor(t, 30*time.Second, func() bool {
		return slices.ContainsFunc(list(), func(e store.Event) bool { return e.Action == "proc.audit.end" })
	})
	p.close()
	evs := list()
	var py, sh, id, idExit map[string]any
	for _, e := range evs {
		switch {
		case e.Action == "proc.audit.off":
			t.Errorf("audit off: %v", e.Detail)
		case e.Action == "proc.exec" && e.Detail["pid"] == float64(40):
			py = e.Detail
		case e.Action == "proc.exec" && e.Detail["pid"] == float64(41):
			sh = e.Detail
		case e.Action == "proc.exec" && e.Detail["pid"] == float64(42):
			id = e.Detail
		case e.Action == "proc.exit" && e.Detail["pid"] == float64(42):
			idExit = e.Detail
		}
	}
	str := func(v any) string { return fmt.Sprint(v) }
	if py == nil || py["agent"] != true || str(py["argv"]) != "[python3 -c os.system('id') # [env TOKEN]]" || py["cwd"] != "/root" || py["guest_time"] == nil {
		t.Errorf("python's exec: %v", py)
	}
	if sh == nil || sh["agent"] != nil || sh["ppid"] != float64(40) || str(sh["argv"]) != "[sh -c id]" {
		t.Errorf("sh's exec: %v", sh)
	}
	if id == nil || id["ppid"] != float64(41) || id["uid"] != float64(1000) || id["path"] != "/usr/bin/id" {
		t.Errorf("id's exec: %v", id)
	}
	if idExit == nil || idExit["exit_code"] != float64(0) || idExit["path"] != "/usr/bin/id" {
		t.Errorf("id's exit: %v", idExit)
	}
	for _, e := range evs {
		if strings.Contains(str(e.Detail), "tok-0123456789") {
			t.Errorf("the environment's value is on record: %v", e.Detail)
		}
	}
	single, folded, dropped, rows := procCounts(t, evs)
	if got := single + folded + dropped; got != uint64(sent) {
		t.Errorf("counts add up to %d (single %d, folded %d, dropped %d), want %d", got, single, folded, dropped, sent)
	}
	// The loop: procPerKind execs and their exits by themselves, then a
	// folded row each; plus 3+3 of python, sh and id, sleep, the dropped
	// row and the end.
	if rows > 2*procPerKind+2+6+1+2 {
		t.Errorf("%d rows for %d events", rows, sent)
	}
}

// TestProcAuditOffWhenTheRuntimeMonitorFails: the trail says there is no
// audit, without the error's host paths.
func TestProcAuditOffWhenTheRuntimeMonitorFails(t *testing.T) {
	t.Parallel()
	ac, st := dialProcAgent(t, procAgent{version: agentapi.VersionProcAudit})
	sb := store.Sandbox{ID: "sentryoffsentryoff01"}
	w := watcher{err: errors.New("monitor: the trace session did not start: read unixpacket /var/lib/airlock/x: i/o timeout")}
	if p := startProcAudit(ac, w, st, sb.ID, newOwner(sb.Tenant, sb.Env), slog.New(slog.DiscardHandler), clock.NewFake(time.Now())); p != nil {
		p.close()
		t.Fatal("audit without a monitor")
	}
	evs, _ := st.ListEvents(t.Context(), store.EventFilter{SandboxID: sb.ID})
	if len(evs) != 1 || evs[0].Action != "proc.audit.off" || strings.Contains(fmt.Sprint(evs[0].Detail), "/var/lib") {
		t.Errorf("events: %v", evs)
	}
}
