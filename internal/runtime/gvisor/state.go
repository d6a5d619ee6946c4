package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// The agent's channel. runsc saves a sandbox's stdin with it and a restore
// hands the sandbox a new one, but it cannot save a host socket that
// reached the sandbox at run time. So stdin is a control socket that only
// carries sessions: each session is a socketpair whose guest end is sent
// on it (one byte, SCM_RIGHTS), and the agent writes
// agentapi.SessionClosed back once it has closed one. Before a checkpoint
// the caller has closed its session; SaveState waits for the agent's byte,
// so that nothing the checkpoint cannot save is open in the sandbox.

// socketPair returns a connected unix stream pair: the host end as a conn,
// the other as a file to hand over (the caller closes it).
func socketPair(name string) (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%s socket: %w", name, err)
	}
	hostFile, guest := os.NewFile(uintptr(fds[0]), name+"-host"), os.NewFile(uintptr(fds[1]), name+"-guest")
	c, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		guest.Close()
		return nil, nil, fmt.Errorf("%s socket: %w", name, err)
	}
	return c.(*net.UnixConn), guest, nil
}

// newSession sends the agent a new session on ctl and returns its host
// end. The agent takes it when it is done with the one before.
func (in *instance) newSession(ctl *net.UnixConn) (*net.UnixConn, error) {
	hc, guest, err := socketPair("agent")
	if err != nil {
		return nil, err
	}
	defer guest.Close()
	if _, _, err := ctl.WriteMsgUnix([]byte{'S'}, unix.UnixRights(int(guest.Fd())), nil); err != nil {
		hc.Close()
		return nil, fmt.Errorf("send the agent its session: %w", err)
	}
	return hc, nil
}

// sessionEndTimeout bounds the wait for the agent to close its session
// when SaveState's context has no deadline.
const sessionEndTimeout = 10 * time.Second

// waitSessionsClosed reads the agent's acknowledgements on ctl until every
// session sent has one. Only SaveState reads ctl (never concurrently).
// Other bytes are the guest's noise and count for nothing.
func (in *instance) waitSessionsClosed(ctx context.Context, ctl *net.UnixConn) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(sessionEndTimeout)
	}
	if err := ctl.SetReadDeadline(deadline); err != nil {
		return err
	}
	defer func() { _ = ctl.SetReadDeadline(time.Time{}) }()
	var buf [64]byte
	for {
		in.mu.Lock()
		left := in.sessions - in.closed
		in.mu.Unlock()
		if left <= 0 {
			return nil
		}
		n, err := ctl.Read(buf[:min(left, len(buf))])
		in.mu.Lock()
		in.closed += bytes.Count(buf[:n], []byte{agentapi.SessionClosed})
		in.mu.Unlock()
		if err != nil {
			return fmt.Errorf("the agent did not close its session: %w", err)
		}
	}
}

// SaveState checkpoints the sandbox into dir (runsc checkpoint): its
// memory, the kernel's state and its writes to the root (the overlay's
// upper layer lives in the sandbox's memory file). Restore it with
// Spec.RestoreFrom = dir. The caller has closed the agent session first;
// o.NewRootDisk has no use here (the root's writes are in the state) and
// is ignored.
func (in *instance) SaveState(ctx context.Context, dir string, o runtime.SaveOptions) error {
	in.mu.Lock()
	if in.state != stateRunning || in.ctl == nil {
		in.mu.Unlock()
		return runtime.ErrNotRunning
	}
	if in.agent != nil && !in.agentTaken {
		// Never taken: end the session here.
		in.agent.Close()
		in.agent, in.agentTaken = nil, true
	}
	ctl := in.ctl
	in.mu.Unlock()
	if err := in.waitSessionsClosed(ctx, ctl); err != nil {
		in.allowRedial()
		return fmt.Errorf("gvisor save: %w", err)
	}

	in.mu.Lock()
	in.saving = !o.KeepRunning
	in.mu.Unlock()
	args := []string{"--root=" + in.paths.root, "checkpoint", "--image-path=" + dir, "--exclude-committed-zero-pages"}
	if o.KeepRunning {
		args = append(args, "--leave-running")
	}
	// After a failure a pause may have stopped the sandbox halfway: end it;
	// a live save goes on, on a new session.
	failed := func(err error) error {
		if !o.KeepRunning {
			_ = in.Kill()
		} else {
			in.allowRedial()
		}
		return err
	}
	t0 := time.Now()
	out, err := exec.CommandContext(ctx, in.rt.cfg.RunscPath, append(args, in.cid)...).CombinedOutput()
	if err != nil {
		return failed(fmt.Errorf("runsc checkpoint: %w: %s", err, lastLine(out)))
	}
	in.log.Debug("checkpoint", "dir", dir, "took", time.Since(t0), "live", o.KeepRunning)
	// The agent's digest goes with the state (and into its digest): a
	// restore binds the same binary (agent.go).
	if err := os.WriteFile(filepath.Join(dir, AgentStateFile), []byte(in.agentSum+"\n"), 0o444); err != nil {
		return failed(fmt.Errorf("gvisor save: %w", err))
	}
	if err := readOnly(dir); err != nil {
		return failed(err)
	}
	if o.KeepRunning {
		in.allowRedial()
		return nil
	}
	// The sandbox stops after the checkpoint, and `runsc run` with it.
	select {
	case <-in.done:
		return nil
	case <-ctx.Done():
		_ = in.Kill()
		return fmt.Errorf("gvisor save: wait for the sandbox to stop: %w", context.Cause(ctx))
	}
}

// allowRedial lets AgentConn send one more session.
func (in *instance) allowRedial() {
	in.mu.Lock()
	in.redial = true
	in.mu.Unlock()
}

// readOnly makes the files directly in dir read-only.
func readOnly(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if e.Type().IsRegular() {
			errs = append(errs, os.Chmod(filepath.Join(dir, e.Name()), 0o400))
		}
	}
	return errors.Join(errs...)
}

// lastLine is the last non-empty line of a command's output, for an error.
func lastLine(out []byte) string {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	l := string(bytes.TrimSpace(lines[len(lines)-1]))
	if len(l) > 300 {
		l = l[:300]
	}
	return l
}
