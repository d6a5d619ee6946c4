package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestThreat117HostReserve: work that could take the host's disk below
// its reserve is refused as insufficient storage, before anything is
// allocated: a create or fork asking for more disk than the host can
// spare, a snapshot whose memory state would not fit.
func TestThreat117HostReserve(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	free := int64(10 << 30)
	m.statfs = func(string) (int64, int64, error) { return 100 << 30, free, nil } // reserve: 5 GiB
	alice := Caller{Tenant: "alice", Limits: Limits{MaxDiskMiB: 1 << 20}}
	before, _ := os.ReadDir(m.L.Root + "/sandboxes")
	_, err := m.Create(ctx, alice, CreateOptions{Image: "base", DiskMiB: 6 << 10})
	var se *statedir.SpaceError
	if !errors.As(err, &se) || !errors.Is(err, errdefs.ErrInsufficientStorage) || se.Need != 6<<30 || se.Free != free || se.Reserve != 5<<30 {
		t.Fatalf("a 6 GiB disk with 10 GiB free and 5 GiB reserved: %v", err)
	}
	t.Logf("refusal: %v", err)
	after, _ := os.ReadDir(m.L.Root + "/sandboxes")
	sbs, _ := m.Store.ListSandboxes(ctx)
	if len(after) != len(before) || len(sbs) != 2 {
		t.Fatalf("a refused create left %d dirs (was %d), %d rows", len(after), len(before), len(sbs))
	}
	// Under the line: a 4 GiB disk fits (it then fails for want of an
	// image, which this catalog has none of: not a space error).
	if _, err := m.Create(ctx, alice, CreateOptions{Image: "base", DiskMiB: 4 << 10}); errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("a 4 GiB disk with 10 GiB free and 5 GiB reserved: %v", err)
	}
	if _, err := m.Fork(ctx, alice, "aaaaaaaaaaaa", ForkOptions{Count: 3}); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("3 forks of a 2 GiB disk with 5 GiB to spare: %v", err)
	}
	free = 5<<30 + 256<<20 // a 512 MiB memory state does not fit
	if _, err := m.Snapshot(ctx, alice, "aaaaaaaaaaaa", "s1", false); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("a snapshot with 256 MiB to spare: %v", err)
	}
	m.DiskReserve = -1 // --disk-reserve 0
	if d, err := m.Disk(); err != nil || d.Reserve != 0 {
		t.Fatalf("no reserve: %+v %v", d, err)
	}
}

// TestThreat089DiskQuota: a tenant's sandboxes' disk sizes and its
// snapshots count toward max_disk_mb; a create, fork or snapshot past it is
// a quota error naming the figures.
func TestThreat089DiskQuota(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	m.statfs = func(string) (int64, int64, error) { return 1 << 40, 1 << 39, nil } // plenty
	if err := m.Store.PutSnapshot(ctx, store.Snapshot{Tenant: "alice", Name: "s0", ID: "0123456789abcdef0123456789abcdef", SandboxID: "aaaaaaaaaaaa",
		Image: "base", CPUs: 1, MemoryMiB: 512, DiskMiB: 2048, Size: 1 << 30, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// alice uses 2048 MiB (her paused sandbox) + 1024 MiB (her snapshot).
	alice := Caller{Tenant: "alice", Limits: Limits{MaxDiskMiB: 4096}}
	_, err := m.Create(ctx, alice, CreateOptions{Image: "base", DiskMiB: 2048})
	var q *QuotaError
	if !errors.As(err, &q) || q.Quota != "max_disk_mb" || q.Used != 3072 || q.Need != 2048 || q.Max != 4096 {
		t.Fatalf("a 2 GiB disk over a 4 GiB quota with 3 GiB used: %v", err)
	}
	t.Logf("refusal: %v", err)
	if rel, err := m.reserve(ctx, alice, "alice", 1, 1, 128, 1024); err != nil {
		t.Fatalf("1 GiB more fits exactly: %v", err)
	} else {
		rel()
	}
	if _, err := m.Fork(ctx, alice, "aaaaaaaaaaaa", ForkOptions{Count: 1}); !errors.As(err, &q) || q.Quota != "max_disk_mb" {
		t.Fatalf("a fork over the disk quota: %v", err)
	}
	if _, err := m.Snapshot(ctx, Caller{Tenant: "alice", Limits: Limits{MaxDiskMiB: 3300}}, "aaaaaaaaaaaa", "s1", false); !errors.As(err, &q) || q.Quota != "max_disk_mb" {
		t.Fatalf("a snapshot (512 MiB of memory state) over the disk quota: %v", err)
	}
	// Bob's usage is his own.
	if rel, err := m.reserve(ctx, Caller{Tenant: "bob", Limits: Limits{MaxDiskMiB: 4096}}, "bob", 1, 1, 128, 2048); err != nil {
		t.Fatalf("bob: %v", err)
	} else {
		rel()
	}
}

// TestSnapshotCountQuota: a tenant's named snapshots count toward
// max_snapshots; one more past it is a quota error naming the figures,
// refused before anything is saved; another tenant's do not count.
func TestSnapshotCountQuota(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	m.statfs = func(string) (int64, int64, error) { return 1 << 40, 1 << 39, nil } // plenty
	for i, name := range []string{"s0", "s1"} {
		if err := m.Store.PutSnapshot(ctx, store.Snapshot{Tenant: "alice", Name: name, ID: fmt.Sprintf("%032x", i+1), SandboxID: "aaaaaaaaaaaa",
			Image: "base", CPUs: 1, MemoryMiB: 512, DiskMiB: 2048, Size: 1 << 20, Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := m.Store.ListSnapshots(ctx, "alice", false)
	_, err := m.Snapshot(ctx, Caller{Tenant: "alice", Limits: Limits{MaxSnapshots: 2}}, "aaaaaaaaaaaa", "s2", false)
	var q *QuotaError
	if !errors.As(err, &q) || q.Quota != "max_snapshots" || q.Used != 2 || q.Need != 1 || q.Max != 2 || !strings.Contains(err.Error(), "this snapshot needs 1 more") {
		t.Fatalf("a third snapshot over max_snapshots 2: %v", err)
	}
	if after, _ := m.Store.ListSnapshots(ctx, "alice", false); len(after) != len(before) {
		t.Fatalf("snapshots %d -> %d after a refusal", len(before), len(after))
	}
	if err := m.snapshotCount(ctx, Caller{Tenant: "alice", Limits: Limits{MaxSnapshots: 3}}, "alice"); err != nil {
		t.Fatalf("a third under max_snapshots 3: %v", err)
	}
	if err := m.snapshotCount(ctx, Caller{Tenant: "bob", Limits: Limits{MaxSnapshots: 1}}, "bob"); err != nil {
		t.Fatalf("bob has none: %v", err)
	}
	if err := m.snapshotCount(ctx, Local(), "alice"); err != nil {
		t.Fatalf("the local user has no quota: %v", err)
	}
}
