package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// runTerminal runs spec (spec.TTY set) on a terminal in the guest, tied to
// this process's terminal: its size at the start and on every SIGWINCH,
// and with interactive, raw mode (restored on every way out) so that
// every key, Ctrl-C included, reaches the guest's terminal, whose line
// discipline turns it into a signal for the command. Output is the
// terminal's (stdout). The exit code is the command's, as for exec.
func runTerminal(ctx context.Context, m *sandbox.Manager, id string, spec guest.ExecSpec, interactive bool) error {
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	if cols, rows, err := term.GetSize(out); err == nil && cols > 0 && rows > 0 {
		spec.TTY = &guest.TermSize{Rows: uint32(rows), Cols: uint32(cols)}
	}
	if interactive && term.IsTerminal(in) {
		old, err := term.MakeRaw(in)
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer func() { _ = term.Restore(in, old) }()
	}
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGWINCH, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	st, err := m.Exec(sctx, sandbox.Local(), id, spec, true) // the terminal dies with its client
	if err != nil {
		if se, ok := guest.AsStartError(err); ok {
			return notStartedExit(se.NotFound, se.Error())
		}
		return &exitError{code: 125, msg: "exec in " + id + ": " + err.Error()}
	}
	defer st.Close()
	if interactive {
		go pumpLocalStdin(st, os.Stdin)
	}
	events := make(chan execResult, 1)
	go func() { events <- drain(st, os.Stdout, os.Stderr) }()
	for {
		select {
		case res := <-events:
			if res.err != nil {
				return &exitError{code: 125, msg: "exec in " + id + ": " + res.err.Error()}
			}
			return exitFor(os.Stderr, res.exit, spec)
		case sig := <-sigc:
			if sig == syscall.SIGWINCH {
				if cols, rows, err := term.GetSize(out); err == nil && cols > 0 && rows > 0 {
					_ = st.Resize(guest.TermSize{Rows: uint32(rows), Cols: uint32(cols)})
				}
				continue
			}
			// Not from a key (those go through the terminal): a kill of
			// airlock itself ends the command.
			_ = st.Signal(int(syscall.SIGHUP))
		}
	}
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
			if c, err := g.remote(); err != nil || c != nil {
				if err != nil {
					return err
				}
				return fmt.Errorf("%w: a terminal through airlock serve is not available yet; run airlock shell on the sandbox's host", errdefs.ErrUnsupported)
			}
			if !term.IsTerminal(int(os.Stdin.Fd())) {
				return errors.New("airlock shell needs a terminal on stdin; use exec -i for a pipe")
			}
			m, done, err := g.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if workdir == "" && user == "" {
				workdir = "/root" // a login shell starts at home
			}
			spec := guest.ExecSpec{
				Argv: []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"},
				User: user, Cwd: workdir, Stdin: true, TTY: &guest.TermSize{Rows: 24, Cols: 80},
			}
			return runTerminal(cmd.Context(), m, args[0], spec, true)
		},
	}
	cmd.Flags().StringVarP(&user, "user", "u", "", "user (name, uid, name:group) in the guest; default root")
	cmd.Flags().StringVarP(&workdir, "workdir", "w", "", "working directory in the guest (default: the user's home)")
	return cmd
}
