package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// MaxIdlePause bounds CreateOptions.IdlePause.
const MaxIdlePause = 7 * 24 * time.Hour

// resumeWait bounds how long a call waits for another caller's resume.
const resumeWait = 2 * time.Minute

// PauseResult says what a pause saved.
type PauseResult = guest.PauseResult

// Pause saves c's running sandbox's memory, devices and disk and ends its
// VMM and shim: a paused sandbox costs disk only. Commands still running
// are parked in the guest and go on after the resume (their streams end
// with guest.ErrExecPaused); with force they are ended, and so is running
// code, which otherwise refuses the pause. Pausing a
// paused sandbox does nothing. Audited as sandbox.pause (no-ops too).
func (m *Manager) Pause(ctx context.Context, c Caller, id string, force bool) (PauseResult, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return PauseResult{}, err
	}
	if sb.State == store.StateRunning {
		if err := m.CheckSpace(ctx, fmt.Sprintf("this sandbox's memory state (%d MiB)", sb.MemoryMiB), int64(sb.MemoryMiB)<<20); err != nil {
			return PauseResult{}, err
		}
	}
	res, err := m.pause(ctx, id, force)
	if err != nil {
		return res, err
	}
	m.audit(ctx, c, id, "sandbox.pause", map[string]any{"force": force, "was": string(sb.State),
		"state_bytes": res.StateBytes, "save_ms": res.Save.Milliseconds()})
	return res, nil
}

func (m *Manager) pause(ctx context.Context, id string, force bool) (PauseResult, error) {
	sb, err := m.get(ctx, id)
	if err != nil {
		return PauseResult{}, err
	}
	if sb.State == store.StatePaused {
		return PauseResult{}, nil
	}
	if sb.State != store.StateRunning {
		return PauseResult{}, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrFailedPrecondition, id, sb.State)
	}
	sock := m.L.Socket(id)
	res, err := m.shims().Get(sock).Pause(ctx, force)
	if err != nil {
		return PauseResult{}, err
	}
	// The shim exits: its connection goes (a resume starts a new shim).
	m.shims().Drop(sock)
	if err := m.waitShimGone(ctx, id, 20*time.Second); err != nil {
		return PauseResult{}, err
	}
	return res, nil
}

// Resume restores c's paused sandbox and returns once its guest answers,
// with every process and its memory as they were. Resuming a running
// sandbox does nothing; concurrent resumes share one. Audited as
// sandbox.resume.
func (m *Manager) Resume(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return sb, err
	}
	start := time.Now()
	cur, err := m.resume(ctx, id)
	if err != nil {
		return cur, err
	}
	m.audit(ctx, c, id, "sandbox.resume", map[string]any{"was": string(sb.State), "duration_ms": time.Since(start).Milliseconds()})
	return cur, nil
}

// resume is Resume for the manager's own use (any call to a paused
// sandbox resumes it): whoever owns id, no audit.
func (m *Manager) resume(ctx context.Context, id string) (store.Sandbox, error) {
	deadline := time.Now().Add(resumeWait)
	for {
		sb, err := m.get(ctx, id)
		if err != nil {
			return sb, err
		}
		switch sb.State {
		case store.StateRunning:
			return sb, nil
		case store.StatePaused:
			// Claim a new generation while holding the shim lock, and hand
			// the lock to the shim (store.Transition). A busy lock is the
			// shim that just paused it still exiting: wait for it.
			lock, err := m.takeShimLock(id)
			if errors.Is(err, errdefs.ErrConflict) {
				break
			}
			if err != nil {
				return sb, err
			}
			// Its bundle is stale from now on: gone before the guest runs,
			// so that no other node resumes an older copy.
			if err := m.dropBundle(ctx, id); err != nil {
				lock.Close()
				return sb, fmt.Errorf("%w: its bundle cannot be dropped before it resumes: %v", errdefs.ErrUnavailable, err)
			}
			claimed, err := m.Store.Transition(ctx, id, store.Change{To: store.StateResuming, From: store.StatePaused, Claim: true})
			if errors.Is(err, errdefs.ErrConflict) {
				lock.Close()
				continue // another caller got there first
			}
			if err != nil {
				lock.Close()
				return sb, err
			}
			var secrets netconf.Values
			if len(claimed.Network.Secrets) > 0 {
				// Bound again from their sealed copy (sealed.go).
				if secrets, err = m.openSecrets(id); err != nil {
					// Back to paused, saying why; the lifetime left stays.
					_, _ = m.Store.Transition(context.WithoutCancel(ctx), id, store.Change{To: store.StatePaused, Gen: claimed.Gen,
						Reason: "last resume failed: " + err.Error(), LifetimeLeft: claimed.LifetimeLeft})
					lock.Close()
					return sb, fmt.Errorf("%w: %v", errdefs.ErrFailedPrecondition, err)
				}
			}
			if err := m.startShim(ctx, claimed, secrets, "", lock); err != nil {
				// The shim put the sandbox back to paused (saying why), or
				// it is gone and the next Reconcile does.
				return sb, err
			}
			return m.get(ctx, id)
		case store.StateResuming, store.StatePausing:
			// Another caller's resume (or a pause finishing): wait.
		default:
			msg := fmt.Sprintf("sandbox %s is %s", id, sb.State)
			if sb.Reason != "" {
				msg += ": " + sb.Reason
			}
			return sb, fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, msg)
		}
		if time.Now().After(deadline) {
			return sb, fmt.Errorf("%w: sandbox %s stayed %s for %s", errdefs.ErrUnavailable, id, sb.State, resumeWait)
		}
		select {
		case <-ctx.Done():
			return sb, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Touch counts as activity for the idle timer of c's sandbox (a
// keepalive), answered by its shim without the guest. A paused sandbox is
// resumed, like for any other call.
func (m *Manager) Touch(ctx context.Context, c Caller, id string) error {
	_, sc, err := m.running(ctx, c, id)
	if err != nil {
		return err
	}
	return sc.Touch(ctx)
}

// Stats returns what sandbox id's shim knows of it without asking the guest
// (a paused sandbox is resumed first). Stats is not activity.
func (m *Manager) Stats(ctx context.Context, c Caller, id string) (guest.Stats, error) {
	_, sc, err := m.running(ctx, c, id)
	if err != nil {
		return guest.Stats{}, err
	}
	return sc.Stats(ctx)
}

// Usage asks sandbox id's guest for its resource use (a paused sandbox is
// resumed first, as for Stats). Not activity.
func (m *Manager) Usage(ctx context.Context, c Caller, id string) (guest.Usage, error) {
	_, sc, err := m.running(ctx, c, id)
	if err != nil {
		return guest.Usage{}, err
	}
	return sc.Usage(ctx)
}

// SampleUsage is Usage for metrics: it asks a running sandbox's guest only.
// A sandbox in any other state is ErrFailedPrecondition and is left as it
// is (a paused one is not resumed). It acts for the server, not a tenant,
// and is not activity.
func (m *Manager) SampleUsage(ctx context.Context, id string) (guest.Usage, error) {
	sb, err := m.get(ctx, id)
	if err != nil {
		return guest.Usage{}, err
	}
	if sb.State != store.StateRunning {
		return guest.Usage{}, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrFailedPrecondition, id, sb.State)
	}
	return m.shims().Get(m.L.Socket(id)).Usage(ctx)
}
