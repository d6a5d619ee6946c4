package api

import (
	"context"
	"net/http"
	"time"
)

// lifecycleTimeout bounds a pause or resume. Neither is abandoned when the
// client goes away: a save or restore cut half-way helps nobody.
const lifecycleTimeout = 5 * time.Minute

// pauseResponse is the sandbox after a pause, with what the pause saved.
type pauseResponse struct {
	Sandbox
	Pause pauseStats `json:"pause"`
}

type pauseStats struct {
	StateBytes int64 `json:"state_bytes"` // memory and device state written (0: it was already paused)
	SaveMs     int64 `json:"save_ms"`     // how long the guest was stopped for the save
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req struct {
		Force bool `json:"force"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	res, err := s.cfg.Sandboxes.Pause(ctx, callerOf(r), sb.ID, req.Force)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	stats := pauseStats{StateBytes: res.StateBytes, SaveMs: res.Save.Milliseconds()}
	if sb, err = s.cfg.Sandboxes.Get(ctx, callerOf(r), sb.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, pauseResponse{s.view(sb), stats})
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	if sb, err = s.cfg.Sandboxes.Resume(ctx, callerOf(r), sb.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.view(sb))
}

// keepalive counts as activity for the idle-pause timer; like any call it
// resumes a paused sandbox.
func (s *Server) keepalive(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Sandboxes.Touch(r.Context(), callerOf(r), sb.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
