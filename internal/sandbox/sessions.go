package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv1"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv1/shimv1connect"
)

// Actor is who asks for an exec, for the audit trail.
type Actor struct{ Tenant, KeyID string }

// ExecInfo describes an exec owned by a sandbox's shim (an exec session).
type ExecInfo struct {
	ID        string // 16 characters [a-z2-7]
	Argv      []string
	PID       int
	State     string // "running" or "exited"
	StartedAt time.Time
	EndedAt   time.Time           // zero while running
	Exit      *agentv1.ExecExited // nil while running
}

// Exec states.
const (
	ExecStateRunning = "running"
	ExecStateExited  = "exited"
)

var execIDRe = regexp.MustCompile(`^[a-z2-7]{16}$`)

// inputChunk is the most stdin data one Input call to the shim carries.
const inputChunk = 1 << 20

// withSessions is withClient for the shim's SessionService.
func (m *Manager) withSessions(ctx context.Context, sandboxID, step string, call func(shimv1connect.SessionServiceClient) error) error {
	return withClient(ctx, m.sessionClient, sandboxID, step, call)
}

// sessionClient returns a SessionService client for a running sandbox's
// shim and a func that closes its connection (call it after every stream
// from the client is closed).
func (m *Manager) sessionClient(ctx context.Context, sandboxID string) (shimv1connect.SessionServiceClient, func(), error) {
	if err := m.requireRunning(ctx, sandboxID); err != nil {
		return nil, nil, err
	}
	hc, closeFn := shimHTTPClient(m.L.Socket(sandboxID))
	c := shimv1connect.NewSessionServiceClient(hc, "http://shim",
		connect.WithReadMaxBytes(8<<20), connect.WithAcceptCompression("gzip", nil, nil))
	return c, closeFn, nil
}

func execInfo(in *shimv1.ExecInfo) ExecInfo {
	e := ExecInfo{
		ID: in.GetExecId(), Argv: slices.Clone(in.GetArgv()), PID: int(in.GetPid()), State: ExecStateRunning,
		StartedAt: time.Unix(0, in.GetStartedAt()), Exit: in.GetExit(),
	}
	if in.GetState() == shimv1.ExecState_EXEC_STATE_EXITED {
		e.State, e.EndedAt = ExecStateExited, time.Unix(0, in.GetEndedAt())
	}
	return e
}

// checkExecID returns an error wrapping ErrNotFound for anything that is not
// an exec id (so no malformed id reaches the shim).
// NewExecID returns a fresh random exec id (16 characters [a-z2-7]).
func NewExecID() string { return randomID(16) }

// ValidExecID reports whether id has the form of an exec id.
func ValidExecID(id string) bool { return execIDRe.MatchString(id) }

func checkExecID(id string) error {
	if !ValidExecID(id) {
		return fmt.Errorf("%w: no exec %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// StartExec starts an exec owned by the sandbox's shim and returns once the
// guest reported its pid. The exec outlives ctx, the caller and the
// caller's process: it ends when it exits (or its timeout fires) or the
// sandbox goes away. The shim records exec.start and exec.exit events for
// actor. With killOnDetach the process is killed when its last attacher
// (AttachExec) goes away before it exits. start is sent as is: the
// sandbox's default env is the caller's to merge. Errors: ErrFailedPrecondition
// if the sandbox is not running, ErrInvalid for a bad start,
// ErrResourceExhausted when too many execs run.
func (m *Manager) StartExec(ctx context.Context, sandboxID string, start *agentv1.ExecStart, actor Actor, killOnDetach bool) (ExecInfo, error) {
	var info ExecInfo
	err := m.withSessions(ctx, sandboxID, "start exec", func(c shimv1connect.SessionServiceClient) error {
		resp, err := c.Start(ctx, connect.NewRequest(&shimv1.StartRequest{
			Start: start, Tenant: actor.Tenant, KeyId: actor.KeyID, KillOnDetach: killOnDetach,
		}))
		if err == nil {
			info = execInfo(resp.Msg.GetInfo())
		}
		return err
	})
	return info, err
}

// AttachExec calls fn for each event of an exec (stdout/stderr chunks, then
// exactly one exited) and returns nil after the exited event. With
// fromStart the output the shim retained (the last 4 MiB) comes first,
// preceded by a stderr note if older output was dropped; without it, only
// output from now on. An error from fn ends the attach and is returned.
// Ending ctx detaches (the exec keeps running unless it was started with
// killOnDetach and this was its last attacher). An attacher that falls more
// than 4 MiB behind is cut off with ErrResourceExhausted.
func (m *Manager) AttachExec(ctx context.Context, sandboxID, execID string, fromStart bool, fn func(*agentv1.ExecResponse) error) error {
	if err := checkExecID(execID); err != nil {
		return err
	}
	c, closeFn, err := m.sessionClient(ctx, sandboxID)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Attach(ctx, connect.NewRequest(&shimv1.AttachRequest{ExecId: execID, FromStart: fromStart}))
	if err != nil {
		return shimErr(ctx, "attach exec", err)
	}
	defer st.Close()
	return pump(ctx, "attach exec", "an exit status", st, fn, nil,
		func(ev *agentv1.ExecResponse) bool { return ev.GetExited() != nil })
}

// ExecInput writes data to an exec's stdin (it must have been started with
// Stdin set) and then, if closeStdin, closes it. It returns once the shim
// handed the data to the guest. ErrFailedPrecondition if the exec has no
// stdin or has exited.
func (m *Manager) ExecInput(ctx context.Context, sandboxID, execID string, data []byte, closeStdin bool) error {
	if err := checkExecID(execID); err != nil {
		return err
	}
	return m.withSessions(ctx, sandboxID, "exec input", func(c shimv1connect.SessionServiceClient) error {
		for {
			n := min(len(data), inputChunk)
			last := n == len(data)
			if _, err := c.Input(ctx, connect.NewRequest(&shimv1.InputRequest{ExecId: execID, Data: data[:n], Close: last && closeStdin})); err != nil {
				return err
			}
			if last {
				return nil
			}
			data = data[n:]
		}
	})
}

// ExecSignal sends sig (1..64) to an exec's process group.
// ErrFailedPrecondition if the exec has exited.
func (m *Manager) ExecSignal(ctx context.Context, sandboxID, execID string, sig int32) error {
	if err := checkExecID(execID); err != nil {
		return err
	}
	return m.withSessions(ctx, sandboxID, "signal exec", func(c shimv1connect.SessionServiceClient) error {
		_, err := c.Signal(ctx, connect.NewRequest(&shimv1.SignalRequest{ExecId: execID, Signal: sig}))
		return err
	})
}

// ListExecs returns the sandbox's running execs and its 100 most recently
// finished ones, oldest first.
func (m *Manager) ListExecs(ctx context.Context, sandboxID string) ([]ExecInfo, error) {
	var out []ExecInfo
	err := m.withSessions(ctx, sandboxID, "list execs", func(c shimv1connect.SessionServiceClient) error {
		resp, err := c.List(ctx, connect.NewRequest(&shimv1.ListRequest{}))
		if err != nil {
			return err
		}
		out = make([]ExecInfo, 0, len(resp.Msg.GetExecs()))
		for _, in := range resp.Msg.GetExecs() {
			out = append(out, execInfo(in))
		}
		return nil
	})
	return out, err
}

// GetExec returns one exec; ErrNotFound if the shim does not know it (or
// has forgotten it: only the 100 most recent finished execs are kept).
func (m *Manager) GetExec(ctx context.Context, sandboxID, execID string) (ExecInfo, error) {
	if err := checkExecID(execID); err != nil {
		return ExecInfo{}, err
	}
	var info ExecInfo
	err := m.withSessions(ctx, sandboxID, "get exec", func(c shimv1connect.SessionServiceClient) error {
		resp, err := c.Get(ctx, connect.NewRequest(&shimv1.GetRequest{ExecId: execID}))
		if err == nil {
			info = execInfo(resp.Msg)
		}
		return err
	})
	return info, err
}
