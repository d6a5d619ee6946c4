package shim

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/shim/shimtest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// harness is a state dir with an image, boot files and one sandbox row,
// and a shim running in-process on the fake runtime (shimtest), on a fake
// clock: its timers (lifetime, idle pause, host-side deadlines) fire only
// when the test advances clk.
type harness struct {
	l    statedir.Layout
	st   *store.Store
	rt   *fake.Runtime
	clk  *clock.Fake // nil when an option gave the shim another clock
	s    *shim       // the shim, once it serves (Config.serving)
	t0   time.Time   // the sandbox's creation, on the fake clock
	id   string
	shim *shimtest.Shim
}

func newHarness(t *testing.T, lifetime time.Duration, opts ...func(*store.Sandbox, *Config)) *harness {
	t.Helper()
	e := shimtest.New(t)
	h := &harness{l: e.L, st: e.Store, rt: e.Runtime, id: statedir.NewID()}
	// Recent: the catalog keeps events for 90 days.
	fakeClock := clock.NewFake(time.Now().Round(0)) // wall time only, as the catalog keeps it
	sb := e.Row(h.id, lifetime)
	now := fakeClock.Now()
	h.t0 = now
	sb.CreatedAt, sb.ExpiresAt = now, now.Add(lifetime)
	cfg := Config{StateDir: h.l.Root, ID: h.id, Runtime: h.rt, Clock: fakeClock}
	for _, o := range opts {
		o(&sb, &cfg)
	}
	h.clk, _ = cfg.Clock.(*clock.Fake)
	serving := cfg.serving
	cfg.serving = func(s *shim) {
		h.s = s
		if serving != nil {
			serving(s)
		}
	}
	h.shim = e.Start(t, sb, func(ready io.WriteCloser) error {
		cfg.Ready = ready
		return Run(context.Background(), cfg)
	})
	return h
}

func (h *harness) wait(t *testing.T) {
	t.Helper()
	h.shim.Wait(t)
}

// waitAdvancing moves the fake clock on by a second at a time until the
// shim exits (a lifetime or idle pause that must come due).
func (h *harness) waitAdvancing(t *testing.T) {
	t.Helper()
	var err error
	if !testutil.WaitFor(t, 20*time.Second, func() bool {
		select {
		case err = <-h.shim.Done():
			return true
		default:
			h.clk.Advance(time.Second)
			return false
		}
	}) {
		t.Fatal("shim did not exit")
	}
	if err != nil {
		t.Fatalf("shim: %v", err)
	}
}

// hasDeadline reports whether one of the fake clock's pending timers fires
// at at.
func (h *harness) hasDeadline(at time.Time) bool {
	for _, d := range h.clk.Deadlines() {
		if d.Equal(at) {
			return true
		}
	}
	return false
}

func TestShimServesExecAndStops(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	ctx := t.Context()
	sb, err := h.st.GetSandbox(ctx, h.id)
	if err != nil || sb.State != store.StateRunning || sb.StartMode != "template" {
		t.Fatalf("after start: %+v %v", sb, err)
	}
	sc := shimclient.New(h.l.Socket(h.id))
	var out bytes.Buffer
	ex, err := runStream(ctx, sc, guest.ExecSpec{Argv: []string{"echo", "hello"}}, &out)
	if err != nil || ex.Code != 0 || out.String() != "hello\n" {
		t.Fatalf("exec echo: %v %v %q", ex, err, out.String())
	}
	ex, err = runStream(ctx, sc, guest.ExecSpec{Argv: []string{"exit", "7"}}, io.Discard)
	if err != nil || ex.Code != 7 {
		t.Fatalf("exit 7: %v %v", ex, err)
	}
	// Host-side path validation happens before the guest sees anything.
	files := shimv2connect.NewFileServiceClient(h2c(t, h.l.Socket(h.id)), "http://shim")
	_, err = files.Stat(ctx, connect.NewRequest(&shimv2.StatFileRequest{Path: "../etc/passwd"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("relative path: %v", err)
	}
	// The guest's own services are not served on the shim socket.
	agent := agentv1connect.NewAgentServiceClient(h2c(t, h.l.Socket(h.id)), "http://shim")
	if _, err := agent.Shutdown(ctx, connect.NewRequest(&agentv1.ShutdownRequest{Poweroff: true})); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Fatalf("agent shutdown on the shim socket: %v", err)
	}
	if err := sc.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	sc.Close()
	h.wait(t)
	if _, err := os.Stat(h.l.RootDisk(h.id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("root disk left after stop: %v", err)
	}
	if h.rt.Live() != 0 {
		t.Fatalf("%d fake instances still live", h.rt.Live())
	}
}

func TestShimMarksVMMCrashFailed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	in := h.rt.Instance(h.id)
	if in == nil {
		t.Fatal("no instance for the sandbox")
	}
	in.Crash("guest kernel panic: test")
	h.wait(t)
	sb, err := h.st.GetSandbox(t.Context(), h.id)
	if err != nil || sb.State != store.StateFailed || !strings.Contains(sb.Reason, "guest kernel panic: test") {
		t.Fatalf("after crash: %+v %v", sb, err)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: h.id, Type: "sandbox.fail"})
	if err != nil || len(evs) != 1 || !strings.Contains(fmt.Sprint(evs[0].Detail["reason"]), "guest kernel panic: test") {
		t.Fatalf("sandbox.fail events: %+v %v", evs, err)
	}
}

// TestShimIdlePauseKeepsTheDiskReserve: an idle pause that could take the
// state dir's filesystem below its reserve is skipped, with an event, and
// the sandbox keeps running.
func TestShimIdlePauseKeepsTheDiskReserve(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour, func(sb *store.Sandbox, c *Config) {
		sb.IdlePause = 100 * time.Millisecond
		c.DiskReserve = 1 << 60 // more than any disk has free
	})
	var evs []store.Event
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		evs, _ = h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: h.id, Type: "sandbox.pause.skipped"})
		h.clk.Advance(50 * time.Millisecond) // the idle check comes due
		return len(evs) > 0
	}) {
		t.Fatal("no sandbox.pause.skipped event")
	}
	if r := fmt.Sprint(evs[0].Detail["reason"]); !strings.Contains(r, "an idle pause") || !strings.Contains(r, "in reserve") {
		t.Fatalf("reason %q", r)
	}
	sb, err := h.st.GetSandbox(t.Context(), h.id)
	if err != nil || sb.State != store.StateRunning {
		t.Fatalf("after a skipped idle pause: %+v %v", sb, err)
	}
	sc := shimclient.New(h.l.Socket(h.id))
	defer sc.Close()
	if err := sc.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	h.wait(t)
}

func TestShimRemovesSandboxAtLifetime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2*time.Second)
	h.waitAdvancing(t)
	if at := h.clk.Now(); at.Before(h.t0.Add(2 * time.Second)) {
		t.Fatalf("removed at %v, before its lifetime ended at %v", at, h.t0.Add(2*time.Second))
	}
	if _, err := h.st.GetSandbox(t.Context(), h.id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("row after lifetime: %v", err)
	}
	if _, err := os.Stat(h.l.Dir(h.id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dir after lifetime: %v", err)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: h.id, Type: "sandbox.expire"})
	if err != nil || len(evs) != 1 || evs[0].Detail["reason"] == nil {
		t.Fatalf("sandbox.expire events: %+v %v", evs, err)
	}
}

// h2c returns a plain HTTP/2 client of the shim socket sock, for tests that
// speak a service's wire form directly.
func h2c(t *testing.T, sock string) *http.Client {
	t.Helper()
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, _, _ string, _ *tls.Config) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
