package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Sandbox is the API's view of a sandbox.
type Sandbox struct {
	ID          string    `json:"id"`
	State       string    `json:"state"`
	Reason      string    `json:"reason"`
	Image       string    `json:"image"`
	ImageDigest string    `json:"image_digest"`
	CPUs        int       `json:"cpus"`
	MemoryMB    int       `json:"memory_mb"`
	DiskMB      int       `json:"disk_mb"`
	CreatedAt   time.Time `json:"created_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	Accel       string    `json:"accel"`
	GuestKernel string    `json:"guest_kernel"`
	StartMode   string    `json:"start_mode"`
	// Runtime runs it: "qemu" (a microVM) or "gvisor" (runsc).
	Runtime  string            `json:"runtime"`
	Metadata map[string]string `json:"metadata"`
	Tenant   string            `json:"tenant"`
	// Network is the sandbox's network spec as the catalog keeps it: secret
	// names, hosts and placeholders, never values.
	Network netconf.Spec `json:"network"`
	// IdlePauseS is the idle time after which the sandbox pauses itself
	// (0: never).
	IdlePauseS int64 `json:"idle_pause_s"`
	// PausedAt is when it was last paused (absent if never).
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// LifetimeLeftS is, while paused, the running time it has left: the
	// lifetime counts running time only, and a resume sets expires_at to
	// now plus it. Absent unless paused.
	LifetimeLeftS *int64 `json:"lifetime_left_s,omitempty"`
	// Source is where the sandbox came from: "" (an image),
	// "snapshot:<name>" or "fork:<sandbox id>".
	Source string `json:"source"`
	// DiskUsageBytes is what the sandbox's files take on the server's disk
	// (disk overlay, paused state, logs); 0 when the server does not say.
	DiskUsageBytes int64 `json:"disk_usage_bytes"`
	// Mounts are its volumes and host directories, fixed at create.
	Mounts []Mount `json:"mounts"`
}

func viewSandbox(sb store.Sandbox) Sandbox {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	v := Sandbox{
		ID: sb.ID, State: string(sb.State), Reason: sb.Reason, Image: sb.Image, ImageDigest: sb.ImageDigest,
		CPUs: sb.CPUs, MemoryMB: sb.MemoryMiB, DiskMB: sb.DiskMiB,
		CreatedAt: sb.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt.UTC(),
		Accel: sb.Accel, GuestKernel: sb.Kernel, StartMode: sb.StartMode, Runtime: sb.Runtime, Metadata: md, Tenant: sb.Tenant,
		Network: sb.Network, IdlePauseS: int64(sb.IdlePause / time.Second), Source: sb.Source,
		Mounts: viewMounts(sb.Mounts),
	}
	v.PausedAt, v.LifetimeLeftS = sb.PauseView()
	return v
}

// view is viewSandbox with the sandbox's disk usage.
func (s *Server) view(sb store.Sandbox) Sandbox {
	v := viewSandbox(sb)
	if s.cfg.Snapshots != nil {
		v.DiskUsageBytes = s.cfg.Snapshots.DiskUsage(sb.ID)
	}
	return v
}

type createRequest struct {
	Image    string            `json:"image"`
	CPUs     int               `json:"cpus"`
	MemoryMB int               `json:"memory_mb"`
	DiskMB   int               `json:"disk_mb"`
	TimeoutS int               `json:"timeout_s"`
	Env      map[string]string `json:"env"`
	Metadata map[string]string `json:"metadata"`
	Network  *networkRequest   `json:"network"`
	// IdlePauseS pauses the sandbox after this many idle seconds (0:
	// never).
	IdlePauseS int `json:"idle_pause_s"`
	// FromSnapshot starts the sandbox from the tenant's snapshot of that
	// name (its size, image, env and network).
	FromSnapshot string `json:"from_snapshot"`
	// Volumes and Mounts are mounted for the sandbox's life.
	Volumes []volumeMountRequest `json:"volumes"`
	Mounts  []hostMountRequest   `json:"mounts"`
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.CPUs < 0 || req.MemoryMB < 0 || req.DiskMB < 0 || req.TimeoutS < 0 || req.IdlePauseS < 0 {
		s.fail(w, r, invalidf("cpus, memory_mb, disk_mb, timeout_s and idle_pause_s must not be negative"))
		return
	}
	if req.IdlePauseS > int(sandbox.MaxIdlePause/time.Second) {
		s.fail(w, r, invalidf("idle_pause_s must be at most %d", int(sandbox.MaxIdlePause/time.Second)))
		return
	}
	if req.TimeoutS > int(sandbox.MaxTimeout/time.Second) {
		s.fail(w, r, invalidf("timeout_s must be at most %d", int(sandbox.MaxTimeout/time.Second)))
		return
	}
	if req.FromSnapshot != "" {
		s.createFromSnapshot(w, r, req)
		return
	}
	o := sandbox.CreateOptions{
		Image: req.Image, CPUs: req.CPUs, MemoryMiB: req.MemoryMB, DiskMiB: req.DiskMB,
		Timeout: time.Duration(req.TimeoutS) * time.Second, Metadata: req.Metadata, Env: req.Env,
		IdlePause: time.Duration(req.IdlePauseS) * time.Second,
	}
	o.Volumes, o.HostMounts = mountOptions(req.Volumes, req.Mounts)
	c := callerOf(r)
	var err error
	if o.Network, o.Secrets, err = networkOptions(req.Network, c.Admin); err != nil {
		s.fail(w, r, err)
		return
	}
	// The manager checks the quota, cleans up on failure and audits.
	sb, err := s.cfg.Sandboxes.Create(r.Context(), c, o)
	if err != nil {
		if len(o.Volumes)+len(o.HostMounts) > 0 {
			err = mountErr(err)
		}
		s.fail(w, r, err)
		return
	}
	s.metrics.creates.Inc()
	writeJSON(w, http.StatusCreated, s.view(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	sbs, err := s.cfg.Sandboxes.List(r.Context(), callerOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	state := q.Get("state")
	out := []Sandbox{}
next:
	for _, sb := range sbs {
		if state != "" && string(sb.State) != state {
			continue
		}
		for name, vals := range q {
			if key, ok := strings.CutPrefix(name, "metadata."); ok {
				if v, has := sb.Metadata[key]; !has || v != vals[0] {
					continue next
				}
			}
		}
		out = append(out, s.view(sb))
	}
	writeJSON(w, http.StatusOK, map[string][]Sandbox{"sandboxes": out})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.view(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Sandboxes.Remove(r.Context(), callerOf(r), sb.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req struct {
		TimeoutS int `json:"timeout_s"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.TimeoutS < 1 || req.TimeoutS > int(sandbox.MaxTimeout/time.Second) {
		s.fail(w, r, invalidf("timeout_s must be between 1 and %d", int(sandbox.MaxTimeout/time.Second)))
		return
	}
	if err := s.cfg.Sandboxes.SetTimeout(r.Context(), callerOf(r), sb.ID, time.Duration(req.TimeoutS)*time.Second); err != nil {
		s.fail(w, r, err)
		return
	}
	if sb, err = s.cfg.Sandboxes.Get(r.Context(), callerOf(r), sb.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.view(sb))
}
