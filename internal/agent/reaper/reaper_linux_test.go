package reaper

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func startSh(t *testing.T, r *Reaper, script string, stdout *os.File) (int, <-chan syscall.WaitStatus) {
	t.Helper()
	files := []uintptr{0, 1, 2}
	if stdout != nil {
		files[1] = stdout.Fd()
	}
	pid, done, err := r.Start(func() (int, error) {
		return syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{Files: files, Sys: &syscall.SysProcAttr{Setsid: true}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return pid, done
}

func wait(t *testing.T, done <-chan syscall.WaitStatus) syscall.WaitStatus {
	t.Helper()
	select {
	case ws, ok := <-done:
		if !ok {
			t.Fatal("status lost")
		}
		return ws
	case <-time.After(10 * time.Second):
		t.Fatal("no exit status")
	}
	panic("unreachable")
}

func testReaper(t *testing.T, all bool) {
	r := New(Options{All: all})
	defer r.Close()

	// A child that exits at once is still delivered (registered under the
	// mutex before it can be reaped).
	for range 20 {
		_, done := startSh(t, r, "exit 3", nil)
		if ws := wait(t, done); ws.ExitStatus() != 3 {
			t.Fatalf("status = %v", ws)
		}
	}

	pid, done := startSh(t, r, "sleep 60", nil)
	if err := r.Signal(pid, syscall.SIGTERM, true); err != nil {
		t.Fatal(err)
	}
	if ws := wait(t, done); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("status = %v", ws)
	}
	if err := r.Signal(pid, syscall.SIGTERM, true); !errors.Is(err, ErrExited) {
		t.Fatalf("signal after exit: %v, want ErrExited", err)
	}
}

func TestReaperHostMode(t *testing.T) {
	t.Parallel()
	testReaper(t, false)
}

// TestReaperAllMode runs the PID 1 mode in the test process, which has no
// other children. As a child subreaper it also adopts orphans, like PID 1.
func TestReaperAllMode(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal("no child subreaper (Linux has had PR_SET_CHILD_SUBREAPER since 3.4):", err)
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) }()
	testReaper(t, true)

	r := New(Options{All: true})
	defer r.Close()
	// An orphan (the background sleep) is re-parented to us and reaped
	// although nobody registered it.
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	_, done := startSh(t, r, "sleep 0.2 & echo $!", wr)
	wr.Close()
	wait(t, done)
	b := make([]byte, 32)
	n, _ := rd.Read(b)
	orphan, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(orphan) + "/stat")
		if err != nil {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped: %s", orphan, stat)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
