package api

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Overviewer is an optional ability of a Sandboxes implementation, found
// by type assertion (the manager has it): the server page's figures
// (GET /v1/server). The implementation decides what the caller may know
// (sandbox.Manager.Overview: a tenant its own, an admin everything).
type Overviewer interface {
	Overview(ctx context.Context, c sandbox.Caller) (sandbox.Overview, error)
}

var _ Overviewer = (*sandbox.Manager)(nil)

// KeyLister is an optional ability of Config.Keys: every key's record, to
// give an admin each tenant's quotas on the server page. Without it an
// admin sees usage without quotas for tenants other than its own.
type KeyLister interface {
	ListKeys(ctx context.Context) ([]store.APIKey, error)
}

var _ KeyLister = (*store.Store)(nil)

// ServerOverview is the API's view of the server for a caller (GET
// /v1/server).
type ServerOverview struct {
	// Admin tells whether the figures are every tenant's.
	Admin bool `json:"admin"`
	// Sandboxes counts the sandboxes the caller sees by state (every state
	// is present).
	Sandboxes map[string]int `json:"sandboxes"`
	Activity  ServerActivity `json:"activity"`
	Tenants   []TenantUsage  `json:"tenants"`
	// Host is absent unless the caller is an admin.
	Host    *HostUsage    `json:"host,omitempty"`
	Runtime ServerRuntime `json:"runtime"`
}

// ServerActivity counts sandboxes created and failed per bucket, oldest
// first, from the audit trail.
type ServerActivity struct {
	Since    time.Time `json:"since"`
	BucketS  int       `json:"bucket_s"`
	Creates  []int     `json:"creates"`
	Failures []int     `json:"failures"`
}

// TenantUsage is a tenant's use against its quotas.
type TenantUsage struct {
	Tenant        string       `json:"tenant"`
	Sandboxes     int          `json:"sandboxes"`
	VCPUs         int          `json:"vcpus"`
	MemoryMB      int          `json:"memory_mb"`
	DiskMB        int          `json:"disk_mb"`
	Snapshots     int          `json:"snapshots"`
	SnapshotsDisk int          `json:"snapshots_disk_mb"`
	Volumes       int          `json:"volumes"`
	VolumesDisk   int          `json:"volumes_disk_mb"`
	Quota         *TenantQuota `json:"quota"` // null: none (the local user) or not known
}

// TenantQuota is what a tenant's keys allow (the most any of them does).
type TenantQuota struct {
	MaxSandboxes int `json:"max_sandboxes"`
	MaxVCPUs     int `json:"max_vcpus"`
	MaxMemoryMB  int `json:"max_memory_mb"`
	MaxDiskMB    int `json:"max_disk_mb"`
	MaxSnapshots int `json:"max_snapshots"`
	MaxVolumes   int `json:"max_volumes"`
}

// HostUsage is the host's free disk (the state dir's filesystem) and
// memory.
type HostUsage struct {
	DiskTotalBytes       int64 `json:"disk_total_bytes"`
	DiskFreeBytes        int64 `json:"disk_free_bytes"`
	DiskReserveBytes     int64 `json:"disk_reserve_bytes"`
	MemoryTotalBytes     int64 `json:"memory_total_bytes"`
	MemoryAvailableBytes int64 `json:"memory_available_bytes"`
}

// ServerRuntime is the runtime new sandboxes get, and (admins only) why.
type ServerRuntime struct {
	Name string `json:"name"`
	Why  string `json:"why,omitempty"`
}

var errNoOverview = &Error{http.StatusServiceUnavailable, "unavailable", "the server overview is not available on this server"}

// allStates are the states a sandbox can be in, for the by-state counts.
var allStates = []store.State{store.StateCreating, store.StateRunning, store.StatePausing, store.StatePaused,
	store.StateResuming, store.StateStopping, store.StateFailed}

func (s *Server) serverOverview(w http.ResponseWriter, r *http.Request) {
	ov, ok := s.cfg.Sandboxes.(Overviewer)
	if !ok {
		s.fail(w, r, errNoOverview)
		return
	}
	c := callerOf(r)
	o, err := ov.Overview(r.Context(), c)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	quotas, err := s.quotas(r.Context(), c)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := ServerOverview{
		Admin: c.Admin, Sandboxes: map[string]int{},
		Activity: ServerActivity{Since: o.Activity.Since.UTC(), BucketS: int(o.Activity.Step / time.Second),
			Creates: o.Activity.Creates, Failures: o.Activity.Failures},
		Tenants: []TenantUsage{},
		Runtime: ServerRuntime{Name: o.Runtime, Why: o.RuntimeWhy},
	}
	for _, st := range allStates {
		out.Sandboxes[string(st)] = o.States[st]
	}
	seen := map[string]bool{}
	for _, u := range o.Tenants {
		seen[u.Tenant] = true
		out.Tenants = append(out.Tenants, TenantUsage{Tenant: u.Tenant, Sandboxes: u.Sandboxes, VCPUs: u.VCPUs, MemoryMB: u.MemoryMiB,
			DiskMB: u.DiskMiB, Snapshots: u.Snapshots, SnapshotsDisk: u.SnapshotMiB,
			Volumes: u.Volumes, VolumesDisk: u.VolumeMiB, Quota: quotas[u.Tenant]})
	}
	if c.Admin {
		// Tenants with keys and nothing yet.
		for t, q := range quotas {
			if !seen[t] {
				out.Tenants = append(out.Tenants, TenantUsage{Tenant: t, Quota: q})
			}
		}
		slices.SortFunc(out.Tenants, func(a, b TenantUsage) int { return strings.Compare(a.Tenant, b.Tenant) })
	}
	if h := o.Host; h != nil && c.Admin {
		out.Host = &HostUsage{DiskTotalBytes: h.Disk.Total, DiskFreeBytes: h.Disk.Free, DiskReserveBytes: h.Disk.Reserve,
			MemoryTotalBytes: h.MemTotal, MemoryAvailableBytes: h.MemAvailable}
	}
	writeJSON(w, http.StatusOK, out)
}

// quotas are the tenants' quotas c may know: its own tenant's (its key's
// limits), and for an admin every tenant with a live key, the most any of
// its keys allows (the server's defaults fill a key's unset limits).
func (s *Server) quotas(ctx context.Context, c sandbox.Caller) (map[string]*TenantQuota, error) {
	out := map[string]*TenantQuota{}
	add := func(tenant string, l sandbox.Limits) {
		q := out[tenant]
		if q == nil {
			q = &TenantQuota{}
			out[tenant] = q
		}
		q.MaxSandboxes = max(q.MaxSandboxes, l.MaxSandboxes)
		q.MaxVCPUs = max(q.MaxVCPUs, l.MaxVCPUs)
		q.MaxMemoryMB = max(q.MaxMemoryMB, l.MaxMemoryMiB)
		q.MaxDiskMB = max(q.MaxDiskMB, l.MaxDiskMiB)
		q.MaxSnapshots = max(q.MaxSnapshots, l.MaxSnapshots)
		q.MaxVolumes = max(q.MaxVolumes, l.MaxVolumes)
	}
	if c.Tenant != "" {
		add(c.Tenant, c.Limits.Or(sandbox.DefaultLimits))
	}
	kl, ok := s.cfg.Keys.(KeyLister)
	if !c.Admin || !ok {
		return out, nil
	}
	keys, err := kl.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if !k.Revoked {
			add(k.Tenant, sandbox.KeyCaller(k, s.cfg.Defaults, "api").Limits)
		}
	}
	return out, nil
}
