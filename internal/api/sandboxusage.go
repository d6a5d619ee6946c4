package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// usageRouteTimeout bounds one guest sample of GET /v1/sandboxes/{id}/usage.
const usageRouteTimeout = 5 * time.Second

// SandboxUsage is the API's view of one sample of a running sandbox's
// resource use (GET /v1/sandboxes/{id}/usage).
type SandboxUsage struct {
	SandboxID string `json:"sandbox_id"`
	// SampledAt is when the server got the guest's answer: rates are
	// deltas between two samples over the difference of their SampledAt.
	SampledAt time.Time `json:"sampled_at"`
	// CPUs is the guest's CPU count; CPUSeconds the CPU time all of them
	// have been busy since the guest booted (the guest's own account).
	CPUs       int     `json:"cpus"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// Memory the guest uses (total less available) and has (MemTotal).
	MemoryBytes      uint64 `json:"memory_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes"`
	// The root filesystem as the guest sees it.
	DiskBytes      uint64 `json:"disk_bytes"`
	DiskLimitBytes uint64 `json:"disk_limit_bytes"`
	// Network is absent when the sandbox has no network.
	Network *NetworkUsage `json:"network,omitempty"`
}

// NetworkUsage is a sandbox's network as its shim counts it, since the
// sandbox last started or resumed; receive and transmit are the sandbox's
// point of view.
type NetworkUsage struct {
	ReceiveBytes  uint64 `json:"receive_bytes"`
	TransmitBytes uint64 `json:"transmit_bytes"`
	Connections   int    `json:"connections"`
}

var errNoUsage = &Error{http.StatusServiceUnavailable, "unavailable", "usage sampling is not available on this server"}

// sandboxUsage answers one sample of a running sandbox's resource use. It
// asks through UsageSampler, never Sandboxes.Usage: a poll must not resume
// a paused sandbox, and it is not activity (a dashboard left open does not
// keep a sandbox from its idle pause). A sandbox that is not running is
// 412 naming its state rather than figures without the guest's part: what
// would be left is disk_usage_bytes, which GET /v1/sandboxes/{id} has, and
// zeros would read as a real sample on a chart.
func (s *Server) sandboxUsage(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sampler, ok := s.cfg.Sandboxes.(UsageSampler)
	if !ok {
		s.fail(w, r, errNoUsage)
		return
	}
	if sb.State != store.StateRunning {
		s.fail(w, r, notRunning(sb.State))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.usageTimeout)
	defer cancel()
	u, err := sampler.SampleUsage(ctx, sb.ID)
	switch {
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		// It left the running state after the look-up (paused, stopping).
		if now, gerr := s.cfg.Sandboxes.Get(r.Context(), callerOf(r), sb.ID); gerr == nil && now.State != store.StateRunning {
			err = notRunning(now.State)
		}
		s.fail(w, r, err)
		return
	case errors.Is(err, errdefs.ErrNotFound):
		s.fail(w, r, noSandbox(r, err))
		return
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		s.log.Warn("usage sample timed out", "request_id", requestID(r), "sandbox_id", sb.ID, "err", err)
		s.fail(w, r, &Error{http.StatusServiceUnavailable, "unavailable", "the sandbox's guest did not answer in time; retry later"})
		return
	case err != nil:
		s.fail(w, r, err)
		return
	}
	out := SandboxUsage{
		SandboxID: sb.ID, SampledAt: time.Now().UTC(),
		CPUs: u.CPUs, CPUSeconds: u.CPUBusy.Seconds(),
		MemoryBytes: u.MemTotal - min(u.MemAvailable, u.MemTotal), MemoryLimitBytes: u.MemTotal,
		DiskBytes: u.DiskUsed, DiskLimitBytes: u.DiskTotal,
	}
	if n := u.Network; n != nil {
		out.Network = &NetworkUsage{ReceiveBytes: n.ReceiveBytes, TransmitBytes: n.TransmitBytes, Connections: n.Connections}
	}
	writeJSON(w, http.StatusOK, out)
}

// notRunning is the usage route's answer for a sandbox in state st: the
// state is the caller's own sandbox's, so it may be named.
func notRunning(st store.State) error {
	return &Error{http.StatusPreconditionFailed, "failed_precondition",
		fmt.Sprintf("the sandbox is %s: usage is sampled only while it runs (asking does not resume it)", st)}
}
