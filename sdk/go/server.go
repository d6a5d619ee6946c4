package airlock

import (
	"context"
	"net/http"
	"time"
)

// ServerOverview is the server as the caller may see it (GET /v1/server):
// a tenant key gets its own tenant only and no host figures; an admin key
// every tenant, the host and why the runtime was picked.
type ServerOverview struct {
	// Admin tells whether the figures are every tenant's.
	Admin bool `json:"admin"`
	// Sandboxes counts the sandboxes the caller sees by state (every state
	// is a key).
	Sandboxes map[string]int `json:"sandboxes"`
	Activity  ServerActivity `json:"activity"`
	Tenants   []TenantUsage  `json:"tenants"`
	// Host is nil unless the caller is an admin.
	Host    *HostUsage    `json:"host"`
	Runtime ServerRuntime `json:"runtime"`
}

// ServerActivity counts sandbox creates and failures (a failed boot, a
// crash, an out-of-memory kill) per bucket of BucketS seconds from Since,
// oldest first, from the server's audit trail.
type ServerActivity struct {
	Since    time.Time `json:"since"`
	BucketS  int       `json:"bucket_s"`
	Creates  []int     `json:"creates"`
	Failures []int     `json:"failures"`
}

// TenantUsage is a tenant's use as its quotas count it (sandboxes that are
// not failed; DiskMB includes its snapshots and volumes).
type TenantUsage struct {
	Tenant          string `json:"tenant"`
	Sandboxes       int    `json:"sandboxes"`
	VCPUs           int    `json:"vcpus"`
	MemoryMB        int    `json:"memory_mb"`
	DiskMB          int    `json:"disk_mb"`
	Snapshots       int    `json:"snapshots"`
	SnapshotsDiskMB int    `json:"snapshots_disk_mb"`
	Volumes         int    `json:"volumes"`
	VolumesDiskMB   int    `json:"volumes_disk_mb"`
	// Quota is nil for the local user (no quota) or when not known.
	Quota *TenantQuota `json:"quota"`
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

// HostUsage is the host's disk (the server's state dir) and memory.
type HostUsage struct {
	DiskTotalBytes       int64 `json:"disk_total_bytes"`
	DiskFreeBytes        int64 `json:"disk_free_bytes"`
	DiskReserveBytes     int64 `json:"disk_reserve_bytes"`
	MemoryTotalBytes     int64 `json:"memory_total_bytes"`
	MemoryAvailableBytes int64 `json:"memory_available_bytes"`
}

// ServerRuntime is the runtime new sandboxes get; Why is set for admins.
type ServerRuntime struct {
	Name string `json:"name"`
	Why  string `json:"why"`
}

// Server returns the server as the caller's key may see it.
func (c *Client) Server(ctx context.Context) (*ServerOverview, error) {
	var o ServerOverview
	if err := c.doJSON(ctx, http.MethodGet, "/v1/server", nil, nil, &o, http.StatusOK); err != nil {
		return nil, err
	}
	return &o, nil
}
