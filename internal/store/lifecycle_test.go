package store

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// wantAllowed is the state machine as docs/ARCHITECTURE.md states it,
// written out independently of the table in lifecycle.go.
var wantAllowed = map[[2]State]bool{
	{StateCreating, StateRunning}: true,
	{StateCreating, StateFailed}:  true,
	{StateRunning, StatePausing}:  true,
	{StateRunning, StateStopping}: true,
	{StateRunning, StateFailed}:   true,
	{StatePausing, StatePaused}:   true,
	{StatePausing, StateFailed}:   true,
	{StatePaused, StateResuming}:  true,
	{StateResuming, StateRunning}: true,
	{StateResuming, StatePaused}:  true,
	{StateResuming, StateFailed}:  true,
	{StateStopping, StateFailed}:  true,
}

func openTest(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.Context(), catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRow(t *testing.T, s *Store, id string, st State) {
	t.Helper()
	now := time.Now()
	if err := s.CreateSandbox(t.Context(), Sandbox{ID: id, State: st, Image: "base", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
}

// TestTransitionEveryPair drives every (from, to) pair of states through
// Transition: the allowed ones change the row, every other one is refused
// with ErrFailedPrecondition and changes nothing.
func TestTransitionEveryPair(t *testing.T) {
	s := openTest(t)
	ctx := t.Context()
	if len(transitions) != len(wantAllowed) {
		t.Errorf("the table has %d transitions, the spec %d", len(transitions), len(wantAllowed))
	}
	seen := map[[2]State]bool{}
	for _, tr := range transitions {
		if seen[[2]State{tr.From, tr.To}] || tr.Event == "" {
			t.Errorf("transition %s -> %s listed twice or without its event", tr.From, tr.To)
		}
		seen[[2]State{tr.From, tr.To}] = true
	}
	allowed, refused := 0, 0
	for i, from := range States {
		for j, to := range States {
			id := fmt.Sprintf("sb-%d-%d", i, j)
			newRow(t, s, id, from)
			got, err := s.Transition(ctx, id, Change{To: to, Reason: "why"})
			row, gerr := s.GetSandbox(ctx, id)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if wantAllowed[[2]State{from, to}] {
				allowed++
				if err != nil || got.State != to || row.State != to || row.Reason != "why" {
					t.Errorf("%s -> %s: allowed, but %v (returned %s, row %s %q)", from, to, err, got.State, row.State, row.Reason)
				}
				if !Allowed(from, to) {
					t.Errorf("Allowed(%s, %s) = false", from, to)
				}
				continue
			}
			refused++
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || row.State != from || row.Reason != "" {
				t.Errorf("%s -> %s: forbidden, but %v (row %s %q)", from, to, err, row.State, row.Reason)
			}
			if Allowed(from, to) {
				t.Errorf("Allowed(%s, %s) = true", from, to)
			}
		}
	}
	if allowed != len(wantAllowed) || allowed+refused != len(States)*len(States) || len(States) != 7 {
		t.Errorf("drove %d allowed and %d forbidden pairs over %d states", allowed, refused, len(States))
	}
}

// TestTransitionOwnership: the compare-and-set on the state seen and the
// owner generation, the claim, and what a change to paused records.
func TestTransitionOwnership(t *testing.T) {
	s := openTest(t)
	ctx := t.Context()
	if _, err := s.Transition(ctx, "none", Change{To: StateRunning}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
	newRow(t, s, "a", StateCreating)
	sb, err := s.GetSandbox(ctx, "a")
	if err != nil || sb.Gen != 1 {
		t.Fatalf("new row: gen %d, %v", sb.Gen, err)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StateRunning, Gen: 2}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("another generation's change: %v", err)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StateRunning, From: StateResuming}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("change from a state the row is not in: %v", err)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StateRunning, Gen: 1, From: StateCreating}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StatePausing, Gen: 1, Claim: true}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("claim on running -> pausing: %v", err)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StatePausing, Gen: 1}); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	sb, err = s.Transition(ctx, "a", Change{To: StatePaused, Gen: 1, LifetimeLeft: 90 * time.Second})
	if err != nil || sb.LifetimeLeft != 90*time.Second || sb.PausedAt.Before(before.Add(-time.Millisecond)) {
		t.Fatalf("paused: %+v, %v", sb, err)
	}
	// Concurrent resumes: exactly one claims the next generation; the
	// old generation can change nothing after.
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, lost := 0, 0
	for range 8 {
		wg.Go(func() {
			_, err := s.Transition(ctx, "a", Change{To: StateResuming, From: StatePaused, Claim: true})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, errdefs.ErrConflict):
				lost++
			default:
				t.Errorf("claim: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || lost != 7 {
		t.Fatalf("claims: %d won, %d lost", won, lost)
	}
	if sb, _ := s.GetSandbox(ctx, "a"); sb.Gen != 2 || sb.State != StateResuming {
		t.Fatalf("after the claim: %s gen %d", sb.State, sb.Gen)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StateFailed, Gen: 1}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the old generation failed the new one: %v", err)
	}
	if _, err := s.Transition(ctx, "a", Change{To: StateRunning, Gen: 2}); err != nil {
		t.Fatal(err)
	}
}
