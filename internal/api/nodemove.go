package api

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Mover moves paused sandboxes between a cluster's nodes
// (sandbox.Manager's Export and Import). Its routes are a node's only
// (Config.NodeToken), under /v1/node/, for the control tier.
type Mover interface {
	Export(ctx context.Context, c sandbox.Caller, id string, force bool) (sandbox.Exported, error)
	Import(ctx context.Context, c sandbox.Caller, ref bundle.Ref) (store.Sandbox, error)
	Forget(ctx context.Context, c sandbox.Caller, id string) error
	DropBundle(ctx context.Context, c sandbox.Caller, ref bundle.Ref) error
	Bundled(ctx context.Context, c sandbox.Caller) ([]bundle.Ref, error)
}

// exportResponse is a pause's answer with the bundle it wrote (nil: the
// sandbox stays on this node, Unmovable says why when it is the
// sandbox's doing).
type exportResponse struct {
	pauseResponse
	Bundle    *bundle.Ref `json:"bundle"`
	Unmovable string      `json:"unmovable,omitempty"`
}

func (s *Server) mountNodeRoutes() {
	if s.cfg.NodeToken == nil || s.cfg.Mover == nil {
		return
	}
	s.HandleAuthenticated("POST /v1/node/sandboxes/{id}/export", http.HandlerFunc(s.exportSandbox))
	s.HandleAuthenticated("POST /v1/node/import", http.HandlerFunc(s.importSandbox))
	s.HandleAuthenticated("POST /v1/node/sandboxes/{id}/forget", http.HandlerFunc(s.forgetSandbox))
	s.HandleAuthenticated("POST /v1/node/bundles/drop", http.HandlerFunc(s.dropBundle))
	s.HandleAuthenticated("GET /v1/node/bundles", http.HandlerFunc(s.listBundles))
}

// listBundles lists the bundles of this node's paused sandboxes.
func (s *Server) listBundles(w http.ResponseWriter, r *http.Request) {
	refs, err := s.cfg.Mover.Bundled(r.Context(), callerOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"bundles": refs})
}

// dropBundle deletes a bundle whose sandbox is gone.
func (s *Server) dropBundle(w http.ResponseWriter, r *http.Request) {
	var ref bundle.Ref
	if err := decodeJSON(w, r, &ref); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.cfg.Mover.DropBundle(r.Context(), callerOf(r), ref); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forgetSandbox removes this node's stale copy of a sandbox that moved,
// leaving its bundle.
func (s *Server) forgetSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Mover.Forget(r.Context(), callerOf(r), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// exportSandbox pauses a sandbox and writes its bundle.
func (s *Server) exportSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Force bool `json:"force"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	ex, err := s.cfg.Mover.Export(ctx, callerOf(r), r.PathValue("id"), req.Force)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.cfg.Sandboxes.Get(ctx, callerOf(r), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, exportResponse{pauseResponse{s.view(sb), pauseStats{StateBytes: ex.Pause.StateBytes, SaveMs: ex.Pause.Save.Milliseconds()}},
		ex.Bundle, ex.Unmovable})
}

// importSandbox records a bundle's sandbox on this node, paused.
func (s *Server) importSandbox(w http.ResponseWriter, r *http.Request) {
	var ref bundle.Ref
	if err := decodeJSON(w, r, &ref); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
	defer cancel()
	sb, err := s.cfg.Mover.Import(ctx, callerOf(r), ref)
	if errors.Is(err, errdefs.ErrFailedPrecondition) {
		// Why this node cannot resume it (a corrupt bundle, another
		// kernel, a missing image) is what the tenant's sandbox failed
		// of: it names the sandbox's own things, not the host's secrets.
		err = &Error{http.StatusPreconditionFailed, "failed_precondition", strings.ReplaceAll(err.Error(), errdefs.ErrFailedPrecondition.Error()+": ", "")}
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.view(sb))
}
