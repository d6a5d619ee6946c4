package sandbox

import (
	"context"
	"fmt"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// QuotaError is a create refused by a tenant's quota. It is an
// ErrResourceExhausted; its Detail names only the tenant's own numbers.
type QuotaError struct {
	Quota string // max_sandboxes, max_vcpus, max_memory_mb, max_disk_mb, max_snapshots or max_volumes
	Used  int    // what the tenant's sandboxes (and creates in flight) use
	Need  int    // what the refused sandbox needs
	Max   int    // the quota
	Unit  string // "" or " MiB"
	What  string // what needs it: "" for "this sandbox"
}

// Detail describes the refusal: "max_vcpus: the tenant uses 2 of 4; this
// sandbox needs 4 more".
func (e *QuotaError) Detail() string {
	what := e.What
	if what == "" {
		what = "this sandbox"
	}
	return fmt.Sprintf("%s: the tenant uses %d%s of %d%s; %s needs %d%s more", e.Quota, e.Used, e.Unit, e.Max, e.Unit, what, e.Need, e.Unit)
}

func (e *QuotaError) Error() string { return errdefs.ErrResourceExhausted.Error() + ": " + e.Detail() }

// Is makes a QuotaError an errdefs.ErrResourceExhausted.
func (e *QuotaError) Is(target error) bool { return target == errdefs.ErrResourceExhausted }

// Quotas checks creates against tenants' quotas, counting the resources
// of creates in flight per tenant with the live sandboxes, so concurrent
// creates cannot together pass a quota each passes alone. The manager
// holds one; the zero value is ready. Safe for concurrent use.
type Quotas struct {
	mu      sync.Mutex
	pending map[string]Limits // by tenant; MaxSandboxes, MaxVCPUs and MaxMemoryMiB used as counters
}

// reserve checks n sandboxes of cpus, memMiB and diskMiB each, owned by
// tenant owner, against c's limits and holds them until release is
// called. The tenant's snapshots and volumes count toward its disk quota.
func (m *Manager) reserve(ctx context.Context, c Caller, owner string, n, cpus, memMiB, diskMiB int) (release func(), err error) {
	if c.Tenant == "" {
		return func() {}, nil
	}
	sbs, err := m.list(ctx)
	if err != nil {
		return nil, err
	}
	snapMiB, err := m.keptMiB(ctx, owner)
	if err != nil {
		return nil, err
	}
	return m.quota.Reserve(c, owner, sbs, snapMiB, n, cpus, memMiB, diskMiB)
}

// Reserve checks n sandboxes of cpus and memMiB each, owned by tenant
// owner, against c's limits (zero fields: DefaultLimits) and holds them
// until release is called (once; later calls do nothing); all or none.
// live are the catalog's sandboxes (every tenant's: those of owner that
// are neither failed nor still creating count). The local user (c.Tenant
// "") has no quota. A refusal is a *QuotaError.
func (q *Quotas) Reserve(c Caller, owner string, live []store.Sandbox, snapMiB, n, cpus, memMiB, diskMiB int) (release func(), err error) {
	if c.Tenant == "" {
		return func() {}, nil
	}
	lim := c.Limits.Or(DefaultLimits)
	q.mu.Lock()
	defer q.mu.Unlock()
	use := q.pending[owner]
	use.MaxDiskMiB += snapMiB
	for _, sb := range live {
		// Rows still creating are creates in flight, already counted in
		// pending.
		if sb.Tenant != owner || sb.State == store.StateFailed || sb.State == store.StateCreating {
			continue
		}
		use.MaxSandboxes++
		use.MaxVCPUs += sb.CPUs
		use.MaxMemoryMiB += sb.MemoryMiB
		use.MaxDiskMiB += sb.DiskMiB
	}
	add := Limits{MaxSandboxes: n, MaxVCPUs: n * cpus, MaxMemoryMiB: n * memMiB, MaxDiskMiB: n * diskMiB}
	// Checked one sandbox at a time, so the refusal names the sandbox
	// that does not fit, as n separate creates would.
	for range n {
		switch {
		case use.MaxSandboxes+1 > lim.MaxSandboxes:
			return nil, &QuotaError{Quota: "max_sandboxes", Used: use.MaxSandboxes, Need: 1, Max: lim.MaxSandboxes, Unit: ""}
		case use.MaxVCPUs+cpus > lim.MaxVCPUs:
			return nil, &QuotaError{Quota: "max_vcpus", Used: use.MaxVCPUs, Need: cpus, Max: lim.MaxVCPUs, Unit: ""}
		case use.MaxMemoryMiB+memMiB > lim.MaxMemoryMiB:
			return nil, &QuotaError{Quota: "max_memory_mb", Used: use.MaxMemoryMiB, Need: memMiB, Max: lim.MaxMemoryMiB, Unit: " MiB"}
		case use.MaxDiskMiB+diskMiB > lim.MaxDiskMiB:
			return nil, &QuotaError{Quota: "max_disk_mb", Used: use.MaxDiskMiB, Need: diskMiB, Max: lim.MaxDiskMiB, Unit: " MiB"}
		}
		use.MaxSandboxes++
		use.MaxVCPUs += cpus
		use.MaxMemoryMiB += memMiB
		use.MaxDiskMiB += diskMiB
	}
	if q.pending == nil {
		q.pending = map[string]Limits{}
	}
	q.pending[owner] = q.pending[owner].plus(add, 1)
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			p := q.pending[owner].plus(add, -1)
			if p == (Limits{}) {
				delete(q.pending, owner)
			} else {
				q.pending[owner] = p
			}
		})
	}, nil
}

// plus returns l + sign*d for the counted fields.
func (l Limits) plus(d Limits, sign int) Limits {
	l.MaxSandboxes += sign * d.MaxSandboxes
	l.MaxVCPUs += sign * d.MaxVCPUs
	l.MaxMemoryMiB += sign * d.MaxMemoryMiB
	l.MaxDiskMiB += sign * d.MaxDiskMiB
	return l
}
