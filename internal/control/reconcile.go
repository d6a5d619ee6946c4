package control

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// A node that becomes live (first seen by this replica, or back after it
// was lost) is reconciled with the catalog (OnNodeLive):
//
//   - a sandbox whose placement is on another node (it moved while this
//     one was gone) is forgotten there: that copy is stale, and no call
//     is ever routed to it (its bundle stays, for the copy that moved);
//   - a sandbox whose placement on it was marked lost runs (or is paused)
//     there still: it is placed again, and calls reach it as before;
//   - a sandbox of a tenant with no placement at all (a create whose
//     replica died before it recorded the answer, or one deleted while
//     its node was lost) is removed once it is older than the longest a
//     create may wait for its node, so a create in flight is never taken.
//
// Sandboxes of the node's local user (no tenant) are not the cluster's.
// Each step is audited (sandbox.unplace with "stale copy", sandbox.place
// with "its node came back", sandbox.orphan).

// controlCaller is who the control tier is on a node for its own work:
// an admin, of no tenant's.
var controlCaller = store.APIKey{ID: "airlock-control", Tenant: "airlock-control", Admin: true}

// orphanAge is how old a sandbox with no placement must be before it is
// removed: past store's pending reservations' lifetime.
const orphanAge = 31 * time.Minute

// reconcileTries is how many times OnNodeLive tries a node (a node just
// back may not answer at once), waiting reconcileBackoff, then twice that,
// and so on, between tries.
const reconcileTries = 5

var reconcileBackoff = time.Second

// OnNodeLive reconciles node n with the catalog (the Registry's OnLive),
// in the background: the Registry's own loop must not wait on a node. A
// try that fails is made again with the node as the Registry sees it
// then, while it stays live.
func (s *Server) OnNodeLive(n cluster.Node) {
	s.reconciling.Add(1)
	go func() {
		defer s.reconciling.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		wait := reconcileBackoff
		for try := 1; ; try++ {
			err := s.reconcile(ctx, n)
			if err == nil {
				return
			}
			s.cfg.Log.Warn("control: reconcile a node", "node", n.Name, "try", try, "of", reconcileTries, "err", err)
			if try == reconcileTries {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait *= 2
			now, ok := s.node(n.Name)
			if !ok {
				return // lost again: its next OnNodeLive reconciles it
			}
			n = now
		}
	}()
}

// WaitReconciled waits for the reconciliations OnNodeLive started.
func (s *Server) WaitReconciled() { s.reconciling.Wait() }

func (s *Server) reconcile(ctx context.Context, n cluster.Node) error {
	res, err := s.callNode(ctx, n, controlCaller, http.MethodGet, "/v1/sandboxes", nil)
	if err != nil {
		return err
	}
	var page struct {
		Sandboxes []struct {
			ID        string    `json:"id"`
			Tenant    string    `json:"tenant"`
			CreatedAt time.Time `json:"created_at"`
		} `json:"sandboxes"`
	}
	err = json.NewDecoder(io.LimitReader(res.Body, 64<<20)).Decode(&page)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || err != nil {
		return errors.New("the node's list: " + res.Status)
	}
	for _, sb := range page.Sandboxes {
		if sb.Tenant == "" {
			continue
		}
		p, err := s.cfg.Store.PlacementOf(ctx, sb.ID)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			if time.Since(sb.CreatedAt) > orphanAge {
				s.removeFrom(ctx, n, sb.ID, sb.Tenant, false, "sandbox.orphan", "no placement in the catalog")
			}
		case err != nil:
			return err
		case p.Node != n.Name:
			// Forgotten, not deleted: the bundle it was paused into may be
			// what the copy on p.Node resumes from.
			s.removeFrom(ctx, n, sb.ID, sb.Tenant, true, "sandbox.unplace", "stale copy: the sandbox moved to node "+p.Node)
		case p.State == store.PlacementLost:
			if err := s.cfg.Store.RestorePlacement(ctx, p.ID, n.Name); err != nil {
				return err
			}
			_, _ = s.cfg.Store.AppendEvent(ctx, store.Event{Tenant: p.Tenant, SandboxID: sb.ID, Action: "sandbox.place",
				Detail: map[string]any{"node": n.Name, "why": "its node came back"}})
			s.cfg.Log.Info("control: a lost node's sandbox is placed again", "node", n.Name, "sandbox_id", sb.ID)
		}
	}
	return nil
}

// removeFrom removes sandbox id from node n, auditing action with why:
// forgotten (the node's forget route: its bundle stays) or deleted.
func (s *Server) removeFrom(ctx context.Context, n cluster.Node, id, tenant string, forget bool, action, why string) {
	method, path := http.MethodDelete, "/v1/sandboxes/"+id
	if forget {
		method, path = http.MethodPost, "/v1/node/sandboxes/"+id+"/forget"
	}
	res, err := s.callNode(ctx, n, controlCaller, method, path, nil)
	if err != nil {
		s.cfg.Log.Warn("control: remove from a node", "node", n.Name, "sandbox_id", id, "err", err)
		return
	}
	res.Body.Close()
	if res.StatusCode/100 != 2 && res.StatusCode != http.StatusNotFound {
		s.cfg.Log.Warn("control: remove from a node", "node", n.Name, "sandbox_id", id, "status", res.Status)
		return
	}
	_, _ = s.cfg.Store.AppendEvent(ctx, store.Event{Tenant: tenant, SandboxID: id, Action: action, Detail: map[string]any{"node": n.Name, "why": why}})
	s.cfg.Log.Info("control: removed a sandbox from a node", "node", n.Name, "sandbox_id", id, "why", why)
}

// RunBundleSync records, every sandbox.SweepEvery until ctx ends, the
// bundles the live nodes wrote of their own (sandbox.SweepBundles: a
// sandbox its shim paused after an idle period) in the placements that
// have none, so that those sandboxes too resume on another node if theirs
// is lost. Every replica may run it: the writes are the same.
func (s *Server) RunBundleSync(ctx context.Context) {
	tick := time.NewTicker(sandbox.SweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, n := range s.cfg.Nodes.Nodes() {
			if n.Live {
				s.syncBundles(ctx, n)
			}
		}
	}
}

// syncBundles records node n's bundles in the placements on n that have
// none.
func (s *Server) syncBundles(ctx context.Context, n cluster.Node) {
	res, err := s.callNode(ctx, n, controlCaller, http.MethodGet, "/v1/node/bundles", nil)
	if err != nil {
		return
	}
	defer res.Body.Close()
	var page struct {
		Bundles []bundle.Ref `json:"bundles"`
	}
	if res.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(res.Body, 16<<20)).Decode(&page) != nil {
		return
	}
	for _, ref := range page.Bundles {
		p, err := s.cfg.Store.PlacementOf(ctx, ref.Sandbox)
		if err != nil || p.Node != n.Name || p.State != store.PlacementPlaced || p.BundleDigest != "" || ref.Validate() != nil {
			continue
		}
		if err := s.cfg.Store.SetPlacementBundle(ctx, p.ID, ref.Digest, ref.Bytes); err != nil {
			s.cfg.Log.Warn("control: recording a node's bundle", "sandbox_id", ref.Sandbox, "err", err)
		}
	}
}
