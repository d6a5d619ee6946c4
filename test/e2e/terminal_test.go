package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// TestTerminalWatchRename drives a real guest agent (either runtime)
// through its shim: an exec on a terminal (its size, resize, typed input,
// exit), a recursive directory watch, and a rename.
func TestTerminalWatchRename(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	c := shimclient.New(statedir.Layout{Root: e.state}.Socket(id))
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// A terminal.
	st, err := c.Exec(ctx, guest.ExecSpec{Argv: []string{"sh", "-c", `tty; echo "size $(stty size)"; read l; echo "got:$l"; echo "size $(stty size)"; exit 4`}, TTY: &guest.TermSize{Rows: 30, Cols: 100}}, shimclient.StartOptions{KillOnDetach: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out strings.Builder
	var exit *guest.ExitStatus
	typed := false
	for exit == nil {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("terminal: %v after %q", err, out.String())
		}
		switch ev.Kind {
		case guest.ExecStdout:
			out.Write(ev.Data)
		case guest.ExecStderr:
			t.Errorf("stderr from a terminal: %q", ev.Data)
		case guest.ExecExited:
			exit = ev.Exit
		}
		// Typed once the whole line is out: typed earlier, the
		// terminal's echo of it can land before the line's end.
		if !typed && strings.Contains(strings.ReplaceAll(out.String(), "\r", ""), "size 30 100\n") {
			typed = true
			if err := st.Resize(guest.TermSize{Rows: 50, Cols: 132}); err != nil {
				t.Fatal(err)
			}
			if err := st.Stdin([]byte("typed\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := strings.ReplaceAll(out.String(), "\r\n", "\n")
	for _, want := range []string{"/dev/pts/", "size 30 100\n", "got:typed\n", "size 50 132\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("terminal output lacks %q:\n%s", want, got)
		}
	}
	if exit.Code != 4 {
		t.Errorf("exit %+v", exit)
	}
	if info := st.Info(); !info.TTY {
		t.Errorf("exec info %+v does not say tty", info)
	}

	// A recursive watch, then a rename it sees.
	if err := c.Mkdir(ctx, "/tmp/w", true, 0o755); err != nil {
		t.Fatal(err)
	}
	events := make(chan guest.FileEvent, 64)
	started := make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	werr := make(chan error, 1)
	go func() {
		werr <- c.Watch(wctx, "/tmp/w", true, func() { close(started) }, func(ev guest.FileEvent) error { events <- ev; return nil })
	}()
	select {
	case <-started:
	case err := <-werr:
		t.Fatalf("watch: %v", err)
	}
	if _, err := c.WriteFile(ctx, "/tmp/w/sub/a.txt", 0o644, strings.NewReader("a")); err != nil {
		t.Fatal(err)
	}
	if err := c.Rename(ctx, "/tmp/w/sub/a.txt", "/tmp/w/b.txt"); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"create sub": false, "create sub/a.txt": false, "rename sub/a.txt": false, "create b.txt": false}
	ops := map[guest.FileOp]string{guest.OpCreate: "create", guest.OpWrite: "write", guest.OpRemove: "remove", guest.OpRename: "rename", guest.OpChmod: "chmod"}
	var seen []string
	for left := len(want); left > 0; {
		select {
		case ev := <-events:
			k := ops[ev.Op] + " " + ev.Name
			seen = append(seen, k)
			if done, ok := want[k]; ok && !done {
				want[k] = true
				left--
			}
		case err := <-werr:
			t.Fatalf("watch ended: %v (seen %v)", err, seen)
		case <-ctx.Done():
			t.Fatalf("events seen %v, want all of %v", seen, want)
		}
	}
	if fi, err := c.StatFile(ctx, "/tmp/w/b.txt"); err != nil || fi.Size != 1 {
		t.Fatalf("renamed file: %+v %v", fi, err)
	}
	stop()
	if err := <-werr; err != nil {
		t.Fatalf("watch after stop: %v", err)
	}
}

// TestCLITerminal drives `airlock exec -it` from a pseudo-terminal, as a
// user at a terminal would: the guest command is on a terminal of this
// terminal's size, follows its resizes, Ctrl-C interrupts the command and
// not airlock, and the command's exit code is airlock's.
// It runs twice: on the sandbox's host, and through airlock serve (the
// terminal WebSocket, remote CLI mode).
func TestCLITerminal(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Run("local", func(t *testing.T) {
		cliTerminal(t, exec.Command(e.bin, "--state-dir", e.state, "exec", "-it", id, "--", "sh"))
	})
	t.Run("remote", func(t *testing.T) {
		s := startServe(t, e)
		key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-terminal", "--admin"))
		cmd := exec.Command(e.bin, "exec", "-it", id, "--", "sh")
		cmd.Env = append(os.Environ(), "AIRLOCK_HOST="+s.base, "AIRLOCK_API_KEY="+key)
		cliTerminal(t, cmd)
	})
}

func cliTerminal(t *testing.T, cmd *exec.Cmd) {
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var mu sync.Mutex
	var screen strings.Builder
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			mu.Lock()
			screen.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	waitFor := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			s := screen.String()
			mu.Unlock()
			if strings.Contains(s, what) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %q on the terminal:\n%s", what, s)
			}
		}
	}
	typeIn := func(s string) {
		t.Helper()
		if _, err := ptmx.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	typeIn("tty; stty size; echo ready-$((20+1))\n")
	waitFor("ready-21")
	waitFor("/dev/pts/")
	waitFor("30 100")
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	// The resize travels as SIGWINCH to airlock, then to the guest: ask
	// until the guest's terminal has it.
	for deadline := time.Now().Add(60 * time.Second); ; {
		typeIn("stty size\n")
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		ok := strings.Contains(screen.String(), "40 120")
		mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest's terminal never took the new size")
		}
	}
	// ^C once the shell is on the sleep's line (a ^C before sleep starts
	// interrupts that line too).
	typeIn("echo sleeping-$((3*3)); sleep 600\n")
	waitFor("sleeping-9")
	typeIn("\x03")
	typeIn("echo after-$((1+1))\n")
	waitFor("after-2")
	typeIn("exit 7\n")
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Fatalf("airlock exec -it ended with %v, want exit code 7", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("airlock exec -it did not end after exit")
	}
}

// TestTerminalSocketEnd: a terminal whose WebSocket closes is killed
// (unless kept), and a kept one can be attached again by its exec id.
func TestTerminalSocketEnd(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	s := startServe(t, e)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-terminal-end", "--admin"))
	c := airlock.New(s.base, key)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	state := func(execID string) string {
		t.Helper()
		execs, err := c.ListExecs(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range execs {
			if x.ID == execID {
				return x.State
			}
		}
		return "gone"
	}
	waitState := func(execID, want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); state(execID) != want; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("exec %s is %s, want %s", execID, state(execID), want)
			}
		}
	}
	term, err := c.Terminal(ctx, id, airlock.TerminalOptions{Cmd: []string{"sleep", "600"}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(term.ExecID, "running")
	_ = term.Close()
	waitState(term.ExecID, "exited")

	kept, err := c.Terminal(ctx, id, airlock.TerminalOptions{Cmd: []string{"sh", "-c", "read l; echo got:$l"}, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = kept.Close()
	// The re-attach below (input reaching the command and its answer
	// coming back) is what proves the kept command survived its socket.
	if st := state(kept.ExecID); st != "running" {
		t.Fatalf("a kept terminal is %s after its socket closed", st)
	}
	again, err := c.Terminal(ctx, id, airlock.TerminalOptions{ExecID: kept.ExecID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Write([]byte("back\n")); err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(again)
	if err != nil || !strings.Contains(string(out), "got:back") {
		t.Fatalf("re-attached terminal: %q %v", out, err)
	}
	if x, err := again.Wait(ctx); err != nil || x.Code != 0 {
		t.Fatalf("exit %+v %v", x, err)
	}
}
