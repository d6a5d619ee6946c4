package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor/monitor/monitortest"
)

func TestInitConfig(t *testing.T) {
	t.Parallel()
	b, err := InitConfig("/run/x/sink.sock")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		TraceSession struct {
			Name   string
			Points []struct {
				Name          string
				ContextFields []string `json:"context_fields"`
			}
			Sinks []struct {
				Name   string
				Config map[string]any
			}
		} `json:"trace_session"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	s := c.TraceSession
	var names []string
	for _, p := range s.Points {
		names = append(names, p.Name)
		if p.Name == "sentry/execve" && !slices.Contains(p.ContextFields, "cwd") {
			t.Errorf("execve without cwd: %v", p.ContextFields)
		}
	}
	if s.Name != "Default" || !slices.Equal(names, []string{"container/start", "sentry/execve", "sentry/exit_notify_parent"}) ||
		len(s.Sinks) != 1 || s.Sinks[0].Name != "remote" || s.Sinks[0].Config["endpoint"] != "/run/x/sink.sock" {
		t.Errorf("config: %s", b)
	}
	if _, err := InitConfig("/" + strings.Repeat("d", 120)); err == nil {
		t.Error("a socket path longer than sockaddr_un took")
	}
}

// sink listens in a temporary directory and accepts the test process.
func sink(t *testing.T) (string, chan *Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *Conn, 1)
	go func() {
		c, err := ln.Accept(context.Background(), func(pid int) bool { return pid == os.Getpid() })
		if err != nil {
			t.Error(err)
		}
		ch <- c
	}()
	return path, ch
}

// TestConnDecodesTheSentrysPoints: real points behind gVisor's header
// become events; exits only of processes seen exec'ing; the Sentry's drop
// count and malformed messages are lost events; the environment is not
// kept; a closed connection is io.EOF.
func TestConnDecodesTheSentrysPoints(t *testing.T) {
	t.Parallel()
	path, ch := sink(t)
	s, err := monitortest.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := <-ch
	if c == nil {
		t.FailNow()
	}
	defer c.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket file is still there after the accept: %v", err)
	}
	// No container/start: the session is not live.
	if err := c.WaitStarted(time.Now().Add(50 * time.Millisecond)); err == nil {
		t.Fatal("started without container/start")
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Start())
	must(c.WaitStarted(time.Now().Add(10 * time.Second)))
	at := time.Date(2026, 11, 26, 15, 0, 0, 0, time.UTC)
	must(s.Exec(monitortest.Exec{PID: 7, PPID: 1, UID: 1000, EUID: 0, Path: "/usr/bin/python3.11", Cwd: "/root",
		Argv: []string{"python3", "-c", "x"}, Env: []string{"TOKEN=secret-value"}, TimeNs: at.UnixNano()}))
	must(s.Clone(8))
	must(s.Exit(8, 0)) // never exec'd: not reported
	must(s.Exec(monitortest.Exec{PID: 9, PPID: 7, Path: "/usr/bin/id", Argv: []string{"id"}}))
	must(s.Exit(9, 3<<8))
	must(s.Exit(7, 9)) // SIGKILL
	s.Dropped = 5
	must(s.Write([]byte{1, 2, 3}))                            // malformed: lost
	must(s.Write([]byte{8, 0, 3, 0, 5, 0, 0, 0, 0xff, 0xff})) // a bad protobuf: lost
	must(s.Exec(monitortest.Exec{PID: 10, PPID: 9, Path: "/bin/x"}))
	s.Dropped = 2 // wrapped past 2^32 since: 2^32 - 5 + 2 lost
	must(s.Exec(monitortest.Exec{PID: 11, PPID: 9, Path: "/bin/y"}))

	want := []struct {
		e    runtime.ProcEvent
		lost uint64
	}{
		{runtime.ProcEvent{Time: at, PID: 7, PPID: 1, UID: 1000, Path: "/usr/bin/python3.11", Cwd: "/root", Argv: []string{"python3", "-c", "x"}, Agent: true}, 0},
		{runtime.ProcEvent{PID: 9, PPID: 7, Path: "/usr/bin/id", Argv: []string{"id"}}, 0},
		{runtime.ProcEvent{Exit: true, PID: 9, Path: "/usr/bin/id", ExitCode: 3}, 0},
		{runtime.ProcEvent{Exit: true, PID: 7, Path: "/usr/bin/python3.11", Signal: 9}, 0},
		{runtime.ProcEvent{PID: 10, PPID: 9, Path: "/bin/x"}, 2 + 5},
		{runtime.ProcEvent{PID: 11, PPID: 9, Path: "/bin/y"}, 1<<32 - 5 + 2},
	}
	for i, w := range want {
		e, lost, err := c.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if e.Exit {
			e.Time = time.Time{} // (the exit's is now)
		}
		if !e.Time.Equal(w.e.Time) {
			t.Errorf("event %d at %v, want %v", i, e.Time, w.e.Time)
		}
		e.Time, w.e.Time = time.Time{}, time.Time{}
		if !equalEvent(e, w.e) || lost != w.lost {
			t.Errorf("event %d: %+v lost %d\nwant %+v lost %d", i, e, lost, w.e, w.lost)
		}
	}
	s.Close()
	if _, _, err := c.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the Sentry closed: %v, want EOF", err)
	}
}

func equalEvent(a, b runtime.ProcEvent) bool {
	return slices.Equal(a.Argv, b.Argv) && a.Exit == b.Exit && a.PID == b.PID && a.PPID == b.PPID && a.UID == b.UID && a.EUID == b.EUID &&
		a.Path == b.Path && a.Cwd == b.Cwd && a.Agent == b.Agent && a.ExitCode == b.ExitCode && a.Signal == b.Signal
}

// TestDecodeDropsTheEnvironment: an exec's environment never leaves
// decode.
func TestDecodeDropsTheEnvironment(t *testing.T) {
	t.Parallel()
	out, err := proto.Marshal(&pb.ExecveInfo{BinaryPath: "/bin/sh", Env: []string{"TOKEN=secret-value"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := decode(append([]byte{8, 0, byte(pb.MessageType_MESSAGE_SENTRY_EXEC), 0, 0, 0, 0, 0}, out...))
	if err != nil {
		t.Fatal(err)
	}
	if e := m.point.(*pb.ExecveInfo); e.GetBinaryPath() != "/bin/sh" || e.Env != nil {
		t.Errorf("decoded %v", e)
	}
}

// TestTheSentryCannotEncodeNonUTF8 records a limit of gVisor's
// monitoring that SECURITY.md states: the points are proto3 messages,
// whose encoder refuses a string that is not valid UTF-8, and the remote
// sink then sends nothing and counts no drop. An exec whose argv,
// environment, path or working directory is not UTF-8 is not reported.
func TestTheSentryCannotEncodeNonUTF8(t *testing.T) {
	t.Parallel()
	if _, err := proto.Marshal(&pb.ExecveInfo{BinaryPath: "/bin/true", Argv: []string{"true", "\xff"}}); err == nil {
		t.Error("proto3 encoded invalid UTF-8: the limit in SECURITY.md is gone; update it")
	}
}

func TestAcceptRefusesOtherProcesses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode: %v %v", fi.Mode(), err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept(ctx, func(pid int) bool { return false })
		done <- err
	}()
	if s, err := monitortest.Dial(path); err == nil {
		s.Close()
		t.Error("a process that is not runsc completed the handshake")
	}
	if err := <-done; err == nil {
		t.Error("Accept took a connection from another process")
	}
}
