package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Snapshot is the API's view of a snapshot. Env and secrets are never
// shown (sandboxes with secrets are never saved).
type Snapshot struct {
	Name        string       `json:"name"`
	ID          string       `json:"id"`
	SandboxID   string       `json:"sandbox_id"`
	Tenant      string       `json:"tenant"`
	Image       string       `json:"image"`
	ImageDigest string       `json:"image_digest"`
	CPUs        int          `json:"cpus"`
	MemoryMB    int          `json:"memory_mb"`
	DiskMB      int          `json:"disk_mb"`
	Network     netconf.Spec `json:"network"`
	SizeBytes   int64        `json:"size_bytes"`
	CreatedAt   time.Time    `json:"created_at"`
}

func viewSnapshot(sn store.Snapshot) Snapshot {
	return Snapshot{
		Name: sn.Name, ID: sn.ID, SandboxID: sn.SandboxID, Tenant: sn.Tenant, Image: sn.Image, ImageDigest: sn.ImageDigest,
		CPUs: sn.CPUs, MemoryMB: sn.MemoryMiB, DiskMB: sn.DiskMiB, Network: sn.Network, SizeBytes: sn.Size,
		CreatedAt: sn.Created.UTC(),
	}
}

// forkBasePrefix names the unlisted snapshots forks start from (the
// manager's fork bases): hidden from lists unless an admin asks for all.
const forkBasePrefix = "_fork-"

var (
	errNoSnapshots = &Error{http.StatusServiceUnavailable, "unavailable", "snapshots are not available on this server"}
	// errNoSnapshot is the one answer for a snapshot that is missing or of
	// another tenant.
	errNoSnapshot    = &Error{http.StatusNotFound, "not_found", "snapshot not found"}
	errSnapshotTaken = &Error{http.StatusConflict, "conflict", "the tenant already has a snapshot of that name (remove it first)"}
	errSnapshotInUse = &Error{http.StatusPreconditionFailed, "failed_precondition",
		"the snapshot backs the disks of sandboxes (made from it or forked) or of other snapshots; remove them first"}
	errCannotSnapshot = &Error{http.StatusPreconditionFailed, "failed_precondition",
		"the sandbox cannot be saved now: it has secrets, runs commands or code (use force to end them), or is not running"}
	errSnapshotMounts = &Error{http.StatusPreconditionFailed, "failed_precondition",
		"the sandbox has volumes or host mounts: snapshots and forks of such sandboxes are refused (their data is not part of a snapshot)"}
	errPruneNeedsAdmin = &Error{http.StatusForbidden, "permission_denied", "pruning snapshots needs an admin key"}
)

// snapshotTenant is the ?tenant= query parameter: whose snapshots an
// admin acts on (the manager ignores it for other callers).
func snapshotTenant(r *http.Request) string { return r.URL.Query().Get("tenant") }

// snapshotErr gives the manager's snapshot errors their public faces.
func snapshotErr(err error) error {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return errNoSnapshot
	case errors.Is(err, errdefs.ErrConflict):
		return errSnapshotTaken
	}
	return err
}

func (s *Server) snapshotSandbox(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req struct {
		Name  string `json:"name"`
		Force bool   `json:"force"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Name == "" {
		s.fail(w, r, invalidf("name is required"))
		return
	}
	if strings.HasPrefix(req.Name, forkBasePrefix) {
		s.fail(w, r, invalidf("snapshot names starting with %q are reserved", forkBasePrefix))
		return
	}
	if err := sandbox.ValidateSnapshotName(req.Name); err != nil {
		s.fail(w, r, err)
		return
	}
	// Like a pause, a snapshot cut half-way helps nobody.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	sn, err := s.cfg.Snapshots.Snapshot(ctx, callerOf(r), sb.ID, req.Name, req.Force)
	if err != nil {
		switch {
		case errors.Is(err, errdefs.ErrConflict):
			err = errSnapshotTaken
		case errors.Is(err, sandbox.ErrHasMounts):
			err = errSnapshotMounts
		case errors.Is(err, errdefs.ErrFailedPrecondition):
			err = errCannotSnapshot
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewSnapshot(sn))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	sns, err := s.cfg.Snapshots.ListSnapshots(r.Context(), callerOf(r), snapshotTenant(r), truthy(r.URL.Query().Get("all")))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []Snapshot{}
	for _, sn := range sns {
		out = append(out, viewSnapshot(sn))
	}
	writeJSON(w, http.StatusOK, map[string][]Snapshot{"snapshots": out})
}

func truthy(v string) bool { return v == "1" || v == "true" }

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	sn, err := s.cfg.Snapshots.GetSnapshot(r.Context(), callerOf(r), snapshotTenant(r), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, snapshotErr(err))
		return
	}
	writeJSON(w, http.StatusOK, viewSnapshot(sn))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	if err := s.cfg.Snapshots.RemoveSnapshot(r.Context(), callerOf(r), snapshotTenant(r), r.PathValue("name")); err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			err = errSnapshotInUse
		}
		s.fail(w, r, snapshotErr(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pruneSnapshots removes the fork bases no sandbox uses any more and
// orphaned snapshot files. It acts across tenants: admin keys only.
func (s *Server) pruneSnapshots(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	freed, err := s.cfg.Snapshots.PruneSnapshots(context.WithoutCancel(r.Context()), callerOf(r))
	if err != nil {
		if errors.Is(err, sandbox.ErrNeedsAdmin) {
			err = errPruneNeedsAdmin
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int64{"freed_bytes": freed})
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	req := struct {
		Count   int  `json:"count"`
		Force   bool `json:"force"`
		Secrets bool `json:"secrets"` // bind the source's secret values in each fork
	}{Count: 1}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Count < 1 || req.Count > sandbox.MaxForks {
		s.fail(w, r, invalidf("count must be between 1 and %d", sandbox.MaxForks))
		return
	}
	// The manager charges the forks to the source's tenant, whose they
	// are, and makes all or none: the client learns no ids of a failed
	// fork.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	forks, err := s.cfg.Snapshots.Fork(ctx, callerOf(r), sb.ID, sandbox.ForkOptions{Count: req.Count, Force: req.Force, Secrets: req.Secrets})
	if err != nil {
		if errors.Is(err, sandbox.ErrHasMounts) {
			err = errSnapshotMounts
		} else if errors.Is(err, errdefs.ErrFailedPrecondition) {
			err = errCannotSnapshot
		}
		s.fail(w, r, err)
		return
	}
	out := make([]Sandbox, 0, len(forks))
	for _, f := range forks {
		s.metrics.creates.Inc()
		out = append(out, s.view(f))
	}
	writeJSON(w, http.StatusCreated, map[string][]Sandbox{"sandboxes": out})
}

// createFromSnapshot serves POST /v1/sandboxes with from_snapshot: the
// size, image, env and network are the snapshot's.
func (s *Server) createFromSnapshot(w http.ResponseWriter, r *http.Request, req createRequest) {
	if s.cfg.Snapshots == nil {
		s.fail(w, r, errNoSnapshots)
		return
	}
	if req.Env != nil || req.Network != nil {
		s.fail(w, r, invalidf("from_snapshot: env and network come from the snapshot; leave them out"))
		return
	}
	// The snapshot is the caller's tenant's (fork bases are not found); the
	// manager checks the quota and audits.
	o := sandbox.CreateOptions{
		Image: req.Image, CPUs: req.CPUs, MemoryMiB: req.MemoryMB, DiskMiB: req.DiskMB,
		Timeout: time.Duration(req.TimeoutS) * time.Second, Metadata: req.Metadata,
		IdlePause: time.Duration(req.IdlePauseS) * time.Second,
	}
	// The manager refuses mounts on a sandbox from a snapshot.
	o.Volumes, o.HostMounts = mountOptions(req.Volumes, req.Mounts)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	sb, err := s.cfg.Snapshots.CreateFromSnapshot(ctx, callerOf(r), req.FromSnapshot, o)
	if err != nil {
		s.fail(w, r, snapshotErr(err))
		return
	}
	s.metrics.creates.Inc()
	writeJSON(w, http.StatusCreated, s.view(sb))
}
