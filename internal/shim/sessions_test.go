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
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/store"
)

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
	exit           *agentv1.ExecExited
	events         int
}

func (c *collected) add(ev *agentv1.ExecResponse) error {
	c.events++
	switch e := ev.GetEvent().(type) {
	case *agentv1.ExecResponse_Stdout:
		c.stdout.Write(e.Stdout)
	case *agentv1.ExecResponse_Stderr:
		c.stderr.Write(e.Stderr)
	case *agentv1.ExecResponse_Exited:
		if c.exit != nil {
			return errors.New("second exited event")
		}
		c.exit = e.Exited
	default:
		return fmt.Errorf("unexpected event %T", e)
	}
	return nil
}

func attachAll(t *testing.T, m *sandbox.Manager, sbID, execID string, fromStart bool) *collected {
	t.Helper()
	var c collected
	if err := m.AttachExec(t.Context(), sbID, execID, fromStart, c.add); err != nil {
		t.Fatalf("attach: %v", err)
	}
	if c.exit == nil {
		t.Fatal("attach returned without an exit")
	}
	return &c
}

func TestSessionOutlivesAttacherAndReplays(t *testing.T) {
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	info, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"cat"}, Stdin: true}, sandbox.Actor{Tenant: "t1", KeyID: "k1"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.ID) != 16 || info.State != sandbox.ExecStateRunning || info.PID == 0 || info.Exit != nil {
		t.Fatalf("start info: %+v", info)
	}

	// Attach, see the first line, detach.
	actx, cancel := context.WithCancel(ctx)
	got := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- m.AttachExec(actx, h.id, info.ID, false, func(ev *agentv1.ExecResponse) error {
			got <- string(ev.GetStdout())
			return nil
		})
	}()
	time.Sleep(50 * time.Millisecond) // let the attacher register before the input
	if err := m.ExecInput(ctx, h.id, info.ID, []byte("hello\n"), false); err != nil {
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
	if err := m.ExecInput(ctx, h.id, info.ID, []byte("world\n"), true); err != nil {
		t.Fatal(err)
	}
	// A new manager (a restarted server) replays everything and the exit.
	m2 := h.manager()
	c := attachAll(t, m2, h.id, info.ID, true)
	if c.stdout.String() != "hello\nworld\n" || c.exit.GetExitCode() != 0 || c.exit.GetSignal() != 0 {
		t.Fatalf("replay: %q exit %v", c.stdout.String(), c.exit)
	}
	// After the exit: state, exit status, and another full replay.
	gi, err := m2.GetExec(ctx, h.id, info.ID)
	if err != nil || gi.State != sandbox.ExecStateExited || gi.Exit == nil || gi.EndedAt.Before(gi.StartedAt) || gi.Argv[0] != "cat" {
		t.Fatalf("get after exit: %+v %v", gi, err)
	}
	if c2 := attachAll(t, m2, h.id, info.ID, true); c2.stdout.String() != "hello\nworld\n" {
		t.Fatalf("second replay %q", c2.stdout.String())
	}
	if c3 := attachAll(t, m2, h.id, info.ID, false); c3.events != 1 {
		t.Fatalf("attach without replay after exit: %d events", c3.events)
	}
	list, err := m2.ListExecs(ctx, h.id)
	if err != nil || len(list) != 1 || list[0].ID != info.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := m2.ExecInput(ctx, h.id, info.ID, []byte("x"), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("input after exit: %v", err)
	}
	for _, id := range []string{"aaaaaaaaaaaaaaaa", "nope"} {
		if _, err := m2.GetExec(ctx, h.id, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("get %q: %v", id, err)
		}
	}
}

func TestSessionConcurrentAttachersSignalAndAudit(t *testing.T) {
	h := newHarness(t, time.Hour)
	ctx := t.Context()
	m := h.manager()
	actor := sandbox.Actor{Tenant: "acme", KeyID: "key12345"}
	info, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"cat"}, Stdin: true, Cwd: "/tmp", User: "nobody"}, actor, false)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	res := make([]*collected, 2)
	for i := range res {
		res[i] = &collected{}
		wg.Go(func() {
			if err := m.AttachExec(ctx, h.id, info.ID, true, res[i].add); err != nil {
				t.Errorf("attacher %d: %v", i, err)
			}
		})
	}
	for _, s := range []string{"a\n", "b\n", "c\n"} {
		if err := m.ExecInput(ctx, h.id, info.ID, []byte(s), false); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.ExecSignal(ctx, h.id, info.ID, 15); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, c := range res {
		if c.stdout.String() != "a\nb\nc\n" || c.exit.GetSignal() != 15 || c.exit.GetExitCode() != -1 {
			t.Fatalf("attacher %d: %q exit %v", i, c.stdout.String(), c.exit)
		}
	}
	if err := m.ExecSignal(ctx, h.id, info.ID, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("signal 0: %v", err)
	}

	// A running exec is ended, and audited, when the sandbox stops.
	sleeper, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"sleep", "60"}}, actor, false)
	if err != nil {
		t.Fatal(err)
	}
	var sc collected
	done := make(chan error, 1)
	go func() { done <- m.AttachExec(context.Background(), h.id, sleeper.ID, false, sc.add) }()
	time.Sleep(50 * time.Millisecond)
	h.stop(t)
	if err := <-done; err != nil || sc.exit.GetSignal() != 9 {
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
	old := retainCap
	retainCap = 1024
	t.Cleanup(func() { retainCap = old })
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	info, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"cat"}, Stdin: true}, sandbox.Actor{}, false)
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for i := range 3 {
		chunk := bytes.Repeat([]byte{'a' + byte(i)}, 1000)
		all = append(all, chunk...)
		if err := m.ExecInput(ctx, h.id, info.ID, chunk, i == 2); err != nil {
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
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	info, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"sleep", "60"}}, sandbox.Actor{}, true)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- m.AttachExec(actx, h.id, info.ID, true, func(*agentv1.ExecResponse) error { return nil })
	}()
	time.Sleep(100 * time.Millisecond)
	if gi, err := m.GetExec(ctx, h.id, info.ID); err != nil || gi.State != sandbox.ExecStateRunning {
		t.Fatalf("while attached: %+v %v", gi, err)
	}
	cancel()
	<-done
	if gi := waitExited(t, m, h.id, info.ID); gi.Exit.GetSignal() != 9 {
		t.Fatalf("exit %v, want signal 9", gi.Exit)
	}
}

func waitExited(t *testing.T, m *sandbox.Manager, sbID, execID string) sandbox.ExecInfo {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		gi, err := m.GetExec(t.Context(), sbID, execID)
		if err != nil {
			t.Fatal(err)
		}
		if gi.State == sandbox.ExecStateExited {
			return gi
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec %s still running", execID)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSessionHostTimeoutAndBadStart(t *testing.T) {
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	ctx := t.Context()
	m := h.manager()
	if _, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"true"}, Cwd: "tmp"}, sandbox.Actor{}, false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("relative cwd: %v", err)
	}
	if _, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{}, sandbox.Actor{}, false); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("empty argv: %v", err)
	}
	info, err := m.StartExec(ctx, h.id, &agentv1.ExecStart{Argv: []string{"sleep", "60"}, TimeoutMs: 100}, sandbox.Actor{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if c := attachAll(t, m, h.id, info.ID, true); !c.exit.GetTimedOut() {
		t.Fatalf("exit %v, want timed out", c.exit)
	}
	if err := m.ExecInput(ctx, h.id, info.ID, []byte("x"), false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("input without stdin: %v", err)
	}
}

func TestShimLifetimeFollowsSetExpiry(t *testing.T) {
	old := expiryPoll
	expiryPoll = 20 * time.Millisecond
	t.Cleanup(func() { expiryPoll = old })

	// Extended: a 1 s lifetime moved an hour out keeps the sandbox.
	h := newHarness(t, time.Second)
	if err := h.st.SetExpiry(t.Context(), h.id, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if sb, err := h.st.GetSandbox(t.Context(), h.id); err != nil || sb.State != store.StateRunning {
		t.Fatalf("after extension: %+v %v", sb, err)
	}
	// Shortened: the shim removes the sandbox at the new time.
	if err := h.st.SetExpiry(t.Context(), h.id, time.Now().Add(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	h.wait(t)
	if _, err := h.st.GetSandbox(t.Context(), h.id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("row after shortened lifetime: %v", err)
	}
}

func TestSessionNotRunningSandbox(t *testing.T) {
	h := newHarness(t, time.Hour)
	h.stop(t)
	m := h.manager()
	if _, err := m.ListExecs(t.Context(), h.id); !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("list on a stopped sandbox: %v", err)
	}
}

func TestSessionCutsOffSlowAttacherOnly(t *testing.T) {
	old := retainCap
	retainCap = 100
	t.Cleanup(func() { retainCap = old })
	s := &session{id: "slowslowslowslow", attachers: map[*attacher]struct{}{}}
	tbl := &sessions{}

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
	for {
		s.mu.Lock()
		n := len(s.attachers)
		s.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
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
