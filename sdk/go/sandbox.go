package airlock

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopping = "stopping"
	StateFailed   = "failed"
)

// Sandbox is the server's view of one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`  // creating, running, stopping or failed
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
	Metadata    map[string]string `json:"metadata"`
	Tenant      string            `json:"tenant"`
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
	// Network is "" (no network; sent as null) or "none"; the server rejects
	// anything else until networking exists.
	Network string
}

type createRequest struct {
	Image    string            `json:"image,omitempty"`
	CPUs     int               `json:"cpus,omitempty"`
	MemoryMB int               `json:"memory_mb,omitempty"`
	DiskMB   int               `json:"disk_mb,omitempty"`
	TimeoutS int64             `json:"timeout_s,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Network  *string           `json:"network"`
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
		TimeoutS: seconds(opts.Timeout), Env: opts.Env, Metadata: opts.Metadata,
	}
	if opts.Network != "" {
		in.Network = &opts.Network
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
