package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// liveExec is an exec stream read in the background, for tests that park
// and adopt.
type liveExec struct {
	t      *testing.T
	stream interface {
		Send(*agentv1.ExecRequest) error
		CloseRequest() error
	}

	mu      sync.Mutex
	pid     int32
	stdout  strings.Builder
	stderr  strings.Builder
	exited  *agentv1.ExecExited
	parked  bool
	err     error // how the stream ended: nil for a clean end
	ended   bool
	afterEv bool // a message came after exited or parked
}

// openExec sends start on a new stream and reads it in the background.
func (env *testEnv) openExec(t *testing.T, start *agentv1.ExecStart) *liveExec {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	stream := env.c.Exec.Exec(ctx)
	l := &liveExec{t: t, stream: stream}
	if err := stream.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: start}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("send start: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msg, err := stream.Receive()
			l.mu.Lock()
			if err != nil {
				l.ended = true
				if !errors.Is(err, io.EOF) {
					l.err = err
				}
				l.mu.Unlock()
				return
			}
			if l.exited != nil || l.parked {
				l.afterEv = true
			}
			switch ev := msg.GetEvent().(type) {
			case *agentv1.ExecResponse_Started:
				l.pid = ev.Started.GetPid()
			case *agentv1.ExecResponse_Stdout:
				l.stdout.Write(ev.Stdout)
			case *agentv1.ExecResponse_Stderr:
				l.stderr.Write(ev.Stderr)
			case *agentv1.ExecResponse_Exited:
				l.exited = ev.Exited
			case *agentv1.ExecResponse_Parked:
				l.parked = true
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = stream.CloseRequest()
		<-done
		_ = stream.CloseResponse()
	})
	return l
}

func (l *liveExec) send(m *agentv1.ExecRequest) {
	l.t.Helper()
	if err := l.stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
		l.t.Errorf("send: %v", err)
	}
}

func (l *liveExec) park(token string) {
	l.t.Helper()
	l.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Park{Park: &agentv1.ExecPark{Token: token}}})
}

// waitFor waits until cond holds on l (under its lock).
func (l *liveExec) waitFor(what string, cond func(l *liveExec) bool) {
	l.t.Helper()
	if !testutil.WaitFor(l.t, 10*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return cond(l)
	}) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.t.Fatalf("waiting for %s: pid %d, stdout %q, stderr %q, exited %v, parked %v, ended %v, err %v",
			what, l.pid, l.stdout.String(), l.stderr.String(), l.exited, l.parked, l.ended, l.err)
	}
}

// waitParked waits for the parked event and a clean end of the stream.
func (l *liveExec) waitParked() {
	l.t.Helper()
	l.waitFor("parked", func(l *liveExec) bool { return l.ended })
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.parked || l.err != nil || l.exited != nil || l.afterEv {
		l.t.Fatalf("stream ended with parked %v, err %v, exited %v, messages after the end %v", l.parked, l.err, l.exited, l.afterEv)
	}
}

// waitExited waits for the exited event and a clean end of the stream.
func (l *liveExec) waitExited() *agentv1.ExecExited {
	l.t.Helper()
	l.waitFor("exited", func(l *liveExec) bool { return l.ended })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.exited == nil || l.err != nil || l.parked || l.afterEv {
		l.t.Fatalf("stream ended with exited %v, err %v, parked %v, messages after the end %v", l.exited, l.err, l.parked, l.afterEv)
	}
	return l.exited
}

// waitErr waits for the stream to fail and returns its error.
func (l *liveExec) waitErr() error {
	l.t.Helper()
	l.waitFor("an error", func(l *liveExec) bool { return l.ended })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.t.Fatalf("stream ended cleanly (exited %v, parked %v), want an error", l.exited, l.parked)
	}
	return l.err
}

func (l *liveExec) out() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stdout.String()
}

func adoptStart(token string) *agentv1.ExecStart { return &agentv1.ExecStart{Adopt: token} }

func (env *testEnv) listParked(t *testing.T) []*agentv1.ParkedExec {
	t.Helper()
	execs, err := env.c.ListParked(t.Context())
	if err != nil {
		t.Fatalf("list parked: %v", err)
	}
	return execs
}

// alive says whether pid exists (a zombie counts until it is reaped).
func alive(pid int32) bool { return syscall.Kill(int(pid), 0) == nil }

// A parked exec keeps running with stdin open and its output held in the
// pipe; the adopter gets the same pid, every byte of output in order, stdin
// and the final status.
func TestExecParkAndAdopt(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	// Prints a line, waits for one on stdin, then prints far more than a
	// pipe holds and exits 3.
	script := `echo ready; read line; echo "got:$line"; seq 1 100000; exit 3`
	start := &agentv1.ExecStart{Argv: []string{"sh", "-c", script}, Stdin: true, TimeoutMs: 60_000, MaxOutputBytes: 10 << 20}
	first := env.openExec(t, start)
	first.waitFor("ready", func(l *liveExec) bool { return strings.Contains(l.stdout.String(), "ready\n") })
	first.park("exec-1")
	first.waitParked()

	parked := env.listParked(t)
	if len(parked) != 1 {
		t.Fatalf("parked = %v, want one", parked)
	}
	p := parked[0]
	if p.GetToken() != "exec-1" || p.GetPid() != first.pid || !slices.Equal(p.GetArgv(), start.GetArgv()) ||
		p.GetTty() || !p.GetStdin() || p.GetExited() || p.GetStartUnixMs() <= 0 ||
		p.GetTimeoutLeftMs() == 0 || p.GetTimeoutLeftMs() > 60_000 {
		t.Errorf("parked exec = %v (pid %d)", p, first.pid)
	}
	if !alive(first.pid) {
		t.Fatal("the parked process is gone")
	}

	second := env.openExec(t, adoptStart("exec-1"))
	second.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	if second.pid != first.pid {
		t.Errorf("adopted pid %d, parked %d", second.pid, first.pid)
	}
	second.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte("hello\n")}})
	exited := second.waitExited()
	if exited.GetExitCode() != 3 || exited.GetOutputTruncated() || exited.GetTimedOut() {
		t.Errorf("exited = %v", exited)
	}
	var want strings.Builder
	want.WriteString("ready\ngot:hello\n")
	for i := 1; i <= 100000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := first.out() + second.out(); got != want.String() {
		t.Errorf("output across the park: %d bytes, want %d (first %q..., second %.40q...)", len(got), want.Len(), first.out(), second.out())
	}
	if left := env.listParked(t); len(left) != 0 {
		t.Errorf("parked after adoption = %v", left)
	}
	// A token is adopted once.
	again := env.openExec(t, adoptStart("exec-1"))
	if err := again.waitErr(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("second adoption: %v, want not_found", err)
	}
}

// Output produced while the stream is being parked is not lost, and an
// adopted exec can be parked again. The writer counts until the test
// creates its stop file, so it cannot finish before the third park however
// fast the machine is.
func TestExecParkWhileWriting(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	stop := filepath.Join(env.dir, "stop")
	start := &agentv1.ExecStart{
		Argv:           []string{"sh", "-c", `i=0; while [ ! -e "$1" ]; do i=$((i+1)); echo $i; done; echo end`, "sh", stop},
		MaxOutputBytes: 64 << 20,
	}
	var outs []string
	l := env.openExec(t, start)
	pid := int32(0)
	for i := range 3 {
		l.waitFor("output", func(l *liveExec) bool { return l.stdout.Len() > 0 || l.ended })
		if i == 0 {
			pid = l.pid
		}
		token := fmt.Sprintf("again-%d", i)
		l.park(token)
		l.mu.Lock()
		done := l.ended
		l.mu.Unlock()
		if done {
			t.Fatalf("the writer ended before park %d", i)
		}
		l.waitParked()
		outs = append(outs, l.out())
		l = env.openExec(t, adoptStart(token))
		l.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
		if l.pid != pid {
			t.Errorf("adoption %d: pid %d, want %d", i, l.pid, pid)
		}
	}
	l.waitFor("output after the last adoption", func(l *liveExec) bool { return l.stdout.Len() > 0 || l.ended })
	writeFile(t, stop, "")
	ex := l.waitExited()
	if ex.GetExitCode() != 0 || ex.GetOutputTruncated() {
		t.Errorf("exited = %v", ex)
	}
	outs = append(outs, l.out())
	got := strings.Join(outs, "")
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if len(lines) < 4 || lines[len(lines)-1] != "end" {
		t.Fatalf("output across three parks: %d lines, ending %q", len(lines), lines[len(lines)-1])
	}
	for i, line := range lines[:len(lines)-1] {
		if line != fmt.Sprint(i+1) {
			t.Fatalf("output across three parks: line %d is %q, want %d (a gap or a repeat)", i+1, line, i+1)
		}
	}
	for i, o := range outs {
		if o == "" {
			t.Errorf("stream %d carried no output", i)
		}
	}
}

// An exec that ends while parked delivers its output and status on adoption;
// its timeout stops while it is parked and the rest applies after.
func TestExecParkedExitAndTimeout(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	// quick ends once the test creates its file, which it does while quick
	// is parked.
	flag := filepath.Join(env.dir, "go")
	quick := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sh", "-c", `echo hi; while [ ! -e "$1" ]; do sleep 0.01; done; echo bye; exit 5`, "sh", flag}})
	quick.waitFor("hi", func(l *liveExec) bool { return l.stdout.String() == "hi\n" })
	quick.park("quick")
	quick.waitParked()

	slow := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sleep", "1000"}, TimeoutMs: 1500})
	slow.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	slow.park("slow")
	slow.waitParked()

	// An adopted exec parks again.
	q2 := env.openExec(t, adoptStart("quick"))
	q2.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	q2.park("quick")
	q2.waitParked()
	writeFile(t, flag, "")
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		for _, p := range env.listParked(t) {
			if p.GetToken() == "quick" {
				return p.GetExited()
			}
		}
		return false
	}) {
		t.Fatalf("the parked exec did not end: %v", env.listParked(t))
	}
	q3 := env.openExec(t, adoptStart("quick"))
	if ex := q3.waitExited(); ex.GetExitCode() != 5 {
		t.Errorf("exited = %v", ex)
	}
	if got := quick.out() + q2.out() + q3.out(); got != "hi\nbye\n" {
		t.Errorf("output = %q", got)
	}

	var left uint32
	for _, p := range env.listParked(t) {
		if p.GetToken() == "slow" {
			left = p.GetTimeoutLeftMs()
		}
	}
	if left == 0 || left > 1500 {
		t.Fatalf("slow's timeout left = %d ms, want 1..1500", left)
	}
	s2 := env.openExec(t, adoptStart("slow"))
	ex := s2.waitExited()
	if !ex.GetTimedOut() || ex.GetSignal() != int32(syscall.SIGKILL) {
		t.Errorf("exited = %v, want timed out", ex)
	}
}

// A terminal exec parks and is adopted with its terminal.
func TestExecParkTerminal(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	l := env.openExec(t, &agentv1.ExecStart{
		Argv: []string{"sh", "-c", `echo ready; read line; echo "got:$line"; exit 4`},
		Tty:  &agentv1.TerminalSize{Rows: 24, Cols: 80},
	})
	l.waitFor("ready", func(l *liveExec) bool { return strings.Contains(l.stdout.String(), "ready") })
	l.park("term")
	l.waitParked()
	if p := env.listParked(t); len(p) != 1 || !p[0].GetTty() || !p[0].GetStdin() {
		t.Fatalf("parked = %v", p)
	}
	a := env.openExec(t, adoptStart("term"))
	a.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	a.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Resize{Resize: &agentv1.TerminalSize{Rows: 30, Cols: 100}}})
	a.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte("hi\n")}})
	if ex := a.waitExited(); ex.GetExitCode() != 4 {
		t.Errorf("exited = %v", ex)
	}
	if !strings.Contains(a.out(), "got:hi") {
		t.Errorf("adopted output = %q", a.out())
	}
}

// A parked exec nobody adopts is killed after the expiry.
func TestExecParkExpiry(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t, func(o *Options) { o.parkExpiry = 200 * time.Millisecond })
	l := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sleep", "1000"}})
	l.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	l.park("forgotten")
	l.waitParked()
	if !testutil.WaitFor(t, 10*time.Second, func() bool { return len(env.listParked(t)) == 0 && !alive(l.pid) }) {
		t.Fatalf("still parked %v, alive %v", env.listParked(t), alive(l.pid))
	}
	a := env.openExec(t, adoptStart("forgotten"))
	if err := a.waitErr(); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("adopt after expiry: %v, want not_found", err)
	}
}

// Bad park tokens and adopting starts are refused; a refused park kills
// the exec as a cancel would.
func TestExecParkRefusals(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	for _, tc := range []struct {
		name  string
		token string
		code  connect.Code
	}{
		{"empty", "", connect.CodeInvalidArgument},
		{"long", strings.Repeat("x", maxParkToken+1), connect.CodeInvalidArgument},
	} {
		l := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sleep", "1000"}})
		l.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
		l.park(tc.token)
		if err := l.waitErr(); connect.CodeOf(err) != tc.code {
			t.Errorf("%s token: %v, want %v", tc.name, err, tc.code)
		}
		if !testutil.WaitFor(t, 10*time.Second, func() bool { return !alive(l.pid) }) {
			t.Errorf("%s token: the process survived a refused park", tc.name)
		}
	}

	first := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sleep", "1000"}})
	first.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	first.park("dup")
	first.waitParked()
	second := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sleep", "1000"}})
	second.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	second.park("dup")
	if err := second.waitErr(); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("duplicate token: %v, want already_exists", err)
	}
	if p := env.listParked(t); len(p) != 1 || p[0].GetPid() != first.pid {
		t.Errorf("parked = %v, want the first exec only", p)
	}

	for _, start := range []*agentv1.ExecStart{
		{Adopt: "dup", Argv: []string{"true"}},
		{Adopt: "dup", Stdin: true},
		{Adopt: "dup", TimeoutMs: 1},
	} {
		l := env.openExec(t, start)
		if err := l.waitErr(); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("adopt with %v: %v, want invalid_argument", start, err)
		}
	}
	if p := env.listParked(t); len(p) != 1 {
		t.Errorf("a refused adoption took the exec: parked = %v", p)
	}
}

// Closing the server kills the parked execs.
func TestExecParkedKilledOnClose(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	l := env.openExec(t, &agentv1.ExecStart{Argv: []string{"sleep", "1000"}})
	l.waitFor("started", func(l *liveExec) bool { return l.pid != 0 })
	l.park("left")
	l.waitParked()
	env.closeServer()
	if alive(l.pid) {
		t.Error("a parked process outlived the server")
	}
}
