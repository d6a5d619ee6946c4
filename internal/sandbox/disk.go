package sandbox

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// The host's disk (threats 89 and 117): the state dir's filesystem keeps a
// free-space reserve (statedir.DiskFigures) that creates, forks, pauses and
// snapshots are checked against first. Tenants' disk sizes and snapshots
// also count toward their max_disk_mb quota (quota.go).

// Disk returns the state dir's figures.
func (m *Manager) Disk() (statedir.DiskFigures, error) {
	if m.statfs == nil {
		return m.L.Disk(m.DiskReserve)
	}
	total, free, err := m.statfs(m.L.Root)
	if err != nil {
		return statedir.DiskFigures{}, fmt.Errorf("state dir's filesystem: %w", err)
	}
	return statedir.NewDiskFigures(total, free, m.DiskReserve), nil
}

// CheckSpace refuses work that may write need bytes into the state dir if
// that could leave less than the reserve free (a statedir.SpaceError).
func (m *Manager) CheckSpace(_ context.Context, what string, need int64) error {
	d, err := m.Disk()
	if err != nil {
		return err
	}
	return d.Check(what, need)
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
// sandboxes' disk sizes, its snapshots' bytes and its volumes' sizes.
func (m *Manager) tenantDiskMiB(ctx context.Context, tenant string) (int, error) {
	sbs, err := m.list(ctx)
	if err != nil {
		return 0, err
	}
	used, err := m.keptMiB(ctx, tenant)
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

// keptMiB is what a tenant keeps outside its sandboxes, in MiB: its
// snapshots' bytes (rounded up) and its volumes' sizes.
func (m *Manager) keptMiB(ctx context.Context, tenant string) (int, error) {
	vol, err := m.volumeMiB(ctx, tenant)
	if err != nil {
		return 0, err
	}
	snap, err := m.snapshotMiB(ctx, tenant)
	return vol + snap, err
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
