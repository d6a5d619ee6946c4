package sandbox

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// The host's disk (threats 89 and 117). Sandboxes' disks are thin: a
// guest can fill its whole disk size. Work that can take disk on the host
// (a create or fork: up to the disk size; a pause or snapshot: the guest's
// memory) is refused while it would bring the state dir's filesystem below
// a free-space reserve, so the catalog, logs and running sandboxes keep
// room to write. Tenants' disk sizes and snapshots also count toward their
// max_disk_mb quota (quota.go).

// DiskFigures are the state dir's filesystem, df-style, and the reserve.
type DiskFigures struct {
	Total, Free int64 // bytes; Free is what an unprivileged writer can use
	Reserve     int64 // bytes kept free
}

// DefaultDiskReserve is the reserve for a filesystem of total bytes: 5%,
// at least 2 GiB, at most half of it.
func DefaultDiskReserve(total int64) int64 {
	return min(max(total/20, 2<<30), total/2)
}

// statfs returns a filesystem's total and available bytes.
func statfs(path string) (total, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// Disk returns the state dir's figures.
func (m *Manager) Disk() (DiskFigures, error) {
	fs := m.statfs
	if fs == nil {
		fs = statfs
	}
	total, free, err := fs(m.L.Root)
	if err != nil {
		return DiskFigures{}, fmt.Errorf("state dir's filesystem: %w", err)
	}
	reserve := m.DiskReserve
	switch {
	case reserve == 0:
		reserve = DefaultDiskReserve(total)
	case reserve < 0:
		reserve = 0
	}
	return DiskFigures{Total: total, Free: free, Reserve: reserve}, nil
}

// SpaceError is work refused because the state dir's filesystem would fall
// below its reserve. It is an errdefs.ErrInsufficientStorage.
type SpaceError struct {
	What                string // "this sandbox's disk (2048 MiB)"
	Need, Free, Reserve int64  // bytes
}

func (e *SpaceError) Error() string {
	return fmt.Sprintf("%s: %s needs up to %d MiB of the host's disk; it has %d MiB free and keeps %d MiB in reserve",
		errdefs.ErrInsufficientStorage, e.What, e.Need>>20, e.Free>>20, e.Reserve>>20)
}

// Is makes a SpaceError an errdefs.ErrInsufficientStorage.
func (e *SpaceError) Is(target error) bool { return target == errdefs.ErrInsufficientStorage }

// CheckSpace refuses work that may write need bytes into the state dir if
// that could leave less than the reserve free (a SpaceError).
func (m *Manager) CheckSpace(_ context.Context, what string, need int64) error {
	d, err := m.Disk()
	if err != nil {
		return err
	}
	if d.Free-need < d.Reserve {
		return &SpaceError{What: what, Need: need, Free: d.Free, Reserve: d.Reserve}
	}
	return nil
}

// spaceForState checks a snapshot of sb (its memory state, with its disk
// overlay frozen beside it) against the host's reserve and the tenant's
// disk quota.
func (m *Manager) spaceForState(ctx context.Context, c Caller, sb store.Sandbox, what string) error {
	need := int64(sb.MemoryMiB) << 20
	if err := m.CheckSpace(ctx, fmt.Sprintf("%s (%d MiB of memory state)", what, sb.MemoryMiB), need); err != nil {
		return err
	}
	if c.Tenant == "" {
		return nil
	}
	used, err := m.tenantDiskMiB(ctx, sb.Tenant)
	if err != nil {
		return err
	}
	if lim := c.Limits.Or(DefaultLimits).MaxDiskMiB; used+sb.MemoryMiB > lim {
		return &QuotaError{Quota: "max_disk_mb", Used: used, Need: sb.MemoryMiB, Max: lim, Unit: " MiB", What: what}
	}
	return nil
}

// tenantDiskMiB is what counts toward a tenant's disk quota: its live
// sandboxes' disk sizes and its snapshots' bytes.
func (m *Manager) tenantDiskMiB(ctx context.Context, tenant string) (int, error) {
	sbs, err := m.list(ctx)
	if err != nil {
		return 0, err
	}
	used, err := m.snapshotMiB(ctx, tenant)
	if err != nil {
		return 0, err
	}
	for _, sb := range sbs {
		if sb.Tenant == tenant && sb.State != store.StateFailed {
			used += sb.DiskMiB
		}
	}
	return used, nil
}

// snapshotMiB is the size of a tenant's snapshots, in MiB (rounded up).
func (m *Manager) snapshotMiB(ctx context.Context, tenant string) (int, error) {
	snaps, err := m.Store.ListSnapshots(ctx, tenant, false)
	if err != nil {
		return 0, err
	}
	var b int64
	for _, sn := range snaps {
		b += sn.Size
	}
	return int((b + 1<<20 - 1) >> 20), nil
}
