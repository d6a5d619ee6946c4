package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The sandbox state machine. transitions lists every allowed change of a
// sandbox's state, once (transitions); Store.Transition is the only way to change one
// (a row is inserted in StateCreating by CreateSandbox and leaves the
// catalog with DeleteSandbox, from any state).
//
// # Ownership: generations and the shim lock
//
// A sandbox that is alive (creating, resuming, running, pausing, stopping)
// is owned by one shim. Each row carries a generation, Sandbox.Gen: 1 at
// create, incremented by the claim paused -> resuming (Change.Claim). The
// control plane claims a generation only while it holds the sandbox's shim
// lock (an exclusive flock on sandboxes/<id>/shim.lock), and hands that
// very lock, an inherited file descriptor, to the shim it starts; the shim
// holds it until it exits. So from the claim on, the lock is held for as
// long as the owner of the row's generation lives, and:
//
//   - Reconcile declares an alive sandbox's owner gone only when the lock
//     is free, which is then proof (no age heuristics), and writes its
//     verdict with Change.From and Change.Gen set to what it read: a row
//     that moved on meanwhile (paused, claimed again) is left alone.
//   - A shim writes every change with Change.Gen set to the generation it
//     found when it started: a shim of an older generation can never
//     change the row of a newer one.
type transition struct {
	From, To State
	// Event names the change: what happened, and who writes it.
	Event string
}

// transitions is the state machine: every allowed (from, to) pair. Any
// other pair, a state to itself included, is refused.
var transitions = []transition{
	{StateCreating, StateRunning, "ready: the shim's guest answers (shim)"},
	{StateCreating, StateFailed, "start failed (shim), or its shim is gone (reconcile)"},
	{StateRunning, StatePausing, "pause: the shim saves the guest (shim)"},
	{StateRunning, StateStopping, "stop: rm or end of lifetime (shim)"},
	{StateRunning, StateFailed, "guest or VMM died, shim signalled (shim), or its shim is gone (reconcile)"},
	{StatePausing, StatePaused, "saved (shim), or its shim is gone after a whole save (reconcile)"},
	{StatePausing, StateFailed, "save failed (shim), or its shim is gone without a whole save (reconcile)"},
	{StatePaused, StateResuming, "resume: claims a new generation (control plane, holding the shim lock)"},
	{StateResuming, StateRunning, "ready: the restored guest answers (shim)"},
	{StateResuming, StatePaused, "resume failed, saved state kept (shim), or its shim is gone (reconcile)"},
	{StateResuming, StateFailed, "its shim is gone and the saved state with it (reconcile)"},
	{StateStopping, StateFailed, "its shim is gone before the row was deleted (reconcile)"},
}

// States lists every lifecycle state.
var States = []State{StateCreating, StateRunning, StateStopping, StateFailed, StatePausing, StatePaused, StateResuming}

// Allowed reports whether the state machine allows from -> to.
func Allowed(from, to State) bool {
	return slices.ContainsFunc(transitions, func(t transition) bool { return t.From == from && t.To == to })
}

// Alive reports whether a sandbox in state st has (or is about to have) a
// shim that owns it.
func (st State) Alive() bool {
	switch st {
	case StateCreating, StateRunning, StateStopping, StatePausing, StateResuming:
		return true
	}
	return false
}

// Change is one state change for Store.Transition.
type Change struct {
	To     State
	Reason string // why (failed, or a failed resume); "" clears it
	// From, if set, is the state the caller saw: the change is refused
	// (ErrConflict) if the row is in another one.
	From State
	// Gen, if not 0, is the caller's generation: the change is refused
	// (ErrConflict) if the row has another one.
	Gen int64
	// Claim increments the row's generation: the caller (holding the shim
	// lock) takes ownership for a new shim. Only paused -> resuming.
	Claim bool
	// LifetimeLeft is recorded with a change to paused: the running time
	// the sandbox has left (at least a second); PausedAt becomes now.
	LifetimeLeft time.Duration
}

// Transition applies c to sandbox id atomically (one immediate
// transaction: a compare-and-set on the current state and generation) and
// returns the row after it. It fails with ErrNotFound if there is no such
// sandbox, ErrConflict if c.From or c.Gen do not match the row, and
// ErrFailedPrecondition if the state machine has no edge from the current
// state to c.To.
func (s *Store) Transition(ctx context.Context, id string, c Change) (Sandbox, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var cur string
	var gen int64
	err = tx.QueryRowContext(ctx, `SELECT state, gen FROM sandboxes WHERE id = ?`, id).Scan(&cur, &gen)
	if errors.Is(err, sql.ErrNoRows) {
		return Sandbox{}, fmt.Errorf("%w: no sandbox %q (see `airlock ls`)", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	from := State(cur)
	switch {
	case c.From != "" && from != c.From:
		return Sandbox{}, fmt.Errorf("%w: sandbox %s is %s, not %s", errdefs.ErrConflict, id, from, c.From)
	case c.Gen != 0 && gen != c.Gen:
		return Sandbox{}, fmt.Errorf("%w: sandbox %s is owned by generation %d, not %d", errdefs.ErrConflict, id, gen, c.Gen)
	case !Allowed(from, c.To):
		return Sandbox{}, fmt.Errorf("%w: sandbox %s is %s: it cannot become %s", errdefs.ErrFailedPrecondition, id, from, c.To)
	case c.Claim && (from != StatePaused || c.To != StateResuming):
		return Sandbox{}, fmt.Errorf("%w: sandbox %s: only a resume claims a generation", errdefs.ErrFailedPrecondition, id)
	}
	q := `UPDATE sandboxes SET state = ?, reason = ?`
	args := []any{string(c.To), c.Reason}
	if c.Claim {
		q += `, gen = gen + 1`
	}
	if c.To == StatePaused && from == StatePausing {
		q += `, lifetime_left_ms = ?, paused_at = ?`
		args = append(args, max(c.LifetimeLeft, time.Second).Milliseconds(), time.Now().UnixNano())
	}
	if _, err := tx.ExecContext(ctx, q+` WHERE id = ?`, append(args, id)...); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s %s -> %s: %w", id, from, c.To, err)
	}
	sb, err := scanSandbox(tx.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s %s -> %s: %w", id, from, c.To, err)
	}
	return sb, nil
}
