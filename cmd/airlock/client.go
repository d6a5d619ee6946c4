package main

// The sandbox commands' one path: every body talks to the HTTP API through
// the Go SDK (client), of the server named by AIRLOCK_HOST or of one served
// in this process on the local state dir (api.Local). Exits mean the same
// either way: the command's code, 124 timeout, 128+N signal N, 125 an
// airlock failure, 126/127 a command the guest could not start.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/store"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// stdinChunk is the most one SendStdin call carries.
const stdinChunk = 64 << 10

// client returns the API client every sandbox command goes through: for
// the server named by AIRLOCK_HOST, or, when it is unset, for an API server
// on the local state dir served in this process (api.Local: no socket, no
// daemon), acting as the local user. done releases it.
func (g *globals) client(ctx context.Context) (c *airlock.Client, done func(), err error) {
	ua := airlock.WithUserAgent("airlock-cli/" + version)
	if g.host != "" {
		if g.apiKey == "" {
			return nil, nil, fmt.Errorf("%w: AIRLOCK_HOST is set but AIRLOCK_API_KEY is not (create one with `airlock keys create` on the server)", errdefs.ErrInvalid)
		}
		host := g.host
		if !strings.Contains(host, "://") {
			host = "http://" + host
		}
		return airlock.New(host, g.apiKey, ua), func() {}, nil
	}
	m, closeManager, err := g.manager(ctx)
	if err != nil {
		return nil, nil, err
	}
	// The command reports its errors itself; the server's own log of them
	// is for --log-level debug.
	log := slog.New(slog.DiscardHandler)
	if g.log.Enabled(ctx, slog.LevelDebug) {
		log = g.log.With("component", "api")
	}
	s, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Contexts: m, Ports: m, Snapshots: m, Volumes: m, Secrets: m, Templates: m, Browsers: m, Events: m.Store, Keys: m.Store, Log: log})
	if err != nil {
		closeManager()
		return nil, nil, err
	}
	l := s.ServeLocal(sandbox.Local())
	return airlock.New("http://airlock.local", "", ua, airlock.WithHTTPClient(l.Client())), func() {
		_ = l.Close()
		closeManager()
	}, nil
}

// withClient adapts a command body to the API client of client().
func (g *globals) withClient(run func(cmd *cobra.Command, c *airlock.Client, args []string) error) func(*cobra.Command, []string) error {
	return withOpen(g.client, run)
}

// apiMsg is err's text without the SDK's "airlock: " prefix; for an
// *airlock.APIError it holds the server's message and request id, or, from
// the in-process server (no request id), the message alone.
func apiMsg(err error) string {
	msg := err.Error()
	if ae, ok := errors.AsType[*airlock.APIError](err); ok && ae.RequestID == "" && ae.Message != "" {
		msg = strings.Replace(msg, ae.Error(), ae.Message, 1)
	}
	return strings.TrimPrefix(msg, "airlock: ")
}

func createOptions(o sandbox.CreateOptions) airlock.CreateOptions {
	return airlock.CreateOptions{
		Image: o.Image, CPUs: o.CPUs, MemoryMB: o.MemoryMiB, DiskMB: o.DiskMiB,
		Timeout: o.Timeout, Metadata: o.Metadata, Env: o.Env, Network: apiNetwork(o.Network, o.Secrets),
		IdlePause: o.IdlePause, Volumes: apiVolumes(o.Volumes), HostMounts: apiHostMounts(o.HostMounts),
	}
}

func apiVolumes(vs []sandbox.VolumeMount) []airlock.VolumeMount {
	var out []airlock.VolumeMount
	for _, v := range vs {
		out = append(out, airlock.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return out
}

func apiHostMounts(hs []sandbox.HostMount) []airlock.HostMount {
	var out []airlock.HostMount
	for _, h := range hs {
		out = append(out, airlock.HostMount{HostPath: h.HostPath, Path: h.Path, ReadWrite: h.ReadWrite})
	}
	return out
}

// execRequest translates the parsed exec flags for the API.
func execRequest(spec guest.ExecSpec) airlock.ExecRequest {
	return airlock.ExecRequest{Cmd: spec.Argv, Cwd: spec.Cwd, User: spec.User, Timeout: spec.Timeout, Env: spec.Env, PidsLimit: int(spec.PidsLimit)}
}

func viewSandbox(sb *airlock.Sandbox) sandboxView {
	v := sandboxView{
		ID: sb.ID, State: sb.State, Reason: sb.Reason, Image: sb.Image, Digest: sb.ImageDigest,
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMB, DiskMiB: sb.DiskMB,
		CreatedAt: sb.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt.UTC(), Accel: sb.Accel, Kernel: sb.GuestKernel,
		StartMode: sb.StartMode, Runtime: sb.Runtime, Metadata: sb.Metadata, Tenant: sb.Tenant, Network: viewAPINetwork(sb.Network),
		IdlePauseS: sb.IdlePauseS, Source: sb.Source, Mounts: sb.Mounts,
	}
	u := sb.DiskUsageBytes
	v.DiskUsageBytes = &u
	v.setPause(sb.PausedAt, sb.State == airlock.StatePaused, sb.LifetimeLeftS)
	return v
}

// runSandbox creates a sandbox from o (or from snapshot fromSnapshot),
// runs start in it (on a terminal if start.TTY) and removes it.
func runSandbox(cmd *cobra.Command, c *airlock.Client, o sandbox.CreateOptions, fromSnapshot string, start guest.ExecSpec, interactive bool) error {
	ctx := cmd.Context()
	ro := createOptions(o)
	ro.FromSnapshot = fromSnapshot
	sb, err := c.Create(ctx, ro)
	if err != nil {
		return &exitError{code: 125, msg: apiMsg(err)}
	}
	var runErr error
	switch {
	case sb.State == airlock.StateFailed:
		runErr = &exitError{code: 125, msg: "sandbox " + sb.ID + " failed: " + sb.Reason}
	case start.TTY != nil:
		warnTCG(sb.Accel)
		runErr = runTerminal(sb.ID, start, interactive, openTerminal(ctx, c, sb.ID))
	default:
		warnTCG(sb.Accel)
		runErr = runExec(cmd, c, sb.ID, start, "")
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := c.Kill(kctx, sb.ID); err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "airlock: remove sandbox:", apiMsg(err))
	}
	return runErr
}

func createSandbox(cmd *cobra.Command, c *airlock.Client, o sandbox.CreateOptions, fromSnapshot string) error {
	ro := createOptions(o)
	ro.FromSnapshot = fromSnapshot
	sb, err := c.Create(cmd.Context(), ro)
	if err != nil {
		return err
	}
	if sb.State == airlock.StateFailed {
		return fmt.Errorf("sandbox %s failed: %s", sb.ID, sb.Reason)
	}
	warnTCG(sb.Accel)
	fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
	return nil
}

// runExec runs spec in sandbox id and turns its end into airlock's exit
// (exitFor). The exec belongs to the sandbox's shim: if airlock is killed
// it keeps running, and its output and exit stay readable through the API.
// SIGINT and SIGTERM are forwarded to it (a second one sends SIGKILL);
// stdout and stderr stream to the command's own, and stdin with spec.Stdin.
// A failed write of its output (a closed pipe) kills it, as SIGPIPE would.
//
// With attach set, it follows that running exec instead of starting one
// (spec is used only for the words of its exit), from its retained output.
func runExec(cmd *cobra.Command, c *airlock.Client, id string, spec guest.ExecSpec, attach string) error {
	req := execRequest(spec)
	// Signals are forwarded, not obeyed: the stream must outlive the
	// command's context (which ends on them) until the exec reports its exit.
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigc)
	ctx, cancel := context.WithCancel(context.WithoutCancel(cmd.Context()))
	defer cancel()

	var werr error // set by the stream's goroutine before it reports on done
	sink := func(w io.Writer, name string) func([]byte) {
		return func(p []byte) {
			if werr != nil {
				return
			}
			if _, err := w.Write(p); err != nil {
				werr = fmt.Errorf("write %s: %w", name, err)
				cancel()
			}
		}
	}
	started := make(chan string, 1)
	h := airlock.ExecHandlers{
		OnStart: func(eid string, _ int) {
			select {
			case started <- eid:
			default:
			}
		},
		OnStdout: sink(cmd.OutOrStdout(), "stdout"),
		OnStderr: sink(cmd.ErrOrStderr(), "stderr"),
	}
	type result struct {
		st  *airlock.ExitStatus
		err error
	}
	done := make(chan result, 1)
	execID := ""
	if attach != "" {
		execID = attach
		go func() {
			st, err := c.Attach(ctx, id, attach, h)
			done <- result{st, err}
		}()
	} else if spec.Stdin {
		req.StdinOpen = true
		eid, err := c.Start(ctx, id, req)
		if err != nil {
			return execFailed(id, err)
		}
		execID = eid
		// Not waited for: a read from a terminal cannot be interrupted. It
		// ends at the reader's next return after ctx ends.
		go pumpStdin(ctx, c, id, eid, cmd.InOrStdin())
		go func() {
			st, err := c.Attach(ctx, id, eid, h)
			done <- result{st, err}
		}()
	} else {
		go func() {
			st, err := c.Exec(ctx, id, req, h)
			done <- result{st, err}
		}()
	}
	signals, pending := 0, 0
	for {
		select {
		case eid := <-started:
			if execID == "" {
				execID = eid
				if pending != 0 {
					go signalExec(ctx, c, id, execID, pending)
				}
			}
		case r := <-done:
			if se, ok := errors.AsType[*airlock.StreamError](r.err); ok && errors.Is(se, airlock.ErrExecPaused) {
				return pausedExit(id, cmp.Or(se.ExecID, execID))
			}
			if r.err != nil {
				if werr != nil {
					if execID != "" {
						signalExec(ctx, c, id, execID, 9)
					}
					return &exitError{code: 125, msg: "exec in " + id + ": " + werr.Error()}
				}
				return execFailed(id, r.err)
			}
			st := r.st
			return exitFor(cmd.ErrOrStderr(), &guest.ExitStatus{Code: st.Code, Signal: st.Signal, TimedOut: st.TimedOut, Truncated: st.Truncated, OOMKilled: st.OOMKilled}, spec)
		case sig := <-sigc:
			n := 9
			if s, ok := sig.(syscall.Signal); ok && signals == 0 {
				n = int(s)
			}
			signals++
			if execID == "" {
				pending = n // sent once the exec has an id
			} else {
				go signalExec(ctx, c, id, execID, n)
			}
		}
	}
}

// pausedExit is the exit of a command whose sandbox was paused while it
// ran: the command is parked in the guest and goes on when the sandbox
// resumes.
func pausedExit(id, execID string) error {
	return &exitError{code: exitPaused, msg: fmt.Sprintf("sandbox %s was paused while the command ran; the command goes on when the sandbox resumes: `airlock attach %s %s` resumes it and picks the command up again", id, id, execID)}
}

// exitPaused is airlock's exit code when the sandbox was paused while the
// command ran (EX_TEMPFAIL).
const exitPaused = 75

// execFailed is the exit of an exec that did not run to its end: 126 or
// 127 for a command the guest could not start, else 125 with the reason.
func execFailed(id string, err error) error {
	if ae, ok := errors.AsType[*airlock.APIError](err); ok && errors.Is(ae, airlock.ErrExecNotStarted) {
		return notStartedExit(strings.HasPrefix(ae.Message, guest.StartNotFound), ae.Message)
	}
	if errors.Is(err, airlock.ErrNotFound) || errors.Is(err, airlock.ErrFailedPrecondition) {
		return &exitError{code: 125, msg: apiMsg(err)} // the sandbox's own words
	}
	return &exitError{code: 125, msg: "exec in " + id + ": " + apiMsg(err)}
}

// notStartedExit is the exit of a command the guest could not start: 127
// for a missing executable, cwd or user, 126 otherwise (shell convention).
func notStartedExit(notFound bool, msg string) error {
	if notFound {
		return &exitError{code: 127, msg: msg}
	}
	return &exitError{code: 126, msg: msg}
}

// signalExec sends signal n to an exec, bounded in time.
func signalExec(ctx context.Context, c *airlock.Client, id, execID string, n int) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = c.Signal(ctx, id, execID, n)
}

// pumpStdin sends r to the exec's stdin in chunks, then closes it.
func pumpStdin(ctx context.Context, c *airlock.Client, id, execID string, r io.Reader) {
	buf := make([]byte, stdinChunk)
	for {
		n, err := r.Read(buf)
		if ctx.Err() != nil {
			return
		}
		if n > 0 {
			if c.SendStdin(ctx, id, execID, buf[:n], false) != nil {
				return
			}
		}
		if err != nil {
			_ = c.SendStdin(ctx, id, execID, nil, true)
			return
		}
	}
}

// copyIn streams the local file to id:remote.
func copyIn(cmd *cobra.Command, g *globals, c *airlock.Client, local, id, remote string) error {
	ctx := cmd.Context()
	f, fi, err := openRegular(local)
	if err != nil {
		return err
	}
	defer f.Close()
	if strings.HasSuffix(remote, "/") {
		remote += filepath.Base(local)
	} else if st, err := c.Stat(ctx, id, path.Clean(remote)); err == nil && st.IsDir() {
		remote = path.Join(remote, filepath.Base(local))
	}
	remote = path.Clean(remote)
	if err := shim.ValidateGuestPath(remote); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	n, err := c.WriteFileMode(ctx, id, remote, f, fi.Mode().Perm())
	if err != nil {
		return fmt.Errorf("copy to %s: %s", remote, apiMsg(err))
	}
	g.log.Info("copied", "bytes", n)
	return nil
}

// copyOut streams id:remote to the local path: never
// more bytes than the sandbox's disk holds, and local is replaced only once
// the whole file arrived.
func copyOut(cmd *cobra.Command, c *airlock.Client, id, remote, local string) error {
	ctx := cmd.Context()
	if err := shim.ValidateGuestPath(remote); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	sb, err := c.Get(ctx, id)
	if err != nil {
		return err
	}
	limit := int64(sb.DiskMB) << 20
	fi, err := c.Stat(ctx, id, remote)
	if err != nil {
		return fmt.Errorf("copy from %s: %s", remote, apiMsg(err))
	}
	if fi.Type != "file" {
		return fmt.Errorf("%w: %s is not a regular file", errdefs.ErrInvalid, remote)
	}
	_, err = writeLocal(local, path.Base(remote), func(tmp *os.File) (int64, os.FileMode, error) {
		rc, err := c.ReadFile(ctx, id, remote)
		if err != nil {
			return 0, 0, fmt.Errorf("copy from %s: %s", remote, apiMsg(err))
		}
		defer rc.Close()
		n, err := io.Copy(tmp, io.LimitReader(rc, limit+1))
		if err != nil {
			return n, 0, fmt.Errorf("copy from %s: %w", remote, err)
		}
		if n > limit {
			return n, 0, fmt.Errorf("%w: copy from %s: larger than the sandbox's disk", errdefs.ErrResourceExhausted, remote)
		}
		return n, fi.Mode.Perm(), nil
	})
	return err
}

func listSandboxes(cmd *cobra.Command, c *airlock.Client, asJSON, size bool) error {
	sbs, err := c.List(cmd.Context(), airlock.ListOptions{})
	if err != nil {
		return err
	}
	vs := make([]sandboxView, 0, len(sbs))
	for i := range sbs {
		v := viewSandbox(&sbs[i])
		if !size {
			v.DiskUsageBytes = nil // as locally: only with --size
		}
		vs = append(vs, v)
	}
	return printSandboxes(cmd.OutOrStdout(), vs, asJSON, size)
}

func inspectSandbox(cmd *cobra.Command, c *airlock.Client, args []string) error {
	sb, err := c.Get(cmd.Context(), args[0])
	if err != nil {
		return err
	}
	return writeJSON(cmd.OutOrStdout(), viewSandbox(sb))
}

func removeSandboxes(cmd *cobra.Command, c *airlock.Client, args []string) error {
	var failed int
	for _, id := range args {
		if err := c.Kill(cmd.Context(), id); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "airlock: rm", id+":", apiMsg(err))
			failed++
			continue
		}
		fmt.Fprintln(cmd.OutOrStdout(), id)
	}
	if failed > 0 {
		return &exitError{code: 1}
	}
	return nil
}

func listEvents(cmd *cobra.Command, c *airlock.Client, f store.EventFilter) error {
	evs, _, err := c.Events(cmd.Context(), airlock.EventsOptions{Sandbox: f.SandboxID, Type: f.Type, Since: f.Since, Limit: f.Limit})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(cmd.OutOrStdout())
	for _, e := range evs {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}
