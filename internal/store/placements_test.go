package store

import (
	"errors"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// TestPlacements: reservations hold quotas, also when made at once from
// many goroutines; a bound placement is found by its sandbox; a lost
// node's placements stop counting.
func TestPlacements(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	q := PlacementQuota{MaxSandboxes: 5, MaxVCPUs: 8, MaxMemoryMiB: 4096}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []Placement
	over := 0
	for i := range 12 {
		wg.Go(func() {
			p, err := s.ReservePlacement(ctx, Placement{Tenant: "acme", Node: []string{"n1", "n2"}[i%2], CPUs: 1, MemoryMiB: 512}, q)
			mu.Lock()
			defer mu.Unlock()
			var qe *QuotaExceeded
			switch {
			case err == nil:
				won = append(won, p)
			case errors.As(err, &qe) && qe.Quota == "max_sandboxes":
				over++
			default:
				t.Errorf("reserve: %v", err)
			}
		})
	}
	wg.Wait()
	if len(won) != 5 || over != 7 {
		t.Fatalf("12 reservations at once under max 5: %d won, %d over", len(won), over)
	}
	if _, err := s.ReservePlacement(ctx, Placement{Tenant: "other", Node: "n1", CPUs: 9, MemoryMiB: 128}, q); err == nil {
		t.Fatal("9 vCPUs under max 8")
	}
	for i, p := range won {
		if err := s.BindPlacement(ctx, p.ID, "sb"+string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.BindPlacement(ctx, won[0].ID, "again"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("bound twice: %v", err)
	}
	p, err := s.PlacementOf(ctx, "sbb")
	if err != nil || p.Tenant != "acme" || p.State != PlacementPlaced || p.ID != won[1].ID {
		t.Fatalf("placement of sbb: %+v %v", p, err)
	}
	if _, err := s.PlacementOf(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a missing sandbox: %v", err)
	}
	load, err := s.PlacementLoad(ctx)
	if err != nil || load["n1"].Sandboxes+load["n2"].Sandboxes != 5 || load["n1"].MemoryMiB+load["n2"].MemoryMiB != 2560 {
		t.Fatalf("load: %+v %v", load, err)
	}
	n, err := s.MarkNodeLost(ctx, "n1", "its node n1 was lost")
	if err != nil || n != int64(load["n1"].Sandboxes) {
		t.Fatalf("marked %d lost (%v), n1 had %d", n, err, load["n1"].Sandboxes)
	}
	ps, err := s.ListPlacements(ctx, "acme")
	if err != nil || len(ps) != 5 {
		t.Fatalf("list: %d %v", len(ps), err)
	}
	for _, p := range ps {
		if (p.Node == "n1") != (p.State == PlacementLost) || (p.State == PlacementLost && p.Reason != "its node n1 was lost") {
			t.Fatalf("after n1 was lost: %+v", p)
		}
	}
	// Lost ones do not count: room for them again.
	for range n {
		if _, err := s.ReservePlacement(ctx, Placement{Tenant: "acme", Node: "n2", CPUs: 1, MemoryMiB: 512}, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeletePlacement(ctx, won[0].ID); err != nil {
		t.Fatal(err)
	}
}

// TestPlacementRuntime: a placement keeps the runtime and architecture of
// the node it was reserved on, through its bundle and a move.
func TestPlacementRuntime(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, err := s.ReservePlacement(ctx, Placement{Tenant: "acme", Node: "n1", CPUs: 1, MemoryMiB: 512, Runtime: "gvisor", Arch: "arm64"}, PlacementQuota{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.BindPlacement(ctx, p.ID, "sb1"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPlacementBundle(ctx, p.ID, "sha256:b", 10); err != nil {
		t.Fatal(err)
	}
	if won, err := s.MovePlacement(ctx, p.ID, "n1", "n2", "sha256:b"); err != nil || !won {
		t.Fatalf("move: %v %v", won, err)
	}
	got, err := s.PlacementOf(ctx, "sb1")
	if err != nil || got.Node != "n2" || got.Runtime != "gvisor" || got.Arch != "arm64" {
		t.Fatalf("after a move: %+v %v", got, err)
	}
	if ps, err := s.ListPlacements(ctx, ""); err != nil || len(ps) != 1 || ps[0].Runtime != "gvisor" || ps[0].Arch != "arm64" {
		t.Fatalf("list: %+v %v", ps, err)
	}
}
