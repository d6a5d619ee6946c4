package fake_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
)

var ids atomic.Int64

func spec(t *testing.T) runtime.Spec {
	return runtime.Spec{
		ID:        fmt.Sprintf("fake-%d", ids.Add(1)),
		CPUs:      1,
		MemoryMiB: 256,
		Kernel:    "/k",
		Initrd:    "/i",
		RootDisk:  "/d",
		RunDir:    t.TempDir(),
	}
}

func TestConformance(t *testing.T) {
	rt := fake.New()
	rt.SetStartHook(func(s runtime.Spec) error {
		if s.Kernel == "/broken" {
			return errors.New("no kernel")
		}
		return nil
	})
	runtimetest.Run(t, runtimetest.Harness{
		Runtime: rt,
		Spec:    spec,
		CloneSpec: func(t *testing.T, tmpl runtime.Spec, dir string) runtime.Spec {
			s := spec(t)
			s.RestoreFrom = dir
			return s
		},
		BrokenSpec: func(t *testing.T) runtime.Spec {
			s := spec(t)
			s.Kernel = "/broken"
			return s
		},
		InUse: func(*testing.T) int { return rt.Live() },
	})
	if n := rt.Live(); n != 0 {
		t.Errorf("%d instances left", n)
	}
}

func started(t *testing.T, rt *fake.Runtime) (*fake.Instance, *agentapi.Client) {
	t.Helper()
	s := spec(t)
	in, err := rt.Create(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Kill(); _, _ = in.Wait(context.Background()) })
	conn, err := in.AgentConn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentapi.Dial(t.Context(), conn, agentapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return rt.Instance(s.ID), c
}

type execResult struct {
	code, signal int32
	timedOut     bool
	stdout       string
	stderr       string
}

func run(t *testing.T, c *agentapi.Client, ctx context.Context, stdin string, argv ...string) (execResult, error) {
	st := c.Exec.Exec(ctx)
	if err := st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{Argv: argv, Stdin: stdin != "", TimeoutMs: 200}}}); err != nil {
		return execResult{}, err
	}
	if stdin != "" {
		_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte(stdin)}})
		_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_CloseStdin{CloseStdin: true}})
	}
	var r execResult
	for {
		resp, err := st.Receive()
		if errors.Is(err, io.EOF) {
			return r, nil
		}
		if err != nil {
			return r, err
		}
		switch e := resp.GetEvent().(type) {
		case *agentv1.ExecResponse_Stdout:
			r.stdout += string(e.Stdout)
		case *agentv1.ExecResponse_Stderr:
			r.stderr += string(e.Stderr)
		case *agentv1.ExecResponse_Exited:
			r.code, r.signal, r.timedOut = e.Exited.ExitCode, e.Exited.Signal, e.Exited.TimedOut
		}
	}
}

func TestExec(t *testing.T) {
	_, c := started(t, fake.New())
	cases := []struct {
		stdin string
		argv  []string
		want  execResult
	}{
		{"", []string{"true"}, execResult{}},
		{"", []string{"false"}, execResult{code: 1}},
		{"", []string{"echo", "hello", "world"}, execResult{stdout: "hello world\n"}},
		{"", []string{"exit", "7"}, execResult{code: 7}},
		{"", []string{"sh", "-c", "exit 3"}, execResult{code: 3}},
		{"abc", []string{"cat"}, execResult{stdout: "abc"}},
		{"", []string{"sleep", "0.01"}, execResult{}},
		{"", []string{"sleep", "10"}, execResult{code: -1, signal: 9, timedOut: true}},
		{"", []string{"sh", "-c", "nope"}, execResult{code: 127, stderr: "fake: nope: command not found\n"}},
		{"", []string{"printf", `a\tb%s\n%%\\`, "c"}, execResult{stdout: "a\tbc\n%\\"}},
		{"", []string{"sh", "-c", "printf o; printf 'e 1' >&2; nope; echo  two  words; exit 3; echo never"},
			execResult{stdout: "otwo words\n", stderr: "e 1fake: nope: command not found\n", code: 3}},
		{"", []string{"sh", "-c", "true; false"}, execResult{code: 1}},
		{"", []string{"sh", "-c", "echo x; kill -15 $$; echo never"}, execResult{stdout: "x\n", code: -1, signal: 15}},
		{"", []string{"sh", "-c", "kill 1"}, execResult{code: 1, stderr: "fake: kill: only kill -N $$ is supported\n"}},
		{"", []string{"cat", "/tmp/nope", "/tmp"}, execResult{code: 1, stderr: "cat: /tmp/nope: No such file or directory\ncat: /tmp: Is a directory\n"}},
	}
	for _, tc := range cases {
		got, err := run(t, c, t.Context(), tc.stdin, tc.argv...)
		if err != nil || got != tc.want {
			t.Errorf("%v: %+v, %v; want %+v", tc.argv, got, err, tc.want)
		}
	}
	// Cancelling the stream ends a sleep.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	st := c.Exec.Exec(ctx)
	_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{Argv: []string{"sleep", "10"}}}})
	for {
		if _, err := st.Receive(); err != nil {
			break
		}
	}
	if time.Since(t0) > 5*time.Second {
		t.Error("cancel did not end sleep")
	}
}

func TestFilesAndCrash(t *testing.T) {
	rt := fake.New()
	in, c := started(t, rt)
	ctx := t.Context()
	if _, err := c.Files.Mkdir(ctx, connect.NewRequest(&agentv1.MkdirRequest{Path: "/a/b", Parents: true})); err != nil {
		t.Fatal(err)
	}
	ws := c.Files.Write(ctx)
	_ = ws.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{Path: "/a/b/f"}}})
	_ = ws.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: []byte("data")}})
	if _, err := ws.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	st, err := c.Files.Stat(ctx, connect.NewRequest(&agentv1.StatRequest{Path: "/a/b/f"}))
	if err != nil || st.Msg.GetInfo().GetSize() != 4 || st.Msg.GetInfo().GetMode() != 0o644 {
		t.Fatalf("stat: %v %v", st, err)
	}
	if got, err := run(t, c, ctx, "", "cat", "/a/b/f", "/a/b/f"); err != nil || got != (execResult{stdout: "datadata"}) {
		t.Fatalf("cat a file twice: %+v, %v", got, err)
	}
	ls, err := c.Files.List(ctx, connect.NewRequest(&agentv1.ListRequest{Path: "/a", Depth: 2}))
	if err != nil || len(ls.Msg.GetEntries()) != 2 {
		t.Fatalf("list: %v %v", ls, err)
	}
	if _, err := c.Files.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: "/a"})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("remove non-empty: %v", err)
	}
	if _, err := c.Files.Remove(ctx, connect.NewRequest(&agentv1.RemoveRequest{Path: "/a", Recursive: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Files.Stat(ctx, connect.NewRequest(&agentv1.StatRequest{Path: "/a/b/f"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat after remove: %v", err)
	}

	in.Crash("guest Kernel panic - not syncing: test")
	es, err := in.Wait(ctx)
	if err != nil || es.Requested || !strings.Contains(es.Reason, "panic") {
		t.Fatalf("wait = %+v, %v", es, err)
	}
	if _, err := c.Agent.Info(ctx, connect.NewRequest(&agentv1.InfoRequest{})); err == nil {
		t.Fatal("agent answered after the crash")
	}
}

func TestShutdownPowersOff(t *testing.T) {
	rt := fake.New()
	in, c := started(t, rt)
	if _, err := c.Agent.Shutdown(t.Context(), connect.NewRequest(&agentv1.ShutdownRequest{Poweroff: true})); err != nil {
		t.Fatal(err)
	}
	es, err := in.Wait(t.Context())
	if err != nil || es.Requested || es.Reason != "guest powered off" {
		t.Fatalf("wait = %+v, %v", es, err)
	}
}

func TestSaveState(t *testing.T) {
	rt := fake.New()
	in, c := started(t, rt)
	write := func(c *agentapi.Client, path string) {
		t.Helper()
		st := c.Files.Write(t.Context())
		_ = st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{Path: path, Mode: 0o644}}})
		_ = st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: []byte("x")}})
		if _, err := st.CloseAndReceive(); err != nil {
			t.Fatalf("write %s: %v", path, err)
		}
	}
	exists := func(c *agentapi.Client, path string) bool {
		t.Helper()
		_, err := c.Files.Stat(t.Context(), connect.NewRequest(&agentv1.StatRequest{Path: path}))
		return err == nil
	}
	dial := func(in runtime.Instance) *agentapi.Client {
		t.Helper()
		conn, err := in.AgentConn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		c, err := agentapi.Dial(t.Context(), conn, agentapi.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	write(c, "/before")
	c.Close()

	if err := in.SaveState(t.Context(), t.TempDir(), runtime.SaveOptions{KeepRunning: true}); err == nil {
		t.Fatal("KeepRunning without NewRootDisk accepted")
	}
	live := t.TempDir()
	if err := in.SaveState(t.Context(), live, runtime.SaveOptions{KeepRunning: true, NewRootDisk: "/d2"}); err != nil {
		t.Fatal(err)
	}
	c = dial(in) // a new channel after a live snapshot
	write(c, "/after")
	c.Close()
	paused := t.TempDir()
	if err := in.SaveState(t.Context(), paused, runtime.SaveOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, _ := in.Wait(t.Context()); !st.Requested {
		t.Errorf("exit after pause: %+v", st)
	}
	if n := len(in.Saves()); n != 2 {
		t.Errorf("%d saves recorded", n)
	}

	for _, tc := range []struct {
		dir           string
		snapshottable bool
		after         bool
	}{{live, true, false}, {paused, false, true}} {
		s := spec(t)
		s.RestoreFrom, s.Snapshottable = tc.dir, tc.snapshottable
		r, err := rt.Create(t.Context(), s)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		rc := dial(r)
		if !exists(rc, "/before") || exists(rc, "/after") != tc.after {
			t.Errorf("restore of %s: wrong files", tc.dir)
		}
		_ = r.Kill()
		_, _ = r.Wait(t.Context())
	}
}
