package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Volume is the API's view of a volume. Like a snapshot it shows its
// tenant; its attachments are sandboxes of that tenant (a volume is only
// ever mounted by its own tenant's sandboxes).
type Volume struct {
	Name   string `json:"name"`
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	SizeMB int    `json:"size_mb"`
	// AllocatedBytes is what its image takes on the server's disk.
	AllocatedBytes int64     `json:"allocated_bytes"`
	CreatedAt      time.Time `json:"created_at"`
	// GuestWritten: a microVM guest has had it read-write, so gvisor
	// sandboxes cannot mount it.
	GuestWritten bool               `json:"guest_written"`
	Attachments  []VolumeAttachment `json:"attachments"`
}

// VolumeAttachment is a sandbox that has a volume mounted.
type VolumeAttachment struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
	ReadOnly  bool   `json:"read_only"`
}

// Mount is one of a sandbox's mounts in its view: a volume (Volume set)
// or a host directory (HostPath set). HostPath is shown to whoever sees
// the sandbox: its tenant named it at create.
type Mount struct {
	Volume   string `json:"volume,omitempty"`
	HostPath string `json:"host_path,omitempty"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

func viewMounts(ms []store.Mount) []Mount {
	out := make([]Mount, 0, len(ms))
	for _, m := range ms {
		out = append(out, Mount{Volume: m.VolumeName, HostPath: m.HostPath, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return out
}

func viewVolume(v sandbox.VolumeInfo) Volume {
	out := Volume{
		Name: v.Name, ID: v.ID, Tenant: v.Tenant, SizeMB: v.SizeMiB, AllocatedBytes: v.AllocatedBytes,
		CreatedAt: v.Created.UTC(), GuestWritten: v.GuestWritten, Attachments: []VolumeAttachment{},
	}
	for _, a := range v.Attachments {
		out.Attachments = append(out.Attachments, VolumeAttachment{SandboxID: a.SandboxID, Path: a.Path, ReadOnly: a.ReadOnly})
	}
	return out
}

// volumeMountRequest and hostMountRequest are the mounts of a create.
type volumeMountRequest struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

type hostMountRequest struct {
	HostPath string `json:"host_path"`
	Path     string `json:"path"`
	// ReadOnly is a pointer so that absent means read-only: a host
	// directory is shared read-write only when asked for explicitly.
	ReadOnly *bool `json:"read_only"`
}

// mountOptions translates a create's volumes and host mounts.
func mountOptions(vols []volumeMountRequest, hosts []hostMountRequest) ([]sandbox.VolumeMount, []sandbox.HostMount) {
	var vs []sandbox.VolumeMount
	for _, v := range vols {
		vs = append(vs, sandbox.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	var hs []sandbox.HostMount
	for _, h := range hosts {
		hs = append(hs, sandbox.HostMount{HostPath: h.HostPath, Path: h.Path, ReadWrite: h.ReadOnly != nil && !*h.ReadOnly})
	}
	return vs, hs
}

var (
	errNoVolumes = &Error{http.StatusServiceUnavailable, "unavailable", "volumes are not available on this server"}
	// errNoVolume is the one answer for a volume that is missing or of
	// another tenant.
	errNoVolume    = &Error{http.StatusNotFound, "not_found", "volume not found"}
	errVolumeTaken = &Error{http.StatusConflict, "conflict", "the tenant already has a volume of that name"}
	errVolumeInUse = &Error{http.StatusConflict, "conflict", "the volume is mounted by a sandbox: remove the sandbox first (its attachments name it)"}
	// The faces of a create's mount errors.
	errMountBusy = &Error{http.StatusConflict, "conflict",
		"a volume asked for is mounted elsewhere: a volume is mounted read-write by one sandbox, or read-only by any number (its attachments name them)"}
	errMountVolumeMissing = &Error{http.StatusNotFound, "not_found", "the image or a volume asked for was not found"}
	errHostMountDenied    = &Error{http.StatusForbidden, "permission_denied",
		"host mounts are allowed to API callers only under the directories the server's admin allows (airlock serve --allow-host-mount)"}
	errHostMountSetid = &Error{http.StatusPreconditionFailed, "failed_precondition",
		"a read-write host mount must be on a nosuid,nodev host mount (a guest can set set-id bits on files it writes); mount it read-only, or make it such a mount on the server"}
	errGuestWritten = &Error{http.StatusPreconditionFailed, "failed_precondition",
		"a volume asked for has been written by a microVM's guest kernel: gvisor sandboxes cannot mount it (mount it in qemu sandboxes)"}
)

// faced is an error with a public face for API callers; the local user
// (Local) gets the manager's text, and the server's log has it too.
type faced struct {
	pub *Error
	err error
}

func (f *faced) Error() string { return f.err.Error() }
func (f *faced) Unwrap() error { return f.err }

// face gives err the public face pub.
func face(err error, pub *Error) error { return &faced{pub, err} }

// volumeErr gives the manager's volume errors their public faces.
func volumeErr(err error) error {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return face(err, errNoVolume)
	case errors.Is(err, errdefs.ErrConflict):
		return face(err, errVolumeInUse)
	}
	return err
}

// mountErr gives the errors of a create with mounts their public faces.
func mountErr(err error) error {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return face(err, errMountVolumeMissing)
	case errors.Is(err, errdefs.ErrConflict):
		return face(err, errMountBusy)
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return face(err, errHostMountDenied)
	case errors.Is(err, sandbox.ErrHostMountSetid):
		return face(err, errHostMountSetid)
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return face(err, errGuestWritten)
	}
	return err
}

// PublicMountError is err, from a create with volumes or host mounts, as
// the API shows it (status, code, message), for adapters that answer in
// another envelope (the E2B surface).
func PublicMountError(err error) (status int, code, message string) {
	e := publicError(mountErr(err))
	return e.Status, e.Code, e.Message
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Volumes == nil {
		s.fail(w, r, errNoVolumes)
		return
	}
	var req struct {
		Name   string `json:"name"`
		SizeMB int    `json:"size_mb"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Name == "" {
		s.fail(w, r, invalidf("name is required"))
		return
	}
	if req.SizeMB <= 0 {
		s.fail(w, r, invalidf("size_mb is required (at least %d)", sandbox.MinVolumeMiB))
		return
	}
	c := callerOf(r)
	v, err := s.cfg.Volumes.CreateVolume(r.Context(), c, req.Name, req.SizeMB)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			err = face(err, errVolumeTaken)
		}
		s.fail(w, r, err)
		return
	}
	info, err := s.cfg.Volumes.GetVolume(r.Context(), c, v.Tenant, v.Name)
	if err != nil {
		s.fail(w, r, volumeErr(err))
		return
	}
	writeJSON(w, http.StatusCreated, viewVolume(info))
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Volumes == nil {
		s.fail(w, r, errNoVolumes)
		return
	}
	vols, err := s.cfg.Volumes.ListVolumes(r.Context(), callerOf(r), snapshotTenant(r), truthy(r.URL.Query().Get("all")))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []Volume{}
	for _, v := range vols {
		out = append(out, viewVolume(v))
	}
	writeJSON(w, http.StatusOK, map[string][]Volume{"volumes": out})
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Volumes == nil {
		s.fail(w, r, errNoVolumes)
		return
	}
	v, err := s.cfg.Volumes.GetVolume(r.Context(), callerOf(r), snapshotTenant(r), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, volumeErr(err))
		return
	}
	writeJSON(w, http.StatusOK, viewVolume(v))
}

func (s *Server) resizeVolume(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Volumes == nil {
		s.fail(w, r, errNoVolumes)
		return
	}
	var req struct {
		SizeMB int `json:"size_mb"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.SizeMB <= 0 {
		s.fail(w, r, invalidf("size_mb is required"))
		return
	}
	c, tenant, name := callerOf(r), snapshotTenant(r), r.PathValue("name")
	v, err := s.cfg.Volumes.ResizeVolume(r.Context(), c, tenant, name, req.SizeMB)
	if err != nil {
		s.fail(w, r, volumeErr(err))
		return
	}
	info, err := s.cfg.Volumes.GetVolume(r.Context(), c, v.Tenant, v.Name)
	if err != nil {
		s.fail(w, r, volumeErr(err))
		return
	}
	writeJSON(w, http.StatusOK, viewVolume(info))
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Volumes == nil {
		s.fail(w, r, errNoVolumes)
		return
	}
	if err := s.cfg.Volumes.RemoveVolume(r.Context(), callerOf(r), snapshotTenant(r), r.PathValue("name")); err != nil {
		s.fail(w, r, volumeErr(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
