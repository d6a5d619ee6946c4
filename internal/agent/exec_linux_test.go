package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// execResult is everything one exec stream returned.
type execResult struct {
	pid            int32
	stdout, stderr strings.Builder
	exited         *agentv1.ExecExited
	took           time.Duration
}

// runExec runs start to the end. feed, if set, runs after `started` with
// the open stream; otherwise the request side is closed at once.
func (env *testEnv) runExec(t *testing.T, ctx context.Context, start *agentv1.ExecStart, feed func(send func(*agentv1.ExecRequest))) (*execResult, error) {
	t.Helper()
	begin := time.Now()
	stream := env.c.Exec.Exec(ctx)
	defer func() { _ = stream.CloseResponse() }()
	send := func(m *agentv1.ExecRequest) {
		if err := stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
			t.Errorf("send: %v", err)
		}
	}
	send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: start}})
	if feed == nil {
		_ = stream.CloseRequest()
	}
	res := &execResult{}
	for {
		msg, err := stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) && res.exited != nil {
				res.took = time.Since(begin)
				return res, nil
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("stream ended without exited")
			}
			return res, err
		}
		if res.exited != nil {
			t.Errorf("message after exited: %v", msg)
		}
		switch ev := msg.GetEvent().(type) {
		case *agentv1.ExecResponse_Started:
			if res.pid != 0 {
				t.Error("two started messages")
			}
			res.pid = ev.Started.GetPid()
			if feed != nil {
				go func() {
					feed(send)
					_ = stream.CloseRequest()
				}()
			}
		case *agentv1.ExecResponse_Stdout:
			if res.pid == 0 {
				t.Error("stdout before started")
			}
			if len(ev.Stdout) > outputChunk {
				t.Errorf("stdout chunk of %d bytes", len(ev.Stdout))
			}
			res.stdout.Write(ev.Stdout)
		case *agentv1.ExecResponse_Stderr:
			res.stderr.Write(ev.Stderr)
		case *agentv1.ExecResponse_Exited:
			res.exited = ev.Exited
		}
	}
}

func sh(script string) *agentv1.ExecStart {
	return &agentv1.ExecStart{Argv: []string{"sh", "-c", script}}
}

func mustExec(t *testing.T, env *testEnv, start *agentv1.ExecStart, feed func(func(*agentv1.ExecRequest))) *execResult {
	t.Helper()
	res, err := env.runExec(t, t.Context(), start, feed)
	if err != nil {
		t.Fatalf("exec %q: %v", start.GetArgv(), err)
	}
	return res
}

func TestExecExitCodeAndOutput(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	res := mustExec(t, env, sh("echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 7"), nil)
	if res.exited.GetExitCode() != 7 || res.exited.GetSignal() != 0 || res.exited.GetTimedOut() {
		t.Errorf("exited = %v", res.exited)
	}
	if res.stdout.String() != "out1\nout2\n" || res.stderr.String() != "err1\nerr2\n" {
		t.Errorf("stdout %q stderr %q", res.stdout.String(), res.stderr.String())
	}
	if res.pid <= 0 {
		t.Errorf("pid = %d", res.pid)
	}
}

func TestExecStdin(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB, more than a pipe holds
	start := &agentv1.ExecStart{Argv: []string{"cat"}, Stdin: true}
	res := mustExec(t, env, start, func(send func(*agentv1.ExecRequest)) {
		send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte("hello ")}})
		for i := 0; i < len(big); i += 256 << 10 {
			send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte(big[i : i+256<<10])}})
		}
		send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_CloseStdin{CloseStdin: true}})
	})
	if got := res.stdout.String(); got != "hello "+big {
		t.Errorf("cat returned %d bytes, want %d", len(got), len(big)+6)
	}
	if res.exited.GetExitCode() != 0 {
		t.Errorf("exited = %v", res.exited)
	}

	// Closing the request side ends stdin too.
	res = mustExec(t, env, start, func(send func(*agentv1.ExecRequest)) {
		send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte("bye")}})
	})
	if res.stdout.String() != "bye" {
		t.Errorf("stdout = %q", res.stdout.String())
	}

	// Without stdin the process reads /dev/null.
	res = mustExec(t, env, &agentv1.ExecStart{Argv: []string{"cat"}}, nil)
	if res.stdout.String() != "" || res.exited.GetExitCode() != 0 {
		t.Errorf("cat without stdin: %q %v", res.stdout.String(), res.exited)
	}
}

func TestExecSignal(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	res := mustExec(t, env, &agentv1.ExecStart{Argv: []string{"sleep", "60"}, Stdin: true}, func(send func(*agentv1.ExecRequest)) {
		send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Signal{Signal: int32(syscall.SIGTERM)}})
	})
	if res.exited.GetExitCode() != -1 || res.exited.GetSignal() != int32(syscall.SIGTERM) {
		t.Errorf("exited = %v", res.exited)
	}
}

func TestExecTimeout(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	res := mustExec(t, env, &agentv1.ExecStart{Argv: []string{"sleep", "60"}, TimeoutMs: 200}, nil)
	if !res.exited.GetTimedOut() || res.exited.GetSignal() != int32(syscall.SIGKILL) || res.exited.GetExitCode() != -1 {
		t.Errorf("exited = %v", res.exited)
	}
	if res.took > 3*time.Second {
		t.Errorf("timeout took %v", res.took)
	}
	if d := res.exited.GetDurationMs(); d < 200 || d > 3000 {
		t.Errorf("duration_ms = %d", d)
	}
}

func TestExecOutputCap(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	start := sh("head -c 1000000 /dev/zero; echo done >&2")
	start.MaxOutputBytes = 1000
	res := mustExec(t, env, start, nil)
	if res.stdout.Len() != 1000 || res.stderr.Len() != 0 || !res.exited.GetOutputTruncated() || res.exited.GetExitCode() != 0 {
		t.Errorf("stdout %d bytes, stderr %q, exited %v", res.stdout.Len(), res.stderr.String(), res.exited)
	}
	start.MaxOutputBytes = 0 // default cap: nothing dropped
	res = mustExec(t, env, start, nil)
	if res.stdout.Len() != 1000000 || res.stderr.String() != "done\n" || res.exited.GetOutputTruncated() {
		t.Errorf("stdout %d bytes, stderr %q, exited %v", res.stdout.Len(), res.stderr.String(), res.exited)
	}
}

func TestExecEnvCwdPath(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	dir := t.TempDir()
	start := sh(`echo "$FOO|$HOME|$LANG|$USER"; pwd`)
	start.Env = []string{"FOO=bar", "LANG=en_US.UTF-8", "FOO=baz"}
	start.Cwd = dir
	res := mustExec(t, env, start, nil)
	if want := "baz|/root|en_US.UTF-8|root\n" + dir + "\n"; res.stdout.String() != want {
		t.Errorf("stdout = %q, want %q", res.stdout.String(), want)
	}

	// argv[0] is looked up in the PATH of the resulting environment.
	writeFile(t, filepath.Join(dir, "hello"), "#!/bin/sh\necho hello from $0\n")
	if err := os.Chmod(filepath.Join(dir, "hello"), 0o755); err != nil {
		t.Fatal(err)
	}
	res = mustExec(t, env, &agentv1.ExecStart{Argv: []string{"hello"}, Env: []string{"PATH=/nonexistent:" + dir}}, nil)
	if want := "hello from " + filepath.Join(dir, "hello") + "\n"; res.stdout.String() != want {
		t.Errorf("stdout = %q, want %q", res.stdout.String(), want)
	}
	_, err := env.runExec(t, t.Context(), &agentv1.ExecStart{Argv: []string{"hello"}}, nil)
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("exec of a name not in PATH: %v, want NotFound", err)
	}
}

func TestExecRejects(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	for name, tc := range map[string]struct {
		start *agentv1.ExecStart
		code  connect.Code
	}{
		"no argv":         {&agentv1.ExecStart{}, connect.CodeInvalidArgument},
		"empty argv0":     {&agentv1.ExecStart{Argv: []string{""}}, connect.CodeInvalidArgument},
		"NUL in argv":     {&agentv1.ExecStart{Argv: []string{"echo", "a\x00b"}}, connect.CodeInvalidArgument},
		"huge arg":        {&agentv1.ExecStart{Argv: []string{"echo", strings.Repeat("x", 128<<10)}}, connect.CodeInvalidArgument},
		"huge argv":       {&agentv1.ExecStart{Argv: append([]string{"echo"}, make9(100<<10, 11)...)}, connect.CodeInvalidArgument},
		"env without =":   {&agentv1.ExecStart{Argv: []string{"true"}, Env: []string{"FOO"}}, connect.CodeInvalidArgument},
		"env bad key":     {&agentv1.ExecStart{Argv: []string{"true"}, Env: []string{"1FOO=x"}}, connect.CodeInvalidArgument},
		"env empty key":   {&agentv1.ExecStart{Argv: []string{"true"}, Env: []string{"=x"}}, connect.CodeInvalidArgument},
		"env NUL":         {&agentv1.ExecStart{Argv: []string{"true"}, Env: []string{"A=b\x00c"}}, connect.CodeInvalidArgument},
		"relative cwd":    {&agentv1.ExecStart{Argv: []string{"true"}, Cwd: "tmp"}, connect.CodeInvalidArgument},
		"unclean cwd":     {&agentv1.ExecStart{Argv: []string{"true"}, Cwd: "/tmp/../etc"}, connect.CodeInvalidArgument},
		"missing cwd":     {&agentv1.ExecStart{Argv: []string{"true"}, Cwd: "/nonexistent-dir"}, connect.CodeNotFound},
		"unknown user":    {&agentv1.ExecStart{Argv: []string{"true"}, User: "mallory"}, connect.CodeNotFound},
		"unknown group":   {&agentv1.ExecStart{Argv: []string{"true"}, User: "alice:nogroup"}, connect.CodeNotFound},
		"missing program": {&agentv1.ExecStart{Argv: []string{"/nonexistent/prog"}}, connect.CodeNotFound},
	} {
		_, err := env.runExec(t, t.Context(), tc.start, nil)
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: err = %v, want %v", name, err, tc.code)
		}
	}

	// The first message must be start.
	stream := env.c.Exec.Exec(t.Context())
	_ = stream.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte("x")}})
	_ = stream.CloseRequest()
	if _, err := stream.Receive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("stdin first: err = %v, want InvalidArgument", err)
	}
	_ = stream.CloseResponse()
}

// make9 returns n strings of size bytes.
func make9(size, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strings.Repeat("9", size)
	}
	return out
}

func TestExecBackgroundChildDoesNotHoldExit(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	res := mustExec(t, env, sh("sleep 2 & echo hi"), nil)
	if res.stdout.String() != "hi\n" || res.exited.GetExitCode() != 0 {
		t.Errorf("stdout %q exited %v", res.stdout.String(), res.exited)
	}
	if res.took > 1500*time.Millisecond {
		t.Errorf("exec took %v: the background child held it", res.took)
	}
}

func TestExecCancelKillsProcess(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	stream := env.c.Exec.Exec(ctx)
	_ = stream.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{Argv: []string{"sleep", "60"}}}})
	msg, err := stream.Receive()
	if err != nil {
		t.Fatal(err)
	}
	pid := int(msg.GetStarted().GetPid())
	if pid <= 0 {
		t.Fatalf("first message %v", msg)
	}
	cancel()
	_ = stream.CloseResponse()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil { // gone once killed and reaped
		if time.Now().After(deadline) {
			t.Fatal("process still alive after the stream was cancelled")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecUser(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t) // changing user needs root
	env := newTestEnv(t)
	res := mustExec(t, env, &agentv1.ExecStart{Argv: []string{"sh", "-c", `echo $(id -u) $(id -g) $(id -G) $HOME $USER; pwd`}, User: "alice"}, nil)
	if want := "1234 1234 1234 50 " + filepath.Join(env.dir, "alice") + " alice\n/\n"; res.stdout.String() != want {
		t.Errorf("stdout = %q, want %q", res.stdout.String(), want)
	}
	res = mustExec(t, env, &agentv1.ExecStart{Argv: []string{"sh", "-c", `echo $(id -u) $(id -g) $(id -G)`}, User: "4321:staff"}, nil)
	if res.stdout.String() != "4321 50 50\n" {
		t.Errorf("stdout = %q", res.stdout.String())
	}
}

func TestExecConcurrent(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			res, err := env.runExec(t, t.Context(), sh("exit "+string(rune('0'+i))), nil)
			if err == nil && res.exited.GetExitCode() != int32(i) {
				err = errors.New("wrong exit code")
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// TestExecTTY: an exec on a terminal has it as stdin, stdout, stderr and
// controlling terminal, of the size asked; typed input is echoed; resizes
// reach it; the exit is reported as for pipes.
func TestExecTTY(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream := env.c.Exec.Exec(ctx)
	defer func() { _ = stream.CloseResponse() }()
	send := func(m *agentv1.ExecRequest) {
		if err := stream.Send(m); err != nil {
			t.Fatalf("send: %v", err)
		}
	}
	script := `tty; echo "size $(stty size)"; [ -t 2 ] && echo "stderr is a tty"; echo "TERM=$TERM"; read line; echo "got:$line"; echo "size $(stty size)"; exit 3`
	send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{
		Argv: []string{"sh", "-c", script}, Tty: &agentv1.TerminalSize{Rows: 24, Cols: 80},
	}}})
	var out strings.Builder
	var exited *agentv1.ExecExited
	typed := false
	for exited == nil {
		msg, err := stream.Receive()
		if err != nil {
			t.Fatalf("receive: %v (output so far %q)", err, out.String())
		}
		switch ev := msg.GetEvent().(type) {
		case *agentv1.ExecResponse_Stdout:
			out.Write(ev.Stdout)
		case *agentv1.ExecResponse_Stderr:
			t.Errorf("stderr on a terminal: %q", ev.Stderr)
		case *agentv1.ExecResponse_Exited:
			exited = ev.Exited
		}
		// Once the shell waits for its line: resize, then type it.
		if !typed && strings.Contains(out.String(), "TERM=") {
			typed = true
			send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Resize{Resize: &agentv1.TerminalSize{Rows: 40, Cols: 120}}})
			send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte("hello\n")}})
		}
	}
	got := strings.ReplaceAll(out.String(), "\r\n", "\n") // the terminal's output processing
	for _, want := range []string{"/dev/pts/", "size 24 80\n", "stderr is a tty\n", "TERM=xterm-256color\n", "hello\n", "got:hello\n", "size 40 120\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal output lacks %q:\n%s", want, got)
		}
	}
	if exited.GetExitCode() != 3 {
		t.Errorf("exited = %v", exited)
	}
	// A size of 0 is refused before anything runs.
	res, err := env.runExec(t, t.Context(), &agentv1.ExecStart{Argv: []string{"true"}, Tty: &agentv1.TerminalSize{Rows: 0, Cols: 80}}, nil)
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("tty of 0 rows: %v %v", res, err)
	}
}
