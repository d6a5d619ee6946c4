package sandbox

import (
	"cmp"
	"context"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
)

// Actor is who asks for an exec, for the audit trail.
type Actor struct{ Tenant, KeyID string }

// Exec starts spec in sandbox sandboxID for c and returns the exec's stream
// once the guest reported its pid (stream.Info). This is the one way every
// surface (CLI, API, MCP) runs a command. The exec belongs to the sandbox's
// shim: it outlives ctx, the stream, the caller and the caller's process,
// and ends when it exits (or its timeout fires) or the sandbox goes away;
// with killOnDetach it is killed when its last attacher (this stream or a
// later AttachExec) goes away first. The shim merges the sandbox's default
// environment under spec.Env and records exec.start and exec.exit for c.
//
// It validates spec, reads the sandbox once (resuming a paused one) and
// opens one stream on the shim's pooled connection. The caller closes the
// stream. Errors: ErrInvalid for a bad spec, ErrNotFound when c may not see
// the sandbox, ErrFailedPrecondition when it is not running,
// ErrResourceExhausted when too many execs run.
func (m *Manager) Exec(ctx context.Context, c Caller, sandboxID string, spec guest.ExecSpec, killOnDetach bool) (guest.ExecStream, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	sb, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return nil, err
	}
	// A template's WORKDIR and USER, for an exec that names neither.
	spec.Cwd = cmp.Or(spec.Cwd, sb.ExecDefaults.Cwd)
	spec.User = cmp.Or(spec.User, sb.ExecDefaults.User)
	a := c.Actor()
	return sc.Exec(ctx, spec, shimclient.StartOptions{Tenant: a.Tenant, KeyID: a.KeyID, KillOnDetach: killOnDetach})
}

// AttachExec joins a known exec of the sandbox: its stream replays the
// output the shim retained (the last 4 MiB, preceded by a stderr note if
// older output was dropped) when fromStart, then live output, then exactly
// one exit. Closing the stream (or ending ctx) detaches. An attacher that
// falls more than 4 MiB behind is cut off with ErrResourceExhausted.
// guest.ErrNoExec (an ErrNotFound) for an unknown exec.
func (m *Manager) AttachExec(ctx context.Context, c Caller, sandboxID, execID string, fromStart bool) (guest.ExecStream, error) {
	return m.attach(ctx, c, sandboxID, execID, shimclient.AttachOptions{FromStart: fromStart})
}

// ExecControl opens a stream to a known exec without its output, for
// stdin and signals; Finish reports whether all of it reached the guest.
// guest.ErrNoExec for an unknown exec.
func (m *Manager) ExecControl(ctx context.Context, c Caller, sandboxID, execID string) (guest.ExecStream, error) {
	return m.attach(ctx, c, sandboxID, execID, shimclient.AttachOptions{Control: true})
}

func (m *Manager) attach(ctx context.Context, c Caller, sandboxID, execID string, o shimclient.AttachOptions) (guest.ExecStream, error) {
	_, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return nil, err
	}
	return sc.Attach(ctx, execID, o)
}

// ListExecs returns the sandbox's running execs and its 100 most recently
// finished ones, oldest first.
func (m *Manager) ListExecs(ctx context.Context, c Caller, sandboxID string) ([]guest.ExecInfo, error) {
	_, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return nil, err
	}
	return sc.ListExecs(ctx)
}

// GetExec returns one exec; guest.ErrNoExec if the shim does not know it
// (or has forgotten it: only the 100 most recent finished execs are kept).
func (m *Manager) GetExec(ctx context.Context, c Caller, sandboxID, execID string) (guest.ExecInfo, error) {
	_, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return guest.ExecInfo{}, err
	}
	return sc.GetExec(ctx, execID)
}

// ShimDials reports how many connections the manager has dialed to
// sandbox id's shim (tests and benchmarks check that calls share one).
func (m *Manager) ShimDials(id string) int { return m.shims().Get(m.L.Socket(id)).Dials() }
