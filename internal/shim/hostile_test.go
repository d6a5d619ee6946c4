package shim

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// hostileAgent ignores exec timeouts and floods output.
type hostileAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	agentv1connect.UnimplementedExecServiceHandler
	agentv1connect.UnimplementedFileServiceHandler
}

func (hostileAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{ProtocolVersion: agentapi.ProtocolVersion}), nil
}

func (hostileAgent) Exec(ctx context.Context, st *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse]) error {
	first, err := st.Receive()
	if err != nil {
		return err
	}
	if first.GetStart().GetArgv()[0] == "hostile-start" {
		return connect.NewError(connect.CodeNotFound, errors.New(hostileMessage))
	}
	// It reports the start (the shim owns only execs that started), then
	// misbehaves.
	if err := st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: &agentv1.ExecStarted{Pid: 2}}}); err != nil {
		return err
	}
	// "flood" ignores the exec's output cap: it sends 8 MiB, four times
	// the largest cap the tests set, then hangs. (TestThreat092 hung in
	// about 1 run in 100 while the starter's attacher was registered only
	// after Start returned: output published in between could be dropped
	// before the starter saw it. TestStarterMissesNoEarlyOutput pins it.)
	chunk := make([]byte, 32<<10)
	for sent := 0; ; sent += len(chunk) {
		if first.GetStart().GetArgv()[0] == "flood" && sent < 8<<20 {
			if err := st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: chunk}}); err != nil {
				return err
			}
			continue
		}
		select { // "hang": never report the timeout
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Hour):
		}
	}
}

// hostileMessage is an error text meant to rewrite the user's terminal
// (clear it, forge a line, reverse text) and to break a log's framing.
const hostileMessage = "gone\x1b[2J\x1b[H\r\nairlock: all good\u202eexe.txt\xff\u200b\x07"

func (hostileAgent) Stat(context.Context, *connect.Request[agentv1.StatRequest]) (*connect.Response[agentv1.StatResponse], error) {
	return nil, connect.NewError(connect.CodeNotFound, errors.New(hostileMessage))
}

// relayOverHostileAgent serves the shim's ExecService on a unix socket,
// forwarding to a hostile agent over net.Pipe, and returns a client for it.
func relayOverHostileAgent(t *testing.T) *shimclient.Client {
	t.Helper()
	c, _ := hostileShim(t, nil)
	return c
}

// hostileShim is relayOverHostileAgent that also returns the shim's
// session table, for tests that look at a session's state. configure, if
// set, adjusts the table before anything is served.
func hostileShim(t *testing.T, configure func(*sessions)) (*shimclient.Client, *sessions) {
	t.Helper()
	host, gconn := net.Pipe()
	h := hostileAgent{}
	go func() { _ = agentapi.Serve(context.Background(), gconn, agentapi.NewHandler(h, h, h)) }()
	ac, err := agentapi.Dial(t.Context(), host, agentapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	tbl := newSessions(ac, st, "hostilehostil", nil, slog.New(slog.DiscardHandler), clock.Real{})
	if configure != nil {
		configure(tbl)
	}
	mux := http.NewServeMux()
	mux.Handle(shimv2connect.NewExecServiceHandler(execService{t: tbl, log: slog.New(slog.DiscardHandler)}))
	mux.Handle(shimv2connect.NewFileServiceHandler(fileService{agent: ac}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &p}
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	c := shimclient.New(sock)
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		tbl.Close()
		ac.Close()
		gconn.Close()
		st.Close()
	})
	return c, tbl
}

// runStream runs spec over one exec stream, counting its stdout into w,
// and returns its exit.
func runStream(ctx context.Context, c *shimclient.Client, spec guest.ExecSpec, w io.Writer) (*guest.ExitStatus, error) {
	st, err := c.Exec(ctx, spec, shimclient.StartOptions{})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	for {
		ev, err := st.Recv()
		if err != nil {
			return nil, err
		}
		switch ev.Kind {
		case guest.ExecStdout:
			_, _ = w.Write(ev.Data)
		case guest.ExecExited:
			return ev.Exit, nil
		}
	}
}

func TestRelayEnforcesTimeoutAgainstHostileAgent(t *testing.T) {
	t.Parallel()
	c, _ := hostileShim(t, func(tbl *sessions) { tbl.grace = 200 * time.Millisecond })
	start := time.Now()
	ex, err := runStream(t.Context(), c, guest.ExecSpec{Argv: []string{"hang"}, Timeout: 100 * time.Millisecond}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !ex.TimedOut {
		t.Fatalf("exit %v: want timed_out from the host", ex)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("host-side timeout took %s", el)
	}
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

func TestThreat016HostileAgent(t *testing.T) {
	t.Parallel()
	c, _ := hostileShim(t, func(tbl *sessions) { tbl.grace = 0 })
	var w countWriter
	ex, err := runStream(t.Context(), c, guest.ExecSpec{Argv: []string{"flood"}, Timeout: 3 * time.Second, MaxOutputBytes: 1 << 20}, &w)
	if err != nil {
		t.Fatal(err)
	}
	if w.n != 1<<20 || !ex.Truncated {
		t.Fatalf("got %d bytes, truncated=%v; want exactly 1 MiB and truncated", w.n, ex.Truncated)
	}
}

// TestThreat092SlowConsumer: the stream that started an exec reads
// its output like a pipe: a reader that falls far behind (here 32 times the
// retained output) is not cut off; it gets every byte up to the cap.
func TestThreat092SlowConsumer(t *testing.T) {
	t.Parallel()
	c, tbl := hostileShim(t, func(tbl *sessions) { tbl.retainCap = 64 << 10 })
	st, err := c.Exec(t.Context(), guest.ExecSpec{Argv: []string{"flood"}, Timeout: time.Hour, MaxOutputBytes: 2 << 20}, shimclient.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := 0
	for n < 2<<20 {
		ev, err := st.Recv()
		if err != nil || ev.Kind == guest.ExecExited {
			t.Fatalf("after %d bytes: %v %+v; want all 2 MiB", n, err, ev.Exit)
		}
		if n == 0 {
			// Fall behind: nobody reads until the flood has gone past what
			// the shim retains (it dropped the oldest output).
			s, err := tbl.Get(st.Info().ID)
			if err != nil {
				t.Fatal(err)
			}
			if !testutil.WaitFor(t, 30*time.Second, func() bool {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.dropped > 0
			}) {
				t.Fatal("the flood never went past the retained output")
			}
		}
		n += len(ev.Data)
	}
	if n != 2<<20 {
		t.Fatalf("got %d bytes, want the 2 MiB cap", n)
	}
}

// TestStarterMissesNoEarlyOutput: the starter's attacher exists from the
// moment the exec started, so output the exec writes before the starter
// reads (here the flood fills many times the retained output before Follow
// is called) is held back for it, never dropped: it gets every byte up to
// the cap, in order, with no "earlier bytes dropped" note.
func TestStarterMissesNoEarlyOutput(t *testing.T) {
	t.Parallel()
	_, tbl := hostileShim(t, func(tbl *sessions) { tbl.retainCap = 64 << 10 })
	s, starter, err := tbl.Start(t.Context(), &agentv1.ExecStart{Argv: []string{"flood"}, TimeoutMs: 3600_000, MaxOutputBytes: 1 << 20}, "", "", false)
	if err != nil {
		t.Fatal(err)
	}
	// The pump runs ahead until the starter's queue is full, then waits.
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return starter.qBytes+32<<10 > tbl.retainCap
	}) {
		t.Fatal("the flood never filled the starter's queue")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n := 0
	err = s.Follow(ctx, tbl, starter, func(ev *agentv1.ExecResponse) error {
		if ev.GetStderr() != nil {
			t.Errorf("stderr %q", ev.GetStderr())
		}
		if n += len(ev.GetStdout()); n >= 1<<20 {
			cancel()
		}
		return nil
	})
	if n != 1<<20 || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %d bytes (%v), want the 1 MiB cap", n, err)
	}
}

// TestThreat035HostileGuestText: error messages a hostile agent writes
// (terminal escapes, a forged line, bidi overrides, bytes that are not
// UTF-8) reach the host's callers escaped: as the error of a file call
// and as the reason an exec did not start, with the code kept.
func TestThreat035HostileGuestText(t *testing.T) {
	t.Parallel()
	c := relayOverHostileAgent(t)
	_, statErr := c.StatFile(t.Context(), "/x")
	_, execErr := runStream(t.Context(), c, guest.ExecSpec{Argv: []string{"hostile-start"}}, io.Discard)
	if statErr == nil || execErr == nil {
		t.Fatalf("the hostile agent's errors did not arrive: stat %v, exec %v", statErr, execErr)
	}
	se, ok := guest.AsStartError(execErr)
	if !ok || !se.NotFound {
		t.Fatalf("exec error is not a not-found start error: %v", execErr)
	}
	for name, msg := range map[string]string{"stat": statErr.Error(), "exec": se.Reason} {
		if !strings.Contains(msg, `gone\x1b[2J`) {
			t.Errorf("%s: the message is not the agent's, escaped: %q", name, msg)
		}
		if strings.ContainsAny(msg, "\x1b\r\n\a\u202e\u200b") || !utf8.ValidString(msg) {
			t.Errorf("%s: a raw control, bidi or invalid byte reached the caller: %q", name, msg)
		}
	}
}
