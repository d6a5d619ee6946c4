package airlock

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Snapshot is a saved sandbox (memory, processes, disk) that new sandboxes
// start from (CreateOptions.FromSnapshot). Env and secrets are never
// shown; sandboxes with secrets cannot be saved.
type Snapshot struct {
	Name        string    `json:"name"`
	ID          string    `json:"id"`
	SandboxID   string    `json:"sandbox_id"` // the sandbox it was taken from
	Tenant      string    `json:"tenant"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	CPUs        int       `json:"cpus"`
	MemoryMB    int       `json:"memory_mb"`
	DiskMB      int       `json:"disk_mb"`
	Network     Network   `json:"network"`
	SizeBytes   int64     `json:"size_bytes"` // what its files take on the server's disk
	CreatedAt   time.Time `json:"created_at"`
}

// Snapshot saves running (or paused) sandbox id as the snapshot name of
// its tenant; the sandbox keeps running. It is saved while it runs: its
// guest stops only while its memory is written out, and keeps its open TCP
// connections.
// Names are 1-63 letters, digits, '.', '_' or '-', starting with a letter
// or digit. ErrConflict if the name is taken; ErrFailedPrecondition for a
// sandbox with secrets or, unless force (which ends them), with commands
// or code running.
func (c *Client) Snapshot(ctx context.Context, id, name string, force bool) (*Snapshot, error) {
	in := struct {
		Name  string `json:"name"`
		Force bool   `json:"force"`
	}{name, force}
	var sn Snapshot
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "snapshot"), nil, in, &sn, http.StatusCreated, http.StatusOK); err != nil {
		return nil, err
	}
	return &sn, nil
}

// ListSnapshots returns the snapshots of the key's tenant.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	return c.ListSnapshotsIn(ctx, Scope{})
}

// Scope picks whose objects an admin key acts on: another tenant's
// (Tenant), or with All every tenant's (for snapshots, the unlisted bases
// of forks too). Other keys' scopes are their own tenant whatever is set.
type Scope struct {
	Tenant string
	All    bool
}

func (s Scope) query() url.Values {
	q := url.Values{}
	if s.Tenant != "" {
		q.Set("tenant", s.Tenant)
	}
	if s.All {
		q.Set("all", "1")
	}
	return q
}

// ListSnapshotsIn is ListSnapshots in scope s.
func (c *Client) ListSnapshotsIn(ctx context.Context, s Scope) ([]Snapshot, error) {
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", s.query(), nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot returns the snapshot name (ErrNotFound if the key's tenant
// has none of that name).
func (c *Client) GetSnapshot(ctx context.Context, name string) (*Snapshot, error) {
	var sn Snapshot
	if err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(name), nil, nil, &sn, http.StatusOK); err != nil {
		return nil, err
	}
	return &sn, nil
}

// DeleteSnapshot deletes the snapshot name and frees its disk. While
// sandboxes made from it (or snapshots of them) exist, its disk backs
// theirs: ErrFailedPrecondition.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.DeleteSnapshotIn(ctx, Scope{}, name)
}

// DeleteSnapshotIn is DeleteSnapshot of scope s's tenant (s.All is ignored).
func (c *Client) DeleteSnapshotIn(ctx context.Context, s Scope, name string) error {
	s.All = false
	return c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(name), s.query(), nil, nil, http.StatusNoContent, http.StatusOK)
}

// PruneSnapshots removes the snapshots forks started from once no sandbox
// uses them, and orphaned snapshot files, and returns the bytes freed. It
// needs an admin key (else ErrPermissionDenied).
func (c *Client) PruneSnapshots(ctx context.Context) (int64, error) {
	var out struct {
		FreedBytes int64 `json:"freed_bytes"`
	}
	if err := c.doJSON(ctx, http.MethodPost, "/v1/snapshots/prune", nil, nil, &out, http.StatusOK); err != nil {
		return 0, err
	}
	return out.FreedBytes, nil
}

// MaxForks is the most copies one Fork makes.
const MaxForks = 16

// Fork makes count (1..MaxForks) running copies of sandbox id, each with
// the source's processes, memory and disk, a fresh clock, RNG reseed and
// its own network stack. The source is saved while it runs (as for
// Snapshot). The forks count against the quotas like
// creates; the caller owns them (Kill each when done). All or nothing: on
// an error no fork is left.
func (c *Client) Fork(ctx context.Context, id string, count int, force bool) ([]Sandbox, error) {
	return c.ForkWith(ctx, id, ForkOptions{Count: count, Force: force})
}

// ForkOptions say how ForkWith copies a sandbox.
type ForkOptions struct {
	Count int  // 1-16
	Force bool // end code (and commands) running in the source rather than fail
	// Secrets binds the source's secret values in each fork; without it a
	// fork's guest holds placeholders that reach no one.
	Secrets bool
}

// ForkWith is Fork with every option.
func (c *Client) ForkWith(ctx context.Context, id string, o ForkOptions) ([]Sandbox, error) {
	in := struct {
		Count   int  `json:"count"`
		Force   bool `json:"force"`
		Secrets bool `json:"secrets,omitempty"`
	}{o.Count, o.Force, o.Secrets}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "fork"), nil, in, &out, http.StatusCreated, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Sandboxes, nil
}
