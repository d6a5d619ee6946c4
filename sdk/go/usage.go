package airlock

import (
	"context"
	"net/http"
	"time"
)

// Usage is one sample of a running sandbox's resource use. CPU, memory and
// disk are the guest's own account (informational); the network is counted
// by the server on the guest's link.
type Usage struct {
	SandboxID string `json:"sandbox_id"`
	// SampledAt is when the server got the guest's answer. Rates are the
	// deltas between two samples over the difference of their SampledAt:
	// CPU use as a share of the vCPUs is
	// (b.CPUSeconds-a.CPUSeconds) / b.SampledAt.Sub(a.SampledAt).Seconds() / CPUs.
	SampledAt time.Time `json:"sampled_at"`
	// CPUs is the guest's CPU count; CPUSeconds the CPU time all of them
	// have been busy since the guest booted (a counter).
	CPUs       int     `json:"cpus"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryBytes is what the guest uses (MemTotal less MemAvailable),
	// MemoryLimitBytes what it has.
	MemoryBytes      int64 `json:"memory_bytes"`
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
	// DiskBytes is what is used on its root filesystem, DiskLimitBytes
	// that filesystem's size, as the guest sees them.
	DiskBytes      int64 `json:"disk_bytes"`
	DiskLimitBytes int64 `json:"disk_limit_bytes"`
	// Network is nil when the sandbox has no network.
	Network *NetworkUsage `json:"network"`
}

// NetworkUsage is a sandbox's network since it last started or resumed (a
// resume starts again from zero). Receive and transmit are the sandbox's
// point of view (receive: downloads, answers to its requests), Ethernet
// headers included.
type NetworkUsage struct {
	ReceiveBytes  int64 `json:"receive_bytes"`
	TransmitBytes int64 `json:"transmit_bytes"`
	// Connections counts TCP connections and UDP flows open now.
	Connections int `json:"connections"`
}

// Usage samples the resource use of running sandbox id. It never resumes a
// paused sandbox: one that is not running is ErrFailedPrecondition. Asking
// is not activity: it does not postpone an idle pause (see Keepalive).
func (c *Client) Usage(ctx context.Context, id string) (*Usage, error) {
	var u Usage
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "usage"), nil, nil, &u, http.StatusOK); err != nil {
		return nil, err
	}
	return &u, nil
}
