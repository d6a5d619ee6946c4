package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// moveRequest is POST /v1/sandboxes/{id}/move's body.
type moveRequest struct {
	// To is the node to move to; "": the placement's pick among the other
	// live nodes.
	To string `json:"to"`
}

// moveLive moves a sandbox off its live node, for an operator (an admin
// key): to drain a node before maintenance (mark it draining, then move
// each of its sandboxes). A running sandbox is paused through its node's
// export, imported by the other node, forgotten by the first and resumed;
// a paused one stays paused. If the other node refuses it, the sandbox
// stays on its node (and runs again if it ran). Audited as sandbox.move
// with the reason "requested".
func (s *Server) moveLive(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	if !k.Admin {
		writeError(w, http.StatusForbidden, "permission_denied", "moving a sandbox between nodes needs an admin key")
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req moveRequest
	if len(body) > 0 && json.Unmarshal(body, &req) != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", `the body is not {"to": "NODE"}`)
		return
	}
	p, from, ok := s.placement(w, r, k)
	if !ok {
		return
	}
	if req.To == from.Name {
		writeError(w, http.StatusBadRequest, "invalid_argument", "sandbox "+p.SandboxID+" is on node "+from.Name+" already")
		return
	}
	owner := k
	owner.Tenant = p.Tenant // the node acts for the sandbox's tenant
	view, err := s.viewOn(r.Context(), from, owner, p.SandboxID)
	if err != nil {
		writeError(w, http.StatusBadGateway, "unavailable", err.Error())
		return
	}
	state := view.State
	t0 := time.Now()
	switch {
	case state == "running":
		res, out, ok := s.export(w, r, owner, p, from, nil)
		if !ok {
			return
		}
		if res.StatusCode != http.StatusOK {
			relay(w, res, out)
			return
		}
	case state != "paused":
		writeError(w, http.StatusConflict, "failed_precondition", "sandbox "+p.SandboxID+" is "+state+": only a running or paused sandbox moves")
		return
	}
	if p, err = s.cfg.Store.PlacementOf(r.Context(), p.SandboxID); err != nil {
		s.internal(w, err)
		return
	}
	if p.BundleDigest == "" {
		s.resumeIf(r.Context(), state, from, owner, p)
		writeError(w, http.StatusConflict, "failed_precondition", "sandbox "+p.SandboxID+" cannot move: "+view.unmovable())
		return
	}
	var only []string
	for _, n := range s.cfg.Nodes.Nodes() {
		if n.Name != from.Name && (req.To == "" || n.Name == req.To) {
			only = append(only, n.Name)
		}
	}
	to, err := s.place(r.Context(), cluster.Request{CPUs: p.CPUs, MemoryMiB: int64(p.MemoryMiB), Arch: from.Arch, Runtime: view.Runtime, OnlyNodes: only,
		OnlyWhy: "room for it (other than " + from.Name + ")"})
	if err != nil {
		s.resumeIf(r.Context(), state, from, owner, p)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "no node can take sandbox "+p.SandboxID+": "+err.Error())
		return
	}
	if won, err := s.cfg.Store.MovePlacement(r.Context(), p.ID, from.Name, to.Name, p.BundleDigest); err != nil || !won {
		writeError(w, http.StatusConflict, "conflict", "sandbox "+p.SandboxID+" changed while it was being moved; retry")
		return
	}
	ref, _ := json.Marshal(bundle.Ref{Sandbox: p.SandboxID, Digest: p.BundleDigest, Bytes: p.BundleBytes})
	if why := s.importOn(r.Context(), to, owner, ref); why != "" {
		// Back to the node that has it, as it was.
		_, _ = s.cfg.Store.MovePlacement(context.WithoutCancel(r.Context()), p.ID, to.Name, from.Name, p.BundleDigest)
		s.resumeIf(r.Context(), state, from, owner, p)
		writeError(w, http.StatusConflict, "failed_precondition", fmt.Sprintf("node %s could not take sandbox %s, which stays on %s: %s", to.Name, p.SandboxID, from.Name, why))
		return
	}
	// The first node forgets its copy (and leaves the bundle the new
	// copy resumes from).
	if res, err := s.callNode(context.WithoutCancel(r.Context()), from, controlCaller, http.MethodPost, "/v1/node/sandboxes/"+p.SandboxID+"/forget", nil); err == nil {
		res.Body.Close()
	} else {
		s.cfg.Log.Warn("control: forgetting a moved sandbox's old copy; the node's reconciliation forgets it when it comes back", "sandbox_id", p.SandboxID, "node", from.Name, "err", err)
	}
	_, _ = s.cfg.Store.AppendEvent(context.WithoutCancel(r.Context()), store.Event{Tenant: p.Tenant, KeyID: k.ID, SandboxID: p.SandboxID, Action: "sandbox.move",
		Detail: map[string]any{"from": from.Name, "to": to.Name, "reason": "requested", "digest": p.BundleDigest, "bytes": p.BundleBytes, "duration_ms": time.Since(t0).Milliseconds()}})
	if state == "running" {
		if err := s.cfg.Store.DropPlacementBundle(r.Context(), p.ID); err != nil {
			s.internal(w, err)
			return
		}
		if why := s.resumeOn(r.Context(), to, owner, p.SandboxID); why != "" {
			writeError(w, http.StatusBadGateway, "unavailable", "sandbox "+p.SandboxID+" moved to "+to.Name+" and is paused there: its resume failed: "+why)
			return
		}
	}
	s.cfg.Log.Info("control: moved a sandbox on request", "sandbox_id", p.SandboxID, "from", from.Name, "to", to.Name, "took", time.Since(t0))
	writeJSON(w, http.StatusOK, map[string]any{"id": p.SandboxID, "from": from.Name, "to": to.Name, "state": state, "duration_ms": time.Since(t0).Milliseconds()})
}

// nodeView is what a move reads of a sandbox from its node.
type nodeView struct {
	State   string `json:"state"`
	Runtime string `json:"runtime"`
	Mounts  []any  `json:"mounts"`
}

// viewOn reads sandbox id from node n.
func (s *Server) viewOn(ctx context.Context, n cluster.Node, k store.APIKey, id string) (nodeView, error) {
	res, err := s.callNode(ctx, n, k, http.MethodGet, "/v1/sandboxes/"+id, nil)
	if err != nil {
		return nodeView{}, fmt.Errorf("node %s did not answer: %w", n.Name, err)
	}
	defer res.Body.Close()
	var v nodeView
	if res.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&v) != nil {
		return nodeView{}, fmt.Errorf("node %s: %s", n.Name, res.Status)
	}
	return v, nil
}

// unmovable is why its node wrote no bundle of paused sandbox v.
func (v nodeView) unmovable() string {
	switch {
	case v.Runtime != "" && v.Runtime != "qemu" && v.Runtime != "gvisor":
		return "only QEMU and gVisor sandboxes move between nodes"
	case len(v.Mounts) > 0:
		return "its volumes and host directories are not part of its saved state"
	}
	return "its node wrote no bundle of it (a node without --bundle-dir, a sandbox with secret values, or an idle pause the node has not swept yet)"
}

// importOn has node n import the bundle ref (JSON); it answers why not,
// or "".
func (s *Server) importOn(ctx context.Context, n cluster.Node, k store.APIKey, ref []byte) string {
	res, err := s.callNode(ctx, n, k, http.MethodPost, "/v1/node/import", ref)
	if err != nil {
		return "it did not answer: " + err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if res.StatusCode != http.StatusCreated {
		return errorMessage(b, res.Status)
	}
	return ""
}

// resumeOn resumes sandbox id on node n; it answers why not, or "".
func (s *Server) resumeOn(ctx context.Context, n cluster.Node, k store.APIKey, id string) string {
	res, err := s.callNode(ctx, n, k, http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
	if err != nil {
		return err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if res.StatusCode/100 != 2 {
		return errorMessage(b, res.Status)
	}
	return ""
}

// resumeIf resumes p's sandbox on node n again if it was running before
// a move that did not happen (best effort: logged), its bundle dropped
// from the placement first, as before any resume.
func (s *Server) resumeIf(ctx context.Context, state string, n cluster.Node, k store.APIKey, p store.Placement) {
	if state != "running" {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if err := s.cfg.Store.DropPlacementBundle(ctx, p.ID); err != nil {
		s.cfg.Log.Warn("control: resuming a sandbox whose move did not happen", "sandbox_id", p.SandboxID, "err", err)
		return
	}
	if why := s.resumeOn(ctx, n, k, p.SandboxID); why != "" {
		s.cfg.Log.Warn("control: resuming a sandbox whose move did not happen", "sandbox_id", p.SandboxID, "node", n.Name, "why", why)
	}
}
