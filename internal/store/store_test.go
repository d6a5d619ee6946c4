package store

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestSandboxLifecycle(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().Truncate(time.Millisecond)
	sb := Sandbox{ID: "abc", State: StateCreating, Image: "base", ImageDigest: "sha256:00", CPUs: 1, MemoryMiB: 512,
		DiskMiB: 2048, TimeoutSec: 900, CreatedAt: now, ExpiresAt: now.Add(15 * time.Minute), Metadata: map[string]string{"k": "v"}}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, sb); err == nil {
		t.Fatal("duplicate id accepted")
	}
	if _, err := s.Transition(ctx, "abc", Change{To: StateRunning, From: StateCreating}); err != nil {
		t.Fatalf("Transition = %v", err)
	}
	if _, err := s.Transition(ctx, "abc", Change{To: StateFailed, Reason: "x", From: StateCreating}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("conditional Transition on a row in the wrong state: %v", err)
	}
	got, err := s.GetSandbox(ctx, "abc")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateRunning || got.Metadata["k"] != "v" || !got.ExpiresAt.Equal(sb.ExpiresAt) || got.Runtime != "qemu" {
		t.Fatalf("got %+v", got)
	}
	gv := sb
	gv.ID, gv.Runtime = "gv", "gvisor"
	if err := s.CreateSandbox(ctx, gv); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSandbox(ctx, "gv"); err != nil || got.Runtime != "gvisor" {
		t.Fatalf("runtime gvisor round trip: %+v, %v", got, err)
	}
	if err := s.DeleteSandbox(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(ctx, "abc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestConcurrentProcessesShareCatalog(t *testing.T) {
	ctx := t.Context()
	path := catalogAt(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			s, err := Open(ctx, path)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			errs <- s.PutImage(ctx, ImageRecord{Name: "img" + string(rune('a'+i)), Digest: "sha256:1", Created: time.Now()})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s, _ := Open(ctx, path)
	defer s.Close()
	imgs, err := s.ListImages(ctx)
	if err != nil || len(imgs) != 8 {
		t.Fatalf("images = %d, %v", len(imgs), err)
	}
	if err := s.DeleteImage(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
}

func TestEvents(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, e := range []Event{
		{Tenant: "a", SandboxID: "s1", Action: "sandbox.create"},
		{Tenant: "b", SandboxID: "s2", Action: "sandbox.create"},
		{Tenant: "a", SandboxID: "s1", Action: "exec.exit", Detail: map[string]any{"code": 3}},
	} {
		if seq, err := s.AppendEvent(ctx, e); err != nil || seq != int64(i+1) {
			t.Fatalf("append %d: seq %d, %v", i, seq, err)
		}
	}
	got, err := s.ListEvents(ctx, EventFilter{Tenant: "a"})
	if err != nil || len(got) != 2 || got[1].Detail["code"] != float64(3) {
		t.Fatalf("tenant a: %+v %v", got, err)
	}
	got, _ = s.ListEvents(ctx, EventFilter{Since: 1})
	if len(got) != 2 || got[0].Seq != 2 {
		t.Fatalf("since 1: %+v", got)
	}
	got, _ = s.ListEvents(ctx, EventFilter{SandboxID: "s2"})
	if len(got) != 1 || got[0].Tenant != "b" {
		t.Fatalf("sandbox s2: %+v", got)
	}
}
