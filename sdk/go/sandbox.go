package airlock

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopping = "stopping"
	StateFailed   = "failed"
	StatePausing  = "pausing"  // being saved to disk
	StatePaused   = "paused"   // saved to disk; any call resumes it
	StateResuming = "resuming" // being restored
)

// Sandbox is the server's view of one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`  // one of the State constants
	Reason      string            `json:"reason"` // why it failed, if it did
	Image       string            `json:"image"`
	ImageDigest string            `json:"image_digest"`
	CPUs        int               `json:"cpus"`
	MemoryMB    int               `json:"memory_mb"`
	DiskMB      int               `json:"disk_mb"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at"`
	Accel       string            `json:"accel"`
	GuestKernel string            `json:"guest_kernel"`
	StartMode   string            `json:"start_mode"`
	Runtime     string            `json:"runtime"` // "qemu" or "gvisor"
	Metadata    map[string]string `json:"metadata"`
	Tenant      string            `json:"tenant"`
	// Network is the sandbox's network as the server normalised it (mode
	// filled in, each secret with its Placeholder and no Value).
	Network Network `json:"network"`
	// IdlePauseS is the idle time, in seconds, after which the sandbox
	// pauses itself (0: never).
	IdlePauseS int64 `json:"idle_pause_s"`
	// PausedAt is when the sandbox was last paused (zero if never).
	PausedAt time.Time `json:"paused_at"`
	// LifetimeLeftS is, while paused, the running time left in seconds: the
	// lifetime counts running time only, and a resume sets ExpiresAt to now
	// plus it. Zero unless paused.
	LifetimeLeftS int64 `json:"lifetime_left_s"`
	// Source is where the sandbox came from: "" (an image),
	// "snapshot:<name>" or "fork:<sandbox id>".
	Source string `json:"source"`
	// DiskUsageBytes is what the sandbox's files take on the server's disk
	// (disk overlay, paused state, logs).
	DiskUsageBytes int64 `json:"disk_usage_bytes"`
	// Mounts are its volumes and host directories, fixed at create.
	Mounts []Mount `json:"mounts"`
}

// Network modes.
const (
	NetworkPublic = "public" // the public internet; private and host addresses stay blocked
	NetworkDeny   = "deny"   // only what Allow names
	NetworkNone   = "none"   // no network at all
)

// Network is a sandbox's network configuration.
type Network struct {
	// Mode is NetworkPublic, NetworkDeny or NetworkNone; "" means public,
	// or deny when Allow is set.
	Mode string `json:"mode,omitempty"`
	// Allow rules: a host name, "*.suffix", an IP or CIDR, each with an
	// optional ":port" or ":lo-hi" ("api.github.com", "140.82.112.0/20:443").
	Allow []string `json:"allow,omitempty"`
	// Secrets are values the guest never sees: it gets a placeholder, and
	// the host puts the real value into requests to the secret's Hosts only.
	Secrets []Secret `json:"secrets,omitempty"`
	// Ports publishes guest ports on the server's host (admin keys only; a
	// tenant gets ErrPermissionDenied). See PortURL for the preview route.
	Ports []Port `json:"ports,omitempty"`
	// RateBytes caps each direction in bytes per second (0: unlimited).
	RateBytes int64 `json:"rate_bytes,omitempty"`
	// MaxConns caps TCP connections plus UDP flows (0: the server's 512).
	MaxConns int `json:"max_conns,omitempty"`
	// The outbound abuse limits the server gave the sandbox, from its
	// tenant's settings (-1: none): new connections per second, distinct
	// destinations per minute, UDP datagrams per second. Ignored on
	// Create.
	ConnRate    int `json:"conn_rate,omitempty"`
	DestsPerMin int `json:"dests_per_min,omitempty"`
	UDPRate     int `json:"udp_pps,omitempty"`
}

// Secret is one secret bound to hosts.
type Secret struct {
	// Name is the guest environment variable that holds the placeholder.
	Name string `json:"name"`
	// Hosts are the names ("api.openai.com" or "*.example.com") the real
	// value may be sent to.
	Hosts []string `json:"hosts"`
	// Header, if set, is the one request header field ("X-Api-Key") the
	// value may be put in; the placeholder anywhere else in a request to
	// Hosts is refused. Empty: any header, the URL's query and path.
	Header string `json:"header,omitempty"`
	// Value is the real value, sent on Create only; the server never
	// returns it.
	Value string `json:"value,omitempty"`
	// Placeholder is what the guest sees ("airlock-secret-<32 hex>"), as
	// the server reports it; leave it empty on Create.
	Placeholder string `json:"placeholder,omitempty"`
	// Vault names a secret of the key's vault (SetVaultSecret) whose value
	// this one gets, instead of Value; Hosts may then be empty (the vault
	// secret's). The server reports it back for a secret made so.
	Vault string `json:"vault,omitempty"`
}

// Port is one published port.
type Port struct {
	HostIP    string `json:"host_ip,omitempty"` // default 127.0.0.1
	HostPort  uint16 `json:"host_port"`         // 0: a free port
	GuestPort uint16 `json:"guest_port"`
}

// CreateOptions are the parameters of a new sandbox. Zero fields take the
// server's defaults (image "base", 1 CPU, 512 MiB, default disk, 15 minutes).
type CreateOptions struct {
	Image    string
	CPUs     int
	MemoryMB int
	DiskMB   int
	// Timeout is the sandbox's lifetime, sent in whole seconds (rounded up).
	Timeout time.Duration
	// Env is the default environment of every exec in the sandbox.
	Env      map[string]string
	Metadata map[string]string
	// Network is the sandbox's network; nil is the server's default (the
	// public internet, no secrets, no published ports).
	Network *Network
	// IdlePause pauses the sandbox after this long idle (sent in whole
	// seconds, rounded up; 0: never, at most 7 days): no exec or code
	// running, no API call on it and no inbound connection. The next call
	// resumes it. Not allowed together with secrets.
	IdlePause time.Duration
	// FromSnapshot starts the sandbox from this snapshot of the key's
	// tenant (see Client.Snapshot): processes, memory and disk as saved.
	// Its size, image, env and network are the snapshot's: leave CPUs,
	// MemoryMB, DiskMB and Image zero (or equal to the snapshot's) and Env
	// and Network nil; Timeout, Metadata and IdlePause apply.
	FromSnapshot string
	// Volumes are the tenant's volumes to mount for the sandbox's life,
	// and HostMounts host directories (the gvisor runtime only, for now);
	// at most 4 in all. Not with FromSnapshot.
	Volumes    []VolumeMount
	HostMounts []HostMount
}

type createRequest struct {
	Image    string            `json:"image,omitempty"`
	CPUs     int               `json:"cpus,omitempty"`
	MemoryMB int               `json:"memory_mb,omitempty"`
	DiskMB   int               `json:"disk_mb,omitempty"`
	TimeoutS int64             `json:"timeout_s,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Network  *Network          `json:"network,omitempty"`
	// IdlePauseS: 0 is never, which is also the server's default.
	IdlePauseS   int64              `json:"idle_pause_s,omitempty"`
	FromSnapshot string             `json:"from_snapshot,omitempty"`
	Volumes      []VolumeMount      `json:"volumes,omitempty"`
	Mounts       []hostMountRequest `json:"mounts,omitempty"`
}

// seconds converts d to whole seconds, rounding a positive remainder up so
// that a small positive duration never becomes 0 ("default").
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// Create starts a sandbox and returns it (state "running" once the server
// answers, or "failed" with a Reason). The caller owns it: Kill it when done,
// or it is removed when its Timeout passes.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	in := createRequest{
		Image: opts.Image, CPUs: opts.CPUs, MemoryMB: opts.MemoryMB, DiskMB: opts.DiskMB,
		TimeoutS: seconds(opts.Timeout), Env: opts.Env, Metadata: opts.Metadata, Network: opts.Network,
		IdlePauseS: seconds(opts.IdlePause), FromSnapshot: opts.FromSnapshot, Volumes: opts.Volumes,
	}
	for _, m := range opts.HostMounts {
		in.Mounts = append(in.Mounts, hostMountRequest{HostPath: m.HostPath, Path: m.Path, ReadOnly: !m.ReadWrite})
	}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, in, &sb, http.StatusCreated, http.StatusOK); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get returns sandbox id (ErrNotFound if it does not exist or is not
// visible to this key).
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb, http.StatusOK); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filter List. Zero fields do not filter.
type ListOptions struct {
	State    string            // one of the State constants
	Metadata map[string]string // every pair must match
}

// List returns the sandboxes visible to this key that match opts.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	for k, v := range opts.Metadata {
		q.Set("metadata."+k, v)
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}

// Kill stops and deletes sandbox id (DELETE). Killing a sandbox that is
// already gone returns ErrNotFound.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}

// SetTimeout sets sandbox id to expire d from now (sent in whole seconds,
// rounded up) and returns the updated sandbox.
func (c *Client) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	in := struct {
		TimeoutS int64 `json:"timeout_s"`
	}{seconds(d)}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "timeout"), nil, in, &sb, http.StatusOK); err != nil {
		return nil, err
	}
	return &sb, nil
}

// PauseResult is what Pause returns.
type PauseResult struct {
	Sandbox Sandbox // the sandbox, now paused
	// StateBytes is the size of the memory and device state written (0 when
	// the sandbox was already paused).
	StateBytes int64
	// SaveTime is how long the guest was stopped for the save.
	SaveTime time.Duration
}

// Pause saves sandbox id (memory, devices and disk) on the server's disk
// and frees its RAM; its state becomes StatePaused. Running commands are
// parked and go on after the resume (their streams end with a
// *StreamError wrapping ErrExecPaused; Attach follows them again). While
// code runs or file transfers are in flight it fails with
// ErrFailedPrecondition unless force, which ends them and the commands.
// A sandbox with secrets binds them again at the resume.
// Pausing a paused sandbox does nothing. Any later call on the sandbox
// resumes it; the guest's open TCP connections do not survive.
func (c *Client) Pause(ctx context.Context, id string, force bool) (*PauseResult, error) {
	in := struct {
		Force bool `json:"force"`
	}{force}
	var out struct {
		Sandbox
		Pause struct {
			StateBytes int64 `json:"state_bytes"`
			SaveMs     int64 `json:"save_ms"`
		} `json:"pause"`
	}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "pause"), nil, in, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &PauseResult{Sandbox: out.Sandbox, StateBytes: out.Pause.StateBytes, SaveTime: time.Duration(out.Pause.SaveMs) * time.Millisecond}, nil
}

// Resume restores paused sandbox id, its processes and code contexts as
// they were, and returns it running. Resuming a running sandbox does
// nothing. (Any other call resumes a paused sandbox too.)
func (c *Client) Resume(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "resume"), nil, nil, &sb, http.StatusOK); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Keepalive counts as activity on sandbox id, postponing its idle pause
// (see CreateOptions.IdlePause). Like any call, it resumes a paused
// sandbox.
func (c *Client) Keepalive(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodPost, sandboxPath(id, "keepalive"), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}

// PortURL is the preview URL of TCP port of sandbox id: the API server
// reverse-proxies HTTP under it to the guest's port (path and query after
// it pass through). Requests to it need this client's key in the
// Authorization header (see PortRequest); the guest never sees the key.
func (c *Client) PortURL(id string, port uint16) string {
	return c.base + portPath(id, port)
}

// PortRequest builds an authenticated request for path (relative to the
// port's root, e.g. "api/items?x=1") on port of sandbox id, for the
// caller to send with its own http.Client. Its body, if any, is streamed.
func (c *Client) PortRequest(ctx context.Context, method, id string, port uint16, path string, body io.Reader) (*http.Request, error) {
	return c.newRequest(ctx, method, portPath(id, port)+strings.TrimPrefix(path, "/"), nil, body)
}

func portPath(id string, port uint16) string {
	return sandboxPath(id, "ports", strconv.Itoa(int(port))) + "/"
}
