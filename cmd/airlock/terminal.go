package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/guest"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// termSession is a terminal exec, local (through the manager) or remote
// (through airlock serve's terminal WebSocket).
type termSession interface {
	input(p []byte) error
	resize(rows, cols int) error
	signal(sig int) error
	// wait copies the output to out until the command exits, and returns
	// how it ended.
	wait(out io.Writer) (*guest.ExitStatus, error)
	close()
}

// runTerminal runs a terminal session that open starts (at this
// terminal's size), tied to this process's terminal: SIGWINCH resizes it,
// and with interactive this terminal is raw (restored on every way out) so
// that every key, Ctrl-C included, reaches the guest's terminal, whose line
// discipline turns it into a signal for the command. The exit code is the
// command's, as for exec.
func runTerminal(id string, spec guest.ExecSpec, interactive bool, open func(guest.ExecSpec) (termSession, error)) error {
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	if cols, rows, err := term.GetSize(out); err == nil && cols > 0 && rows > 0 {
		spec.TTY = &guest.TermSize{Rows: uint32(rows), Cols: uint32(cols)}
	}
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGWINCH, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	ts, err := open(spec)
	if err != nil {
		return err
	}
	defer ts.close()
	if interactive && term.IsTerminal(in) {
		old, err := term.MakeRaw(in)
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer func() { _ = term.Restore(in, old) }()
	}
	if interactive {
		go func() {
			buf := make([]byte, stdinChunk)
			for {
				n, err := os.Stdin.Read(buf)
				if n > 0 && ts.input(buf[:n]) != nil {
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	type result struct {
		exit *guest.ExitStatus
		err  error
	}
	done := make(chan result, 1)
	go func() {
		x, err := ts.wait(os.Stdout)
		done <- result{x, err}
	}()
	for {
		select {
		case res := <-done:
			if res.err != nil {
				return &exitError{code: 125, msg: "terminal in " + id + ": " + res.err.Error()}
			}
			return exitFor(os.Stderr, res.exit, spec)
		case sig := <-sigc:
			if sig == syscall.SIGWINCH {
				if cols, rows, err := term.GetSize(out); err == nil && cols > 0 && rows > 0 {
					_ = ts.resize(rows, cols)
				}
				continue
			}
			// Not from a key (those go through the terminal): a kill of
			// airlock itself hangs up the command.
			_ = ts.signal(int(syscall.SIGHUP))
		}
	}
}

// openTerminal opens a terminal through the API (the SDK's Terminal, a
// WebSocket); it ends with this process.
func openTerminal(ctx context.Context, c *airlock.Client, id string) func(guest.ExecSpec) (termSession, error) {
	return func(spec guest.ExecSpec) (termSession, error) {
		t, err := c.Terminal(ctx, id, airlock.TerminalOptions{
			Cmd: spec.Argv, Rows: int(spec.TTY.Rows), Cols: int(spec.TTY.Cols), Env: spec.Env, Cwd: spec.Cwd, User: spec.User, Timeout: spec.Timeout,
		})
		if err != nil {
			return nil, execFailed(id, err)
		}
		return termConn{t}, nil
	}
}

type termConn struct{ t *airlock.Terminal }

func (r termConn) input(p []byte) error {
	_, err := r.t.Write(p)
	return err
}
func (r termConn) resize(rows, cols int) error {
	return r.t.Resize(context.Background(), rows, cols)
}
func (r termConn) signal(sig int) error { return r.t.Signal(context.Background(), sig) }
func (r termConn) close()               { _ = r.t.Close() }
func (r termConn) wait(out io.Writer) (*guest.ExitStatus, error) {
	if _, err := io.Copy(out, r.t); err != nil {
		return nil, err
	}
	x, err := r.t.Wait(context.Background())
	if err != nil {
		return nil, err
	}
	return &guest.ExitStatus{Code: x.Code, Signal: x.Signal, TimedOut: x.TimedOut, Truncated: x.Truncated, Duration: x.Duration, OOMKilled: x.OOMKilled}, nil
}

// shellCmd is `exec -it ID -- <a login shell>`.
func shellCmd(g *globals) *cobra.Command {
	var user, workdir string
	cmd := &cobra.Command{
		Use:   "shell ID",
		Short: "Open an interactive shell in a sandbox (exec -it with bash, or sh without it)",
		Example: `  airlock shell 3vorrxoi4pkituzh2pbh
  airlock shell -u nobody -w /tmp 3vorrxoi4pkituzh2pbh`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !term.IsTerminal(int(os.Stdin.Fd())) {
				return errors.New("airlock shell needs a terminal on stdin; use exec -i for a pipe")
			}
			if workdir == "" && user == "" {
				workdir = "/root" // a login shell starts at home
			}
			spec := guest.ExecSpec{
				Argv: []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"},
				User: user, Cwd: workdir, Stdin: true, TTY: &guest.TermSize{Rows: 24, Cols: 80},
			}
			c, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			return runTerminal(args[0], spec, true, openTerminal(cmd.Context(), c, args[0]))
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user (name, uid, name:group) in the guest; default root")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the guest (default: the user's home)")
	return cmd
}
