package airlock

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Volume is a named filesystem of the key's tenant that outlives
// sandboxes: sandboxes mount it at create (CreateOptions.Volumes),
// read-write by one sandbox at a time or read-only by any number, never
// both. Its full size counts in the tenant's disk quota.
type Volume struct {
	Name   string `json:"name"`
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	SizeMB int    `json:"size_mb"`
	// AllocatedBytes is what its image takes on the server's disk.
	AllocatedBytes int64     `json:"allocated_bytes"`
	CreatedAt      time.Time `json:"created_at"`
	// GuestWritten: a microVM (qemu) guest has had it read-write, so
	// gvisor sandboxes can no longer mount it.
	GuestWritten bool `json:"guest_written"`
	// Attachments are the sandboxes that have it mounted.
	Attachments []VolumeAttachment `json:"attachments"`
}

// VolumeAttachment is a sandbox that has a volume mounted.
type VolumeAttachment struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"` // where the guest sees it
	ReadOnly  bool   `json:"read_only"`
}

// VolumeMount asks for a volume at guest path Path on create.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// HostMount asks for host directory HostPath at guest path Path on
// create. It is read-only unless ReadWrite: the local user may mount any
// directory, an API key only under the directories the server allows
// (`airlock serve --allow-host-mount DIR`; else ErrPermissionDenied).
type HostMount struct {
	HostPath  string
	Path      string
	ReadWrite bool
}

// hostMountRequest is HostMount on the wire: read_only is always sent.
type hostMountRequest struct {
	HostPath string `json:"host_path"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

// Mount is one of a sandbox's mounts: a volume (Volume set) or a host
// directory (HostPath set).
type Mount struct {
	Volume   string `json:"volume,omitempty"`
	HostPath string `json:"host_path,omitempty"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

// CreateVolume makes an empty volume name of sizeMB MiB (at least 16).
// Names are 1-63 lowercase letters, digits, '.', '_' or '-', starting with
// a letter or digit. ErrConflict if the name is taken; a *APIError with
// status 429 over the tenant's quotas.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int) (*Volume, error) {
	in := struct {
		Name   string `json:"name"`
		SizeMB int    `json:"size_mb"`
	}{name, sizeMB}
	var v Volume
	if err := c.doJSON(ctx, http.MethodPost, "/v1/volumes", nil, in, &v, http.StatusCreated, http.StatusOK); err != nil {
		return nil, err
	}
	return &v, nil
}

// ListVolumes returns the volumes of the key's tenant.
func (c *Client) ListVolumes(ctx context.Context) ([]Volume, error) {
	var out struct {
		Volumes []Volume `json:"volumes"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/volumes", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// GetVolume returns the volume name with its attachments (ErrNotFound if
// the key's tenant has none of that name).
func (c *Client) GetVolume(ctx context.Context, name string) (*Volume, error) {
	var v Volume
	if err := c.doJSON(ctx, http.MethodGet, volumePath(name), nil, nil, &v, http.StatusOK); err != nil {
		return nil, err
	}
	return &v, nil
}

// ResizeVolume grows the volume name to sizeMB MiB while no sandbox has it
// mounted (ErrConflict); a volume never shrinks (ErrInvalid).
func (c *Client) ResizeVolume(ctx context.Context, name string, sizeMB int) (*Volume, error) {
	in := struct {
		SizeMB int `json:"size_mb"`
	}{sizeMB}
	var v Volume
	if err := c.doJSON(ctx, http.MethodPost, volumePath(name)+"/resize", nil, in, &v, http.StatusOK); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteVolume deletes the volume name and its data; ErrConflict while a
// sandbox has it mounted (remove the sandbox first).
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, volumePath(name), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}

func volumePath(name string) string { return "/v1/volumes/" + url.PathEscape(name) }
