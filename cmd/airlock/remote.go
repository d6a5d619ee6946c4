package main

// Remote mode: with AIRLOCK_HOST set, run, create, exec, cp, ls, inspect, rm,
// pause, resume, touch and events go through an airlock API server with the Go SDK instead of the
// local state dir. Flags are parsed by the same code as the local mode, and
// exits mean the same: the command's code, 124 timeout, 128+N signal N, 125
// an airlock failure, 130 interrupted.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/store"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// stdinChunk is the most one SendStdin call carries.
const stdinChunk = 64 << 10

// remote returns a client for the API server named by AIRLOCK_HOST, or nil
// (and no error) when it is unset: the command then works locally.
func (g *globals) remote() (*airlock.Client, error) {
	if g.host == "" {
		return nil, nil
	}
	if g.apiKey == "" {
		return nil, fmt.Errorf("%w: AIRLOCK_HOST is set but AIRLOCK_API_KEY is not (create one with `airlock keys create` on the server)", errdefs.ErrInvalid)
	}
	host := g.host
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	return airlock.New(host, g.apiKey, airlock.WithUserAgent("airlock-cli/"+version)), nil
}

// localOrRemote picks, per invocation, the remote body when AIRLOCK_HOST is
// set and the local one (with the sandbox manager) otherwise.
func (g *globals) localOrRemote(
	local func(cmd *cobra.Command, m *sandbox.Manager, args []string) error,
	remote func(cmd *cobra.Command, c *airlock.Client, args []string) error,
) func(*cobra.Command, []string) error {
	withManager := g.withManager(local)
	return func(cmd *cobra.Command, args []string) error {
		c, err := g.remote()
		if err != nil {
			return err
		}
		if c != nil {
			return remote(cmd, c, args)
		}
		return withManager(cmd, args)
	}
}

// apiMsg is err's text without the SDK's "airlock: " prefix; for an
// *airlock.APIError it holds the server's message and request id.
func apiMsg(err error) string {
	return strings.TrimPrefix(err.Error(), "airlock: ")
}

func remoteCreateOptions(o sandbox.CreateOptions) airlock.CreateOptions {
	return airlock.CreateOptions{
		Image: o.Image, CPUs: o.CPUs, MemoryMB: o.MemoryMiB, DiskMB: o.DiskMiB,
		Timeout: o.Timeout, Metadata: o.Metadata, Env: o.Env, Network: remoteNetwork(o.Network, o.Secrets),
		IdlePause: o.IdlePause,
	}
}

// remoteExecRequest translates the parsed exec flags for the API.
func remoteExecRequest(spec guest.ExecSpec) (airlock.ExecRequest, error) {
	req := airlock.ExecRequest{Cmd: spec.Argv, Cwd: spec.Cwd, User: spec.User, Timeout: spec.Timeout, Env: spec.Env}
	if spec.PidsLimit != 0 {
		return req, fmt.Errorf("%w: --pids-limit is not supported through AIRLOCK_HOST", errdefs.ErrInvalid)
	}
	return req, nil
}

func remoteView(sb *airlock.Sandbox) sandboxView {
	v := sandboxView{
		ID: sb.ID, State: sb.State, Reason: sb.Reason, Image: sb.Image, Digest: sb.ImageDigest,
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMB, DiskMiB: sb.DiskMB,
		CreatedAt: sb.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt.UTC(), Accel: sb.Accel, Kernel: sb.GuestKernel,
		StartMode: sb.StartMode, Metadata: sb.Metadata, Tenant: sb.Tenant, Network: viewRemoteNetwork(sb.Network),
		IdlePauseS: sb.IdlePauseS, Source: sb.Source,
	}
	u := sb.DiskUsageBytes
	v.DiskUsageBytes = &u
	v.setPause(sb.PausedAt, sb.State == airlock.StatePaused, sb.LifetimeLeftS)
	return v
}

func remoteRun(cmd *cobra.Command, c *airlock.Client, o sandbox.CreateOptions, fromSnapshot string, start guest.ExecSpec, interactive bool) error {
	ctx := cmd.Context()
	if _, err := remoteExecRequest(start); err != nil {
		return err // before a sandbox exists
	}
	ro := remoteCreateOptions(o)
	ro.FromSnapshot = fromSnapshot
	sb, err := c.Create(ctx, ro)
	if err != nil {
		return &exitError{code: 125, msg: "create sandbox: " + apiMsg(err)}
	}
	runErr := error(nil)
	if sb.State == airlock.StateFailed {
		runErr = &exitError{code: 125, msg: "sandbox " + sb.ID + " failed: " + sb.Reason}
	} else {
		warnTCG(sb.Accel)
		runErr = remoteExec(cmd, c, sb.ID, start, interactive)
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := c.Kill(kctx, sb.ID); err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "airlock: remove sandbox:", apiMsg(err))
	}
	return runErr
}

func remoteCreate(cmd *cobra.Command, c *airlock.Client, o sandbox.CreateOptions, fromSnapshot string) error {
	ro := remoteCreateOptions(o)
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

// remoteExec runs start in sandbox id through the API, streaming its output
// to the command's stdout and stderr and, if interactive, the command's
// stdin to it. Interrupting airlock kills the command in the sandbox.
func remoteExec(cmd *cobra.Command, c *airlock.Client, id string, start guest.ExecSpec, interactive bool) error {
	req, err := remoteExecRequest(start)
	if err != nil {
		return err
	}
	parent := cmd.Context()
	ctx, cancel := context.WithCancel(parent)
	defer cancel()

	// A failed write (a closed pipe) ends the stream, as it does locally.
	var werr error
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
	var execID string
	h := airlock.ExecHandlers{
		OnStart:  func(eid string, _ int) { execID = eid },
		OnStdout: sink(cmd.OutOrStdout(), "stdout"),
		OnStderr: sink(cmd.ErrOrStderr(), "stderr"),
	}

	var st *airlock.ExitStatus
	if interactive {
		req.StdinOpen = true
		execID, err = c.Start(ctx, id, req)
		if err != nil {
			return remoteExecFailed(parent, id, err)
		}
		// Not waited for: a read from a terminal cannot be interrupted (as in
		// sandbox.Exec). It ends at the reader's next return after ctx ends.
		go pumpStdin(ctx, c, id, execID, cmd.InOrStdin())
		st, err = c.Attach(ctx, id, execID, h)
	} else {
		req.KillOnDisconnect = true
		st, err = c.Exec(ctx, id, req, h)
	}
	if err != nil {
		if execID != "" {
			killExec(parent, c, id, execID)
		}
		if werr != nil {
			err = werr
		}
		return remoteExecFailed(parent, id, err)
	}
	ex := &guest.ExitStatus{Code: st.Code, Signal: st.Signal, TimedOut: st.TimedOut, Truncated: st.Truncated, OOMKilled: st.OOMKilled}
	return exitFor(cmd.ErrOrStderr(), ex, start)
}

func remoteExecFailed(parent context.Context, id string, err error) error {
	if parent.Err() != nil {
		return &exitError{code: 130, msg: "interrupted; the command was killed"}
	}
	if ae, ok := errors.AsType[*airlock.APIError](err); ok && errors.Is(ae, airlock.ErrExecNotStarted) {
		return notStartedExit(strings.HasPrefix(ae.Message, guest.StartNotFound), ae.Message)
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

// killExec sends SIGKILL to an exec whose stream airlock gave up on.
func killExec(parent context.Context, c *airlock.Client, id, execID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), 10*time.Second)
	defer cancel()
	_ = c.Signal(ctx, id, execID, 9)
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

// remoteCopyIn streams the local file to id:remote, like copyIn.
func remoteCopyIn(cmd *cobra.Command, g *globals, c *airlock.Client, local, id, remote string) error {
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

// remoteCopyOut streams id:remote to the local path, like copyOut: never
// more bytes than the sandbox's disk holds, and local is replaced only once
// the whole file arrived.
func remoteCopyOut(cmd *cobra.Command, c *airlock.Client, id, remote, local string) error {
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

func remoteLs(cmd *cobra.Command, c *airlock.Client, asJSON, size bool) error {
	sbs, err := c.List(cmd.Context(), airlock.ListOptions{})
	if err != nil {
		return err
	}
	vs := make([]sandboxView, 0, len(sbs))
	for i := range sbs {
		v := remoteView(&sbs[i])
		if !size {
			v.DiskUsageBytes = nil // as locally: only with --size
		}
		vs = append(vs, v)
	}
	return printSandboxes(cmd.OutOrStdout(), vs, asJSON, size)
}

func remoteInspect(cmd *cobra.Command, c *airlock.Client, args []string) error {
	sb, err := c.Get(cmd.Context(), args[0])
	if err != nil {
		return err
	}
	return writeJSON(cmd.OutOrStdout(), remoteView(sb))
}

func remoteRm(cmd *cobra.Command, c *airlock.Client, args []string) error {
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

func remoteEvents(cmd *cobra.Command, c *airlock.Client, f store.EventFilter) error {
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
