package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// EgressPolicy is a sandbox's egress policy as a live change gives it: a
// mode ("public", "deny" or "none"; "" with rules means deny) and allow
// rules in the create flags' syntax (policy.ParsePolicy).
type EgressPolicy struct {
	Mode  string
	Allow []string
}

// NetworkChange is what SetNetwork did.
type NetworkChange struct {
	// Network is the sandbox's network after the change.
	Network netconf.Spec
	// Closed counts the open TCP connections and UDP flows the new
	// policy closed (0 for a paused sandbox).
	Closed int
	// Applied is "running" when the running sandbox enforces the new
	// policy now, or "resume" when it is stored for the sandbox's resume.
	Applied string
}

// pushTimeout bounds the shim's SetPolicy: it answers from memory.
const pushTimeout = 15 * time.Second

// SetNetwork replaces the egress policy of c's sandbox id with p, whole:
// rules not in p are gone (secrets, published ports and limits stay).
// It validates p as create does, refuses a caller that is not an admin a
// rule that opens the platform floor (a *FloorError, as create), stores
// the new policy in the catalog and, for a running sandbox, has its shim
// enforce it at once (new connections decided by it, open ones it forbids
// closed). A paused sandbox gets it when it resumes. Audited as
// sandbox.network with the old and new policy. Errors: ErrInvalid (a bad
// rule or mode, mode none in or out), ErrFailedPrecondition (a sandbox
// that is neither running nor paused), *FloorError, ErrUnavailable (the
// shim did not take it: nothing changed).
func (m *Manager) SetNetwork(ctx context.Context, c Caller, id string, p EgressPolicy) (NetworkChange, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return NetworkChange{}, err
	}
	if _, err := sb.Network.WithEgress(p.Mode, p.Allow); err != nil {
		return NetworkChange{}, err
	}
	if !c.Admin {
		if err := CheckFloor(netconf.Spec{Mode: p.Mode, Allow: p.Allow}); err != nil {
			return NetworkChange{}, err
		}
	}
	// One change at a time: each reads the row it replaces.
	m.netMu.Lock()
	defer m.netMu.Unlock()
	sb, err = m.get(ctx, id)
	if err != nil {
		return NetworkChange{}, err
	}
	old := sb.Network
	next, err := old.WithEgress(p.Mode, p.Allow)
	if err != nil {
		return NetworkChange{}, err
	}
	var ch NetworkChange
	switch sb.State {
	case store.StateRunning:
		ch, err = m.setRunningNetwork(ctx, sb, next)
	case store.StatePaused:
		ch, err = m.setPausedNetwork(ctx, id, next)
	default:
		err = fmt.Errorf("%w: sandbox %s is %s: its network can be changed while it runs or is paused", errdefs.ErrFailedPrecondition, id, sb.State)
	}
	if err != nil {
		return NetworkChange{}, err
	}
	m.audit(ctx, c, id, "sandbox.network", map[string]any{
		"old": PolicyAudit(old), "new": PolicyAudit(next), "closed": ch.Closed, "applied": ch.Applied,
	})
	return ch, nil
}

// setRunningNetwork stores next and has sb's shim enforce it. If the shim
// refuses it or cannot be reached while it still runs, the stored policy
// is put back: the catalog never claims a policy the sandbox does not
// enforce. A shim that is gone (the sandbox paused or stopped meanwhile)
// leaves next stored, for its resume.
func (m *Manager) setRunningNetwork(ctx context.Context, sb store.Sandbox, next netconf.Spec) (NetworkChange, error) {
	if err := m.Store.SetNetwork(ctx, sb.ID, next); err != nil {
		return NetworkChange{}, err
	}
	pctx, cancel := context.WithTimeout(ctx, pushTimeout)
	closed, err := m.shims().Get(m.L.Socket(sb.ID)).SetPolicy(pctx, next.Mode, next.Allow)
	cancel()
	if err == nil {
		return NetworkChange{Network: next, Closed: closed, Applied: "running"}, nil
	}
	if cur, gerr := m.get(ctx, sb.ID); gerr == nil && cur.State == store.StatePaused {
		return NetworkChange{Network: next, Applied: "resume"}, nil
	}
	if rerr := m.Store.SetNetwork(context.WithoutCancel(ctx), sb.ID, sb.Network); rerr != nil {
		return NetworkChange{}, errors.Join(err, fmt.Errorf("restore the stored policy: %w", rerr))
	}
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		return NetworkChange{}, err
	}
	return NetworkChange{}, fmt.Errorf("%w: sandbox %s: its supervisor did not take the new policy; nothing changed: %w", errdefs.ErrUnavailable, sb.ID, err)
}

// setPausedNetwork stores next for a paused sandbox's resume, holding the
// shim lock so that no resume starts a shim on the old policy meanwhile.
func (m *Manager) setPausedNetwork(ctx context.Context, id string, next netconf.Spec) (NetworkChange, error) {
	if err := m.whilePaused(ctx, id, func() error { return m.Store.SetNetwork(ctx, id, next) }); err != nil {
		return NetworkChange{}, err
	}
	return NetworkChange{Network: next, Applied: "resume"}, nil
}

// whilePaused runs change while sandbox id is paused and holds the shim
// lock, so that no resume starts a shim on the state change replaces.
func (m *Manager) whilePaused(ctx context.Context, id string, change func() error) error {
	lock, err := m.takeShimLock(id)
	if errors.Is(err, errdefs.ErrConflict) {
		return fmt.Errorf("%w: sandbox %s is resuming; retry", errdefs.ErrFailedPrecondition, id)
	}
	if err != nil {
		return err
	}
	defer lock.Close()
	sb, err := m.Store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State != store.StatePaused {
		return fmt.Errorf("%w: sandbox %s is %s; retry", errdefs.ErrFailedPrecondition, id, sb.State)
	}
	return change()
}

// FloorError is an allow rule that opens the platform floor (private,
// loopback, link-local, metadata or the host's addresses): only an admin
// may (threat 62). It matches errdefs.ErrPermissionDenied; its text names
// only the caller's own rule.
type FloorError struct{ Rule string }

func (e *FloorError) Error() string {
	return "network.allow " + strconv.Quote(e.Rule) + " opens private, loopback, link-local or metadata addresses, which needs an admin key"
}

func (e *FloorError) Is(target error) bool { return target == errdefs.ErrPermissionDenied }

// CheckFloor returns a *FloorError for the first allow rule of n that
// opens the platform floor; a policy that does not parse is left to the
// validation that reports it. Surfaces call it for callers that are not
// admins, on create and on a live change alike.
func CheckFloor(n netconf.Spec) error {
	p, err := n.Policy()
	if err != nil {
		return nil
	}
	if r := p.OpensFloor(); r != nil {
		return &FloorError{Rule: r.Text}
	}
	return nil
}

// maxAuditRules bounds the rules an audit event lists.
const maxAuditRules = 32

// PolicyAudit is the audit detail of a network's egress policy: its mode
// and allow rules (the first maxAuditRules, with the count).
func PolicyAudit(n netconf.Spec) map[string]any {
	mode := n.Mode
	if mode == "" {
		mode = "public"
	}
	d := map[string]any{"mode": mode, "rules": len(n.Allow)}
	if len(n.Allow) > 0 {
		d["allow"] = slices.Clone(n.Allow[:min(len(n.Allow), maxAuditRules)])
	}
	return d
}
