package airlock_test

import (
	"errors"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func TestSnapshotAndFork(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{CPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Source != "" || sb.DiskUsageBytes != 3<<20 {
		t.Fatalf("created %+v", sb)
	}
	sn, err := c.Snapshot(ctx, sb.ID, "after-setup", true)
	if err != nil {
		t.Fatal(err)
	}
	if sn.Name != "after-setup" || sn.SandboxID != sb.ID || sn.CPUs != 2 || sn.SizeBytes != 64<<20 || sn.CreatedAt.IsZero() {
		t.Fatalf("Snapshot = %+v", sn)
	}
	if r := f.lastRequest(); r.Method != "POST" || r.URL.Path != "/v1/sandboxes/"+sb.ID+"/snapshot" {
		t.Errorf("snapshot sent %s %s", r.Method, r.URL.Path)
	}
	if _, err := c.Snapshot(ctx, sb.ID, "after-setup", false); !errors.Is(err, airlock.ErrConflict) {
		t.Fatalf("second Snapshot: %v, want ErrConflict", err)
	}
	list, err := c.ListSnapshots(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "after-setup" {
		t.Fatalf("ListSnapshots = %+v, %v", list, err)
	}
	if got, err := c.GetSnapshot(ctx, "after-setup"); err != nil || got.ID != sn.ID {
		t.Fatalf("GetSnapshot = %+v, %v", got, err)
	}
	if _, err := c.GetSnapshot(ctx, "nope"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("GetSnapshot(missing): %v", err)
	}

	from, err := c.Create(ctx, airlock.CreateOptions{FromSnapshot: "after-setup", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if from.Source != "snapshot:after-setup" || from.CPUs != 2 {
		t.Fatalf("from snapshot: %+v", from)
	}
	if err := c.DeleteSnapshot(ctx, "after-setup"); !errors.Is(err, airlock.ErrFailedPrecondition) {
		t.Fatalf("DeleteSnapshot in use: %v", err)
	}
	if err := c.Kill(ctx, from.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshot(ctx, "after-setup"); err != nil {
		t.Fatal(err)
	}
	if r := f.lastRequest(); r.Method != "DELETE" || r.URL.Path != "/v1/snapshots/after-setup" {
		t.Errorf("delete sent %s %s", r.Method, r.URL.Path)
	}
	if _, err := c.PruneSnapshots(ctx); !errors.Is(err, airlock.ErrPermissionDenied) {
		t.Fatalf("PruneSnapshots as a tenant: %v", err)
	}

	forks, err := c.Fork(ctx, sb.ID, 3, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 3 || forks[0].ID == sb.ID || forks[0].ID == forks[1].ID || forks[2].Source != "fork:"+sb.ID {
		t.Fatalf("Fork = %+v", forks)
	}
	if _, err := c.Fork(ctx, sb.ID, 17, false); !errors.Is(err, airlock.ErrInvalid) {
		t.Fatalf("Fork(17): %v", err)
	}
	if _, err := c.Fork(ctx, "sbmissing000", 1, false); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Fork(missing): %v", err)
	}
}
