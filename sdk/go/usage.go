package airlock

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
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

// SandboxLog is the end of one of a sandbox's logs: "console" (its guest's
// console) or, for admin keys, "supervisor" (its shim's log on the
// host). Text is the sandbox's own output: hostile, show it as text.
type SandboxLog struct {
	Source    string `json:"source"`
	Exists    bool   `json:"exists"` // false: the sandbox has no such log
	Size      int64  `json:"size"`
	Truncated bool   `json:"truncated"` // Text is the end of a longer log
	Text      string `json:"text"`
}

// Logs returns the last tailBytes (0: the server's default, 64 KiB) of
// each log of sandbox id the key may read. It never resumes a paused
// sandbox.
func (c *Client) Logs(ctx context.Context, id string, tailBytes int) ([]SandboxLog, error) {
	var q url.Values
	if tailBytes > 0 {
		q = url.Values{"tail_bytes": {strconv.Itoa(tailBytes)}}
	}
	var out struct {
		Logs []SandboxLog `json:"logs"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "logs"), q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Logs, nil
}
