package shim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// local is the caller of these tests: the CLI on its own state dir.
var local = sandbox.Local()

// startExec starts spec through the manager's one exec path and detaches
// at once (the exec keeps running): the exec's info.
func startExec(ctx context.Context, m *sandbox.Manager, c sandbox.Caller, sbID string, spec guest.ExecSpec) (guest.ExecInfo, error) {
	st, err := m.Exec(ctx, c, sbID, spec, false)
	if err != nil {
		return guest.ExecInfo{}, err
	}
	st.Close()
	return st.Info(), nil
}

// execInput writes data to an exec's stdin over a control stream, then
// closes stdin if closeStdin, and returns the shim's verdict.
func execInput(ctx context.Context, m *sandbox.Manager, sbID, execID string, data []byte, closeStdin bool) error {
	st, err := m.ExecControl(ctx, local, sbID, execID)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Stdin(data); err != nil {
		return err
	}
	if closeStdin {
		if err := st.CloseStdin(); err != nil {
			return err
		}
	}
	return st.Finish()
}

// execSignal sends sig to an exec over a control stream.
func execSignal(ctx context.Context, m *sandbox.Manager, sbID, execID string, sig int) error {
	st, err := m.ExecControl(ctx, local, sbID, execID)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Signal(sig); err != nil {
		return err
	}
	return st.Finish()
}

// attachExec calls fn for each event of an attach until the exit (nil),
// an error of fn, or ctx's end (its error).
func attachExec(ctx context.Context, m *sandbox.Manager, sbID, execID string, fromStart bool, fn func(guest.ExecEvent) error) error {
	st, err := m.AttachExec(ctx, local, sbID, execID, fromStart)
	if err != nil {
		return err
	}
	defer st.Close()
	for {
		ev, err := st.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if err := fn(ev); err != nil {
			return err
		}
		if ev.Kind == guest.ExecExited {
			return nil
		}
	}
}

// manager returns a Manager over the harness's state dir: what the API
// server uses. A new one per call stands for a restarted server.
func (h *harness) manager() *sandbox.Manager {
	return &sandbox.Manager{L: h.l, Store: h.st}
}

// stop shuts the sandbox down through its shim and waits for the shim.
func (h *harness) stop(t *testing.T) {
	t.Helper()
	c := shimclient.New(h.l.Socket(h.id))
	defer c.Close()
	if err := c.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	h.wait(t)
}

// collected is what an attach delivered.
type collected struct {
	stdout, stderr bytes.Buffer
	exit           *guest.ExitStatus
	events         int
}

func (c *collected) add(ev guest.ExecEvent) error {
	c.events++
	switch ev.Kind {
	case guest.ExecStdout:
		c.stdout.Write(ev.Data)
	case guest.ExecStderr:
		c.stderr.Write(ev.Data)
	case guest.ExecExited:
		if c.exit != nil {
			return errors.New("second exited event")
		}
		c.exit = ev.Exit
	default:
		return fmt.Errorf("unexpected event %v", ev.Kind)
	}
	return nil
}

// waitAttached waits until n attachers other than its starter follow exec
// execID in the shim (an attach registered: input or a stop after this is
// seen live).
func (h *harness) waitAttached(t *testing.T, execID string, n int) {
	t.Helper()
	s, err := h.s.execs.Get(execID)
	if err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		k := 0
		for a := range s.attachers {
			if !a.flow {
				k++
			}
		}
		return k >= n
	}) {
		t.Fatalf("exec %s: %d attachers never registered", execID, n)
	}
}

func attachAll(t *testing.T, m *sandbox.Manager, sbID, execID string, fromStart bool) *collected {
	t.Helper()
	var c collected
	if err := attachExec(t.Context(), m, sbID, execID, fromStart, c.add); err != nil {
		t.Fatalf("attach: %v", err)
	}
	if c.exit == nil {
		t.Fatal("attach returned without an exit")
	}
	return &c
}

func TestSessionOutlivesAttacherAndReplays(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	info, err := startExec(ctx, m, sandbox.Caller{Tenant: "t1", KeyID: "k1", Admin: true}, h.id, guest.ExecSpec{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if !guest.ValidExecID(info.ID) || len(info.ID) != 20 || info.State != guest.ExecStateRunning || info.PID == 0 || info.Exit != nil {
		t.Fatalf("start info: %+v", info)
	}

	// Attach, see the first line, detach.
	actx, cancel := context.WithCancel(ctx)
	got := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- attachExec(actx, m, h.id, info.ID, false, func(ev guest.ExecEvent) error {
			got <- string(ev.Data)
			return nil
		})
	}()
	h.waitAttached(t, info.ID, 1) // the attacher sees the input live
	if err := execInput(ctx, m, h.id, info.ID, []byte("hello\n"), false); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "hello\n" {
		t.Fatalf("live output %q", s)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("detach: %v", err)
	}

	// The exec kept running without attachers.
	if err := execInput(ctx, m, h.id, info.ID, []byte("world\n"), true); err != nil {
		t.Fatal(err)
	}
	// A new manager (a restarted server) replays everything and the exit.
	m2 := h.manager()
	c := attachAll(t, m2, h.id, info.ID, true)
	if c.stdout.String() != "hello\nworld\n" || c.exit.Code != 0 || c.exit.Signal != 0 {
		t.Fatalf("replay: %q exit %v", c.stdout.String(), c.exit)
	}
	// After the exit: state, exit status, and another full replay.
	gi, err := m2.GetExec(ctx, local, h.id, info.ID)
	if err != nil || gi.State != guest.ExecStateExited || gi.Exit == nil || gi.EndedAt.Before(gi.StartedAt) || gi.Argv[0] != "cat" {
		t.Fatalf("get after exit: %+v %v", gi, err)
	}
	if c2 := attachAll(t, m2, h.id, info.ID, true); c2.stdout.String() != "hello\nworld\n" {
		t.Fatalf("second replay %q", c2.stdout.String())
	}
	if c3 := attachAll(t, m2, h.id, info.ID, false); c3.events != 1 {
		t.Fatalf("attach without replay after exit: %d events", c3.events)
	}
	list, err := m2.ListExecs(ctx, local, h.id)
	if err != nil || len(list) != 1 || list[0].ID != info.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := execInput(ctx, m2, h.id, info.ID, []byte("x"), false); !errors.Is(err, guest.ErrExecExited) || !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("input after exit: %v", err)
	}
	for _, id := range []string{"aaaaaaaaaaaaaaaa", "nope"} {
		if _, err := m2.GetExec(ctx, local, h.id, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("get %q: %v", id, err)
		}
	}
}

func TestSessionConcurrentAttachersSignalAndAudit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	ctx := t.Context()
	m := h.manager()
	actor := sandbox.Actor{Tenant: "acme", KeyID: "key12345"}
	caller := sandbox.Caller{Tenant: actor.Tenant, KeyID: actor.KeyID, Admin: true}
	info, err := startExec(ctx, m, caller, h.id, guest.ExecSpec{Argv: []string{"cat"}, Stdin: true, Cwd: "/tmp", User: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	res := make([]*collected, 2)
	for i := range res {
		res[i] = &collected{}
		wg.Go(func() {
			if err := attachExec(ctx, m, h.id, info.ID, true, res[i].add); err != nil {
				t.Errorf("attacher %d: %v", i, err)
			}
		})
	}
	for _, s := range []string{"a\n", "b\n", "c\n"} {
		if err := execInput(ctx, m, h.id, info.ID, []byte(s), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := execSignal(ctx, m, h.id, info.ID, 15); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, c := range res {
		if c.stdout.String() != "a\nb\nc\n" || c.exit.Signal != 15 || c.exit.Code != -1 {
			t.Fatalf("attacher %d: %q exit %v", i, c.stdout.String(), c.exit)
		}
	}
	if err := execSignal(ctx, m, h.id, info.ID, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("signal 0: %v", err)
	}

	// A running exec is ended, and audited, when the sandbox stops.
	sleeper, err := startExec(ctx, m, caller, h.id, guest.ExecSpec{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	var sc collected
	done := make(chan error, 1)
	go func() { done <- attachExec(context.Background(), m, h.id, sleeper.ID, false, sc.add) }()
	h.waitAttached(t, sleeper.ID, 1)
	h.stop(t)
	if err := <-done; err != nil || sc.exit.Signal != 9 {
		t.Fatalf("attacher at stop: %v %v", err, sc.exit)
	}

	evs, err := h.st.ListEvents(ctx, store.EventFilter{SandboxID: h.id})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.Tenant != actor.Tenant || e.KeyID != actor.KeyID {
			t.Fatalf("event without the actor: %+v", e)
		}
		got = append(got, fmt.Sprintf("%s %v", e.Action, e.Detail["exec_id"]))
		switch e.Action {
		case "exec.start":
			if e.Detail["exec_id"] == info.ID && (fmt.Sprint(e.Detail["argv"]) != "[cat]" || e.Detail["user"] != "nobody" || e.Detail["cwd"] != "/tmp") {
				t.Fatalf("exec.start detail: %v", e.Detail)
			}
		case "exec.exit":
			for _, k := range []string{"code", "signal", "timeout", "truncated", "duration_ms"} {
				if _, ok := e.Detail[k]; !ok {
					t.Fatalf("exec.exit detail lacks %s: %v", k, e.Detail)
				}
			}
			if e.Detail["exec_id"] == info.ID && e.Detail["signal"] != float64(15) {
				t.Fatalf("exec.exit detail: %v", e.Detail)
			}
		}
	}
	want := []string{"exec.start " + info.ID, "exec.exit " + info.ID, "exec.start " + sleeper.ID, "exec.exit " + sleeper.ID}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events %v, want %v", got, want)
	}
}

func TestSessionRetentionDropsOldest(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour, func(_ *store.Sandbox, c *Config) {
		c.serving = func(s *shim) { s.execs.retainCap = 1024 }
	})
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	info, err := startExec(ctx, m, local, h.id, guest.ExecSpec{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for i := range 3 {
		chunk := bytes.Repeat([]byte{'a' + byte(i)}, 1000)
		all = append(all, chunk...)
		if err := execInput(ctx, m, h.id, info.ID, chunk, i == 2); err != nil {
			t.Fatal(err)
		}
	}
	waitExited(t, m, h.id, info.ID) // a live attacher would fall behind the tiny cap
	c := attachAll(t, m, h.id, info.ID, true)
	if want := "[airlock: 1976 earlier bytes dropped]\n"; c.stderr.String() != want {
		t.Fatalf("note %q, want %q", c.stderr.String(), want)
	}
	if !bytes.Equal(c.stdout.Bytes(), all[len(all)-1024:]) {
		t.Fatalf("retained %d bytes, not the newest 1024", c.stdout.Len())
	}
}

func TestSessionKillOnDetach(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	// The starting stream is the first attacher; a second one comes and
	// goes without killing it.
	st, err := m.Exec(ctx, local, h.id, guest.ExecSpec{Argv: []string{"sleep", "60"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	info := st.Info()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- attachExec(actx, m, h.id, info.ID, true, func(guest.ExecEvent) error { return nil })
	}()
	h.waitAttached(t, info.ID, 1)
	cancel()
	<-done //nolint:errcheck // only waiting for the attach to end; its result is not the subject here
	if gi, err := m.GetExec(ctx, local, h.id, info.ID); err != nil || gi.State != guest.ExecStateRunning {
		t.Fatalf("while attached: %+v %v", gi, err)
	}
	st.Close()
	if gi := waitExited(t, m, h.id, info.ID); gi.Exit.Signal != 9 {
		t.Fatalf("exit %v, want signal 9", gi.Exit)
	}
}

func waitExited(t *testing.T, m *sandbox.Manager, sbID, execID string) guest.ExecInfo {
	t.Helper()
	var gi guest.ExecInfo
	if !testutil.WaitFor(t, 5*time.Second, func() bool {
		var err error
		if gi, err = m.GetExec(t.Context(), local, sbID, execID); err != nil {
			t.Fatal(err)
		}
		return gi.State == guest.ExecStateExited
	}) {
		t.Fatalf("exec %s still running", execID)
	}
	return gi
}

func TestSessionHostTimeoutAndBadStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	if _, err := startExec(ctx, m, local, h.id, guest.ExecSpec{Argv: []string{"true"}, Cwd: "tmp"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("relative cwd: %v", err)
	}
	if _, err := startExec(ctx, m, local, h.id, guest.ExecSpec{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("empty argv: %v", err)
	}
	// The shim checks on its own what reaches it past the manager.
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	for _, spec := range []guest.ExecSpec{{Argv: []string{"true"}, Cwd: "tmp"}, {}, {Argv: []string{""}}} {
		if _, err := sc.Exec(ctx, spec, shimclient.StartOptions{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("shim, spec %+v: %v", spec, err)
		}
	}
	info, err := startExec(ctx, m, local, h.id, guest.ExecSpec{Argv: []string{"sleep", "60"}, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if c := attachAll(t, m, h.id, info.ID, true); !c.exit.TimedOut {
		t.Fatalf("exit %v, want timed out", c.exit)
	}
	if err := execInput(ctx, m, h.id, info.ID, []byte("x"), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("input without stdin: %v", err)
	}
}

func TestShimLifetimeFollowsSetExpiry(t *testing.T) {
	t.Parallel()
	// Extended: a 15 s lifetime moved an hour out keeps the sandbox. (15 s:
	// no other timer of the shim falls due at that instant.)
	h := newHarness(t, 15*time.Second)
	first, extended := h.t0.Add(15*time.Second), h.t0.Add(time.Hour)
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return h.hasDeadline(first) }) {
		t.Fatalf("the shim never armed its lifetime timer: %v", h.clk.Deadlines())
	}
	if err := h.st.SetExpiry(t.Context(), h.id, extended); err != nil {
		t.Fatal(err)
	}
	// Asked to (what the control plane does after SetExpiry), the shim
	// re-reads expires_at at once: the clock does not move.
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	if err := sc.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return h.hasDeadline(extended) && !h.hasDeadline(first) }) {
		t.Fatalf("the shim did not move its lifetime timer: %v", h.clk.Deadlines())
	}
	h.clk.Advance(20 * time.Second) // well past the first lifetime
	if sb, err := h.st.GetSandbox(t.Context(), h.id); err != nil || sb.State != store.StateRunning || !h.hasDeadline(extended) {
		t.Fatalf("after extension: %+v %v", sb, err)
	}
	// Shortened, with no Refresh: the shim's own re-read (lifetimePoll)
	// finds it and removes the sandbox at the new time.
	shortened := h.clk.Now().Add(100 * time.Millisecond)
	if err := h.st.SetExpiry(t.Context(), h.id, shortened); err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(lifetimePoll)
	h.waitAdvancing(t)
	if h.clk.Now().Before(shortened) {
		t.Fatalf("removed at %v, before its shortened lifetime %v", h.clk.Now(), shortened)
	}
	if _, err := h.st.GetSandbox(t.Context(), h.id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("row after shortened lifetime: %v", err)
	}
}

func TestSessionNotRunningSandbox(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	h.stop(t)
	m := h.manager()
	if _, err := m.ListExecs(t.Context(), local, h.id); !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("list on a stopped sandbox: %v", err)
	}
}

func TestSessionCutsOffSlowAttacherOnly(t *testing.T) {
	t.Parallel()
	s := &session{id: "slowslowslowslow", attachers: map[*attacher]struct{}{}}
	tbl := &sessions{retainCap: 100}

	block := make(chan struct{})
	slowErr := make(chan error, 1)
	go func() {
		slowErr <- s.Attach(t.Context(), tbl, false, func(*agentv1.ExecResponse) error { <-block; return nil })
	}()
	fastCtx, cancelFast := context.WithCancel(t.Context())
	fastGot := make(chan int)
	fastErr := make(chan error, 1)
	go func() {
		fastErr <- s.Attach(fastCtx, tbl, false, func(ev *agentv1.ExecResponse) error { fastGot <- len(ev.GetStdout()); return nil })
	}()
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.attachers) == 2
	}) {
		t.Fatal("the two attachers never registered")
	}
	for range 5 {
		s.publish(tbl, &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: make([]byte, 40)}})
		if n := <-fastGot; n != 40 {
			t.Fatalf("fast attacher got %d bytes", n)
		}
	}
	close(block)
	if err := <-slowErr; connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("slow attacher: %v", err)
	}
	cancelFast()
	if err := <-fastErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("fast attacher: %v", err)
	}
	if s.outBytes != 100 || s.dropped != 100 || len(s.attachers) != 0 {
		t.Fatalf("retained %d, dropped %d, %d attachers", s.outBytes, s.dropped, len(s.attachers))
	}
}

// TestKilledByHostOOM: an exec the guest did not call OOM-killed is
// reported so when it ended by SIGKILL (or 137) while the host counted an
// OOM kill in the sandbox's cgroup (gVisor), and only then.
func TestKilledByHostOOM(t *testing.T) {
	t.Parallel()
	var count uint64
	var countErr error
	tbl := &sessions{hostOOM: func() (uint64, error) { return count, countErr }}
	for _, c := range []struct {
		name         string
		known        bool
		base, now    uint64
		code, signal int32
		err          error
		want         bool
	}{
		{"sigkill during a host OOM kill", true, 2, 3, 0, 9, nil, true},
		{"137 from a shell", true, 0, 1, 137, 0, nil, true},
		{"sigkill, no OOM kill", true, 3, 3, 0, 9, nil, false},
		{"normal exit during an OOM kill", true, 0, 1, 0, 0, nil, false},
		{"sigterm during an OOM kill", true, 0, 1, 0, 15, nil, false},
		{"count unknown at start", false, 0, 1, 0, 9, nil, false},
		{"count unreadable at the end", true, 0, 1, 0, 9, errors.New("gone"), false},
	} {
		count, countErr = c.now, c.err
		s := &session{hostOOMs: c.base, hostOOMKnown: c.known}
		ex := &agentv1.ExecExited{ExitCode: c.code, Signal: c.signal}
		if got := tbl.killedByHostOOM(s, ex); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if (&sessions{}).killedByHostOOM(&session{hostOOMKnown: true}, &agentv1.ExecExited{Signal: 9}) {
		t.Error("a runtime without a host OOM count (QEMU) reported a host OOM kill")
	}
}
