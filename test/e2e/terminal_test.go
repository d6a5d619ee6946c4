package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
)

// TestTerminalWatchRename drives a real guest agent (either runtime)
// through its shim: an exec on a terminal (its size, resize, typed input,
// exit), a recursive directory watch, and a rename.
func TestTerminalWatchRename(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	c := shimclient.New(sandbox.Layout{Root: e.state}.Socket(id))
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
		if !typed && strings.Contains(out.String(), "size 30 100") {
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
