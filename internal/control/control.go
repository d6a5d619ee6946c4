// Package control is a cluster's control tier: the API that tenants call
// when airlock runs on many nodes. A replica keeps no state of its own:
// API keys, quotas, the audit trail and each sandbox's placement are in
// the cluster's catalog (PostgreSQL, shared by every replica), and the
// nodes are those the cluster Registry sees live.
//
// A replica authenticates the tenant's key, reserves the sandbox against
// the tenant's quotas and places it on a node (cluster.Place), then asks
// that node, with the node token and the caller it authenticated
// (api.NodeCallerHeader). Every other call about a sandbox is proxied to
// the node that runs it, streams and WebSockets included; the node then
// acts for that caller as a single host would.
//
// A pause goes to the node's export route: on a node with a bundle store
// the sandbox's bundle is written there and its digest kept in the
// placement. If that node is then lost, the sandbox's next call moves it:
// another node imports the bundle (checking its digest and that it can
// run it) and the call resumes it there (move).
package control

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Nodes is the part of cluster.Registry a replica needs.
type Nodes interface {
	Nodes() []cluster.Node
}

// Config configures a replica.
type Config struct {
	Store     *store.Store // the cluster's catalog
	Nodes     Nodes
	NodeToken []byte
	// Transport reaches the nodes' APIs (their TLS roots); nil: a
	// transport of its own with default settings.
	Transport http.RoundTripper
	Limits    cluster.Limits
	// Templates, if set, says which nodes have built template name of
	// tenant when a SandboxTemplate declares it (Registry.TemplateNodes):
	// a create of it is placed on those only.
	Templates func(tenant, name string) (nodes []string, declared bool)
	Log       *slog.Logger
}

// Server is a replica's http.Handler.
type Server struct {
	cfg   Config
	mux   *http.ServeMux
	nodes *http.Client
	proxy *httputil.ReverseProxy

	// limiters are the tenants' request buckets in this replica: n
	// replicas let a tenant n times its rate at most.
	limiters api.TenantLimiters
	// reconciling counts OnNodeLive's reconciliations in flight.
	reconciling sync.WaitGroup
}

// maxBody bounds a create's body, as the API does.
const maxBody = api.MaxJSONBody

// New builds a replica.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Nodes == nil {
		return nil, errors.New("control: Store and Nodes are required")
	}
	if len(cfg.NodeToken) < api.MinNodeToken {
		return nil, fmt.Errorf("control: the node token must have at least %d bytes", api.MinNodeToken)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Transport == nil {
		cfg.Transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true}
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), nodes: &http.Client{Transport: cfg.Transport, Timeout: 10 * time.Minute}}
	s.proxy = &httputil.ReverseProxy{
		Rewrite:       func(*httputil.ProxyRequest) {}, // proxied() sets the request up
		Transport:     cfg.Transport,
		FlushInterval: -1, // exec and code output stream as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			cfg.Log.Warn("control: proxy to node", "err", err, "path", r.URL.Path)
			writeError(w, http.StatusBadGateway, "unavailable", "the sandbox's node did not answer")
		},
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	s.mux.HandleFunc("POST /v1/sandboxes", s.authed(s.create))
	s.mux.HandleFunc("GET /v1/sandboxes", s.authed(s.list))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.authed(s.pause))
	s.mux.HandleFunc("POST /v1/sandboxes/{id}/move", s.authed(s.moveLive))
	s.mux.HandleFunc("/v1/sandboxes/{id}", s.authed(s.proxied))
	s.mux.HandleFunc("/v1/sandboxes/{id}/{rest...}", s.authed(s.proxied))
	s.registerE2B()
	s.mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such route on the cluster's control tier (it serves /v1/sandboxes and the routes of each sandbox so far)")
	})
	return s, nil
}

// OnNodeLost marks the placements of a lost node lost (the Registry's
// OnLost).
func (s *Server) OnNodeLost(n cluster.Node, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reason := fmt.Sprintf("its node %s was lost: %s", n.Name, why)
	k, err := s.cfg.Store.MarkNodeLost(ctx, n.Name, reason)
	if err != nil {
		s.cfg.Log.Error("control: marking a lost node's sandboxes", "node", n.Name, "err", err)
		return
	}
	s.cfg.Log.Warn("control: node lost", "node", n.Name, "why", why, "sandboxes_lost", k)
	if k > 0 {
		_, _ = s.cfg.Store.AppendEvent(ctx, store.Event{Action: "node.lost", Detail: map[string]any{"node": n.Name, "why": why, "sandboxes": k}})
	}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get(e2bSandboxHeader); id != "" {
		s.inSandbox(w, r, id)
		return
	}
	s.mux.ServeHTTP(w, r)
}

type keyCtx struct{}

// authed requires a tenant's API key (Authorization: Bearer, or
// X-API-KEY) from the cluster's catalog.
func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			tok = r.Header.Get("X-API-KEY")
		}
		k, err := s.cfg.Store.LookupKey(r.Context(), strings.TrimSpace(tok))
		if err != nil {
			if errors.Is(err, store.ErrBadKey) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
				writeError(w, http.StatusUnauthorized, "unauthenticated", "missing or invalid API key")
				return
			}
			s.internal(w, err)
			return
		}
		if perMin := sandbox.KeyCaller(k, sandbox.Limits{}, "api").Limits.RatePerMin; !s.limiters.Get(k.Tenant, perMin).Allow() {
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusTooManyRequests, "resource_exhausted", fmt.Sprintf("rate limit: at most %d requests per minute for this tenant", perMin))
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), keyCtx{}, k)))
	}
}

func keyOf(r *http.Request) store.APIKey {
	k, _ := r.Context().Value(keyCtx{}).(store.APIKey)
	return k
}

// create places a new sandbox.
func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Image        string `json:"image"`
		CPUs         int    `json:"cpus"`
		MemoryMiB    int    `json:"memory_mb"`
		FromSnapshot string `json:"from_snapshot"`
	}
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_argument", "the body is not a JSON object: "+err.Error())
			return
		}
	}
	if req.FromSnapshot != "" {
		writeError(w, http.StatusNotImplemented, "unsupported", "from_snapshot: snapshots stay on the node that took them; the cluster tier cannot place them yet")
		return
	}
	if req.CPUs < 0 || req.MemoryMiB < 0 {
		writeError(w, http.StatusBadRequest, "invalid_argument", "cpus and memory_mb must not be negative")
		return
	}
	cpus, mem := max(req.CPUs, 1), req.MemoryMiB
	if mem == 0 {
		mem = 512
	}
	s.createOn(w, r, k, cluster.Request{CPUs: cpus, MemoryMiB: int64(mem), Image: cmp.Or(req.Image, "base")}, "/v1/sandboxes", body, "id")
}

// createOn reserves a sandbox of req against k's tenant's quotas, places
// it, and asks the node to create it with body at path; the node's 201
// answer names the sandbox in its JSON field idField, and is relayed.
// Whatever fails leaves no placement.
func (s *Server) createOn(w http.ResponseWriter, r *http.Request, k store.APIKey, req cluster.Request, path string, body []byte, idField string) {
	cpus, mem := req.CPUs, int(req.MemoryMiB)
	if s.cfg.Templates != nil {
		if nodes, ok := s.cfg.Templates(k.Tenant, req.Image); ok {
			req.OnlyNodes = nodes
			req.OnlyWhy = "template " + req.Image + " built (kubectl get sandboxtemplate " + req.Image + " -n airlock -o yaml)"
		}
	}
	node, err := s.place(r.Context(), req)
	switch {
	case err == nil:
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		writeError(w, http.StatusPreconditionFailed, "failed_precondition", err.Error())
		return
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, errdefs.ErrResourceExhausted):
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	default: // the catalog: its words are not the tenant's business
		s.internal(w, err)
		return
	}
	lim := sandbox.KeyCaller(k, sandbox.Limits{}, "api").Limits
	reserve := func() (store.Placement, error) {
		return s.cfg.Store.ReservePlacement(r.Context(), store.Placement{Tenant: k.Tenant, Node: node.Name, CPUs: cpus, MemoryMiB: mem,
			Runtime: nodeRuntime(node), Arch: node.Arch},
			store.PlacementQuota{MaxSandboxes: lim.MaxSandboxes, MaxVCPUs: lim.MaxVCPUs, MaxMemoryMiB: lim.MaxMemoryMiB})
	}
	p, err := reserve()
	var qe *store.QuotaExceeded
	if errors.As(err, &qe) {
		// Over a quota: first drop what ended on its node without the
		// catalog knowing (a lifetime that ran out), then try once more.
		// Only here, so a create under its quotas asks no other node.
		s.sync(r.Context(), k)
		p, err = reserve()
	}
	if errors.As(err, &qe) {
		writeError(w, http.StatusTooManyRequests, "resource_exhausted", qe.Error())
		return
	}
	if err != nil {
		s.internal(w, err)
		return
	}
	res, err := s.callNode(r.Context(), node, k, http.MethodPost, path, body)
	if err != nil {
		_ = s.cfg.Store.DeletePlacement(context.WithoutCancel(r.Context()), p.ID)
		s.cfg.Log.Warn("control: create on node", "node", node.Name, "err", err)
		writeError(w, http.StatusBadGateway, "unavailable", "node "+node.Name+" did not answer the create")
		return
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	var created map[string]any
	_ = json.Unmarshal(out, &created)
	id, _ := created[idField].(string)
	if res.StatusCode != http.StatusCreated || id == "" {
		_ = s.cfg.Store.DeletePlacement(context.WithoutCancel(r.Context()), p.ID)
		relay(w, res, out)
		return
	}
	if err := s.cfg.Store.BindPlacement(context.WithoutCancel(r.Context()), p.ID, id); err != nil {
		s.internal(w, err)
		return
	}
	_, _ = s.cfg.Store.AppendEvent(context.WithoutCancel(r.Context()), store.Event{Tenant: k.Tenant, KeyID: k.ID, SandboxID: id,
		Action: "sandbox.place", Detail: map[string]any{"node": node.Name, "cpus": cpus, "memory_mb": mem}})
	relay(w, res, out)
}

// place picks a node for req. A node's load is the larger of what it
// last published and what the catalog's placements on it hold, so
// creates in quick succession, from any replica, see each other before
// the nodes publish them.
func (s *Server) place(ctx context.Context, req cluster.Request) (cluster.Node, error) {
	load, err := s.cfg.Store.PlacementLoad(ctx)
	if err != nil {
		return cluster.Node{}, err
	}
	nodes := s.cfg.Nodes.Nodes()
	for i, n := range nodes {
		l := load[n.Name]
		nodes[i].Sandboxes = max(n.Sandboxes, l.Sandboxes)
		nodes[i].AllocatedCPUs = max(n.AllocatedCPUs, l.CPUs)
		nodes[i].AllocatedMemoryMiB = max(n.AllocatedMemoryMiB, int64(l.MemoryMiB))
	}
	return cluster.Place(nodes, req, s.cfg.Limits, cluster.DefaultChoices, nil)
}

// list merges the tenant's sandboxes from every node that runs some,
// with those of lost nodes as failed.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	ps, ok := s.placementsOf(w, r, k)
	if !ok {
		return
	}
	live := map[string]bool{}
	for _, n := range s.cfg.Nodes.Nodes() {
		live[n.Name] = n.Live
	}
	byNode := map[string]bool{}
	var lost []map[string]any
	for _, p := range ps {
		switch {
		case p.State == store.PlacementLost:
			lost = append(lost, placementView(p, "failed", p.Reason))
		case !live[p.Node] && p.BundleDigest != "":
			lost = append(lost, placementView(p, "paused", "its node "+p.Node+" is not live; the next call resumes it on another node"))
		default:
			byNode[p.Node] = true
		}
	}
	out := s.listNodes(r, k, byNode, "/v1/sandboxes?"+r.URL.RawQuery, func(body io.Reader) ([]json.RawMessage, error) {
		var page struct {
			Sandboxes []json.RawMessage `json:"sandboxes"`
		}
		err := json.NewDecoder(body).Decode(&page)
		return page.Sandboxes, err
	})
	for _, l := range lost {
		b, _ := json.Marshal(l)
		out = append(out, b)
	}
	writeJSON(w, http.StatusOK, map[string][]json.RawMessage{"sandboxes": out})
}

// placementsOf lists k's tenant's placements (every tenant's for an
// admin key); if it answers false, it has answered r.
func (s *Server) placementsOf(w http.ResponseWriter, r *http.Request, k store.APIKey) ([]store.Placement, bool) {
	tenant := k.Tenant
	if k.Admin {
		tenant = ""
	}
	ps, err := s.cfg.Store.ListPlacements(r.Context(), tenant)
	if err != nil {
		s.internal(w, err)
		return nil, false
	}
	return ps, true
}

// listNodes asks each live node of byNode for path as k, at once, and
// returns what decode reads of their answers; a node that does not answer
// is left out (logged).
func (s *Server) listNodes(r *http.Request, k store.APIKey, byNode map[string]bool, path string, decode func(io.Reader) ([]json.RawMessage, error)) []json.RawMessage {
	out := []json.RawMessage{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range s.cfg.Nodes.Nodes() {
		if !n.Live || !byNode[n.Name] {
			continue
		}
		wg.Go(func() {
			res, err := s.callNode(r.Context(), n, k, http.MethodGet, path, nil)
			if err != nil {
				s.cfg.Log.Warn("control: list on node", "node", n.Name, "err", err)
				return
			}
			defer res.Body.Close()
			if res.StatusCode != http.StatusOK {
				return
			}
			if page, err := decode(io.LimitReader(res.Body, 64<<20)); err == nil {
				mu.Lock()
				out = append(out, page...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// placement returns the placement of the sandbox r names, for k, on a
// live node: one whose node was lost is moved first if it has a bundle.
// If it answers false, it has answered r.
func (s *Server) placement(w http.ResponseWriter, r *http.Request, k store.APIKey) (store.Placement, cluster.Node, bool) {
	id := r.PathValue("id")
	p, err := s.cfg.Store.PlacementOf(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || (err == nil && !k.Admin && p.Tenant != k.Tenant) {
		writeError(w, http.StatusNotFound, "not_found", "sandbox not found")
		return p, cluster.Node{}, false
	}
	if err != nil {
		s.internal(w, err)
		return p, cluster.Node{}, false
	}
	if p.State == store.PlacementLost {
		if r.Method == http.MethodDelete && r.PathValue("rest") == "" {
			_ = s.cfg.Store.DeletePlacement(r.Context(), p.ID)
			w.WriteHeader(http.StatusNoContent)
			return p, cluster.Node{}, false
		}
		writeError(w, http.StatusConflict, "failed_precondition", "sandbox "+id+" is failed: "+p.Reason)
		return p, cluster.Node{}, false
	}
	node, ok := s.node(p.Node)
	if !ok && p.BundleDigest != "" {
		if r.Method == http.MethodDelete && r.PathValue("rest") == "" {
			// Nothing to resume for a delete: the placement goes, and
			// its bundle, through a live node (every node mounts the
			// bundle store; none has the sandbox).
			_ = s.cfg.Store.DeletePlacement(r.Context(), p.ID)
			s.auditUnplace(r, k, p)
			s.dropBundle(context.WithoutCancel(r.Context()), p)
			w.WriteHeader(http.StatusNoContent)
			return p, cluster.Node{}, false
		}
		if p, err = s.move(r.Context(), k, p); err != nil {
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				writeError(w, http.StatusConflict, "failed_precondition", "sandbox "+id+" is failed: "+strings.TrimPrefix(err.Error(), errdefs.ErrFailedPrecondition.Error()+": "))
			} else {
				writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
			}
			return p, cluster.Node{}, false
		}
		node, ok = s.node(p.Node)
	}
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the sandbox's node "+p.Node+" is not live now")
		return p, node, false
	}
	return p, node, true
}

// nodeRuntime is the runtime node's creates get: a node publishes the one
// its sandboxes run on ("" if it publishes none or several).
func nodeRuntime(n cluster.Node) string {
	if len(n.Runtimes) == 1 {
		return n.Runtimes[0]
	}
	return ""
}

// move has another node resume the paused sandbox of p, whose node was
// lost, from its bundle: it places it as a create would (its CPUs and
// memory) on a node of its runtime and architecture (a bundle imports
// only there), records the move (only one replica wins it), and has the
// new node import the bundle. If no node can, the placement is marked lost
// with the reason (an ErrFailedPrecondition). Audited as sandbox.move.
func (s *Server) move(ctx context.Context, k store.APIKey, p store.Placement) (store.Placement, error) {
	t0 := time.Now()
	from := p.Node
	to, err := s.place(ctx, cluster.Request{CPUs: p.CPUs, MemoryMiB: int64(p.MemoryMiB), Runtime: p.Runtime, Arch: p.Arch})
	if err != nil {
		return p, fmt.Errorf("its node %s was lost, and no node can take it now: %v", from, err)
	}
	won, err := s.cfg.Store.MovePlacement(ctx, p.ID, from, to.Name, p.BundleDigest)
	if err != nil {
		return p, err
	}
	if !won {
		// Another replica moved it first.
		return s.cfg.Store.PlacementOf(ctx, p.SandboxID)
	}
	ref, _ := json.Marshal(bundle.Ref{Sandbox: p.SandboxID, Digest: p.BundleDigest, Bytes: p.BundleBytes})
	owner := k
	owner.Tenant = p.Tenant // an admin's call imports for the sandbox's tenant
	res, err := s.callNode(ctx, to, owner, http.MethodPost, "/v1/node/import", ref)
	var why string
	if err != nil {
		why = "it did not answer: " + err.Error()
	} else {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			why = errorMessage(b, res.Status)
		}
	}
	if why != "" {
		reason := fmt.Sprintf("its node %s was lost, and node %s could not resume it: %s", from, to.Name, why)
		s.cfg.Log.Warn("control: move", "sandbox_id", p.SandboxID, "from", from, "to", to.Name, "why", why)
		if err := s.cfg.Store.LosePlacement(ctx, p.ID, reason); err != nil {
			return p, err
		}
		return p, fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, reason)
	}
	_, _ = s.cfg.Store.AppendEvent(ctx, store.Event{Tenant: p.Tenant, KeyID: k.ID, SandboxID: p.SandboxID, Action: "sandbox.move",
		Detail: map[string]any{"from": from, "to": to.Name, "digest": p.BundleDigest, "bytes": p.BundleBytes, "duration_ms": time.Since(t0).Milliseconds()}})
	s.cfg.Log.Info("control: moved a sandbox", "sandbox_id", p.SandboxID, "from", from, "to", to.Name, "took", time.Since(t0))
	p.Node, p.State, p.Reason = to.Name, store.PlacementPlaced, ""
	return p, nil
}

// errorMessage is the message of an API error body, or status.
func errorMessage(body []byte, status string) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return status
}

// proxied sends a call about one sandbox to its node. A call that may
// resume a paused sandbox first drops its bundle from the catalog.
func (s *Server) proxied(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	p, node, ok := s.placement(w, r, k)
	if !ok {
		return
	}
	whole := r.PathValue("rest") == ""
	if p.BundleDigest != "" && !(whole && (r.Method == http.MethodGet || r.Method == http.MethodDelete)) {
		if err := s.cfg.Store.DropPlacementBundle(r.Context(), p.ID); err != nil {
			s.internal(w, err)
			return
		}
	}
	out, err := s.toNode(r, node, k)
	if err != nil {
		s.internal(w, err)
		return
	}
	if r.Method == http.MethodDelete && whole {
		rec := &statusRecorder{ResponseWriter: w}
		s.proxy.ServeHTTP(rec, out)
		if rec.status/100 == 2 || rec.status == http.StatusNotFound {
			_ = s.cfg.Store.DeletePlacement(context.WithoutCancel(r.Context()), p.ID)
			s.auditUnplace(r, k, p)
		}
		return
	}
	s.proxy.ServeHTTP(w, out)
}

// dropBundle has a live node delete p's bundle from the bundle store.
// If none can, the bundle stays (logged): an admin removes it by hand.
func (s *Server) dropBundle(ctx context.Context, p store.Placement) {
	ref, _ := json.Marshal(bundle.Ref{Sandbox: p.SandboxID, Digest: p.BundleDigest, Bytes: p.BundleBytes})
	for _, n := range s.cfg.Nodes.Nodes() {
		if !n.Live {
			continue
		}
		res, err := s.callNode(ctx, n, controlCaller, http.MethodPost, "/v1/node/bundles/drop", ref)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusNoContent {
				return
			}
			err = errors.New(res.Status)
		}
		s.cfg.Log.Warn("control: dropping a deleted sandbox's bundle", "sandbox_id", p.SandboxID, "node", n.Name, "err", err)
	}
	s.cfg.Log.Warn("control: a deleted sandbox's bundle stays in the bundle store: no live node removed it", "sandbox_id", p.SandboxID, "digest", p.BundleDigest)
}

func (s *Server) auditUnplace(r *http.Request, k store.APIKey, p store.Placement) {
	_, _ = s.cfg.Store.AppendEvent(context.WithoutCancel(r.Context()), store.Event{Tenant: p.Tenant, KeyID: k.ID, SandboxID: p.SandboxID,
		Action: "sandbox.unplace", Detail: map[string]any{"node": p.Node}})
}

// toNode is r addressed to node, with the node's credentials.
func (s *Server) toNode(r *http.Request, node cluster.Node, k store.APIKey) (*http.Request, error) {
	target, err := url.Parse(node.Address)
	if err != nil {
		return nil, err
	}
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.Host = target.Scheme, target.Host, target.Host
	out.RequestURI = ""
	s.nodeHeaders(out.Header, k)
	return out, nil
}

// pause pauses a sandbox through its node's export route (export).
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	p, node, ok := s.placement(w, r, k)
	if !ok {
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	if res, out, ok := s.export(w, r, k, p, node, body); ok {
		relay(w, res, out)
	}
}

// export asks node to pause p's sandbox through its export route: the
// node pauses it and, if it can move and the node has a bundle store,
// writes its bundle, which the placement then records. It returns the
// node's answer, read; if it answers false, it has answered r.
func (s *Server) export(w http.ResponseWriter, r *http.Request, k store.APIKey, p store.Placement, node cluster.Node, body []byte) (*http.Response, []byte, bool) {
	res, err := s.callNode(r.Context(), node, k, http.MethodPost, "/v1/node/sandboxes/"+p.SandboxID+"/export", body)
	if err != nil {
		s.cfg.Log.Warn("control: pause on node", "node", node.Name, "err", err)
		writeError(w, http.StatusBadGateway, "unavailable", "node "+node.Name+" did not answer the pause")
		return nil, nil, false
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	var ex struct {
		Bundle *bundle.Ref `json:"bundle"`
	}
	if res.StatusCode == http.StatusOK && json.Unmarshal(out, &ex) == nil && ex.Bundle != nil && ex.Bundle.Sandbox == p.SandboxID {
		if err := s.cfg.Store.SetPlacementBundle(context.WithoutCancel(r.Context()), p.ID, ex.Bundle.Digest, ex.Bundle.Bytes); err != nil {
			s.internal(w, err)
			return nil, nil, false
		}
	}
	return res, out, true
}

// nodeHeaders replaces whatever the client sent to authenticate with the
// node token and the caller this replica authenticated.
func (s *Server) nodeHeaders(h http.Header, k store.APIKey) {
	for _, name := range []string{"Authorization", "X-API-KEY", "Cookie", api.NodeCallerHeader, "X-Forwarded-For"} {
		h.Del(name)
	}
	h.Set("Authorization", "Bearer "+string(s.cfg.NodeToken))
	h.Set(api.NodeCallerHeader, api.NodeCaller(k))
}

func (s *Server) node(name string) (cluster.Node, bool) {
	for _, n := range s.cfg.Nodes.Nodes() {
		if n.Name == name {
			return n, n.Live
		}
	}
	return cluster.Node{}, false
}

// callNode makes one call to node n for key k.
func (s *Server) callNode(ctx context.Context, n cluster.Node, k store.APIKey, method, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, n.Address+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	s.nodeHeaders(req.Header, k)
	return s.nodes.Do(req)
}

// sync drops the placements of k's tenant whose sandboxes their live node
// no longer has (removed on the node, or past their lifetime), so they
// stop counting against its quotas. It asks each node that holds some.
func (s *Server) sync(ctx context.Context, k store.APIKey) {
	ps, err := s.cfg.Store.ListPlacements(ctx, k.Tenant)
	if err != nil {
		return
	}
	for _, n := range s.cfg.Nodes.Nodes() {
		var mine []store.Placement
		for _, p := range ps {
			if p.Node == n.Name && p.State == store.PlacementPlaced {
				mine = append(mine, p)
			}
		}
		if !n.Live || len(mine) == 0 {
			continue
		}
		res, err := s.callNode(ctx, n, k, http.MethodGet, "/v1/sandboxes", nil)
		if err != nil {
			continue
		}
		var page struct {
			Sandboxes []struct {
				ID string `json:"id"`
			} `json:"sandboxes"`
		}
		ok := res.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(res.Body, 64<<20)).Decode(&page) == nil
		res.Body.Close()
		if !ok {
			continue
		}
		there := map[string]bool{}
		for _, sb := range page.Sandboxes {
			there[sb.ID] = true
		}
		for _, p := range mine {
			if !there[p.SandboxID] {
				_ = s.cfg.Store.DeletePlacement(ctx, p.ID)
			}
		}
	}
}

func (s *Server) internal(w http.ResponseWriter, err error) {
	s.cfg.Log.Error("control", "err", err)
	writeError(w, http.StatusInternalServerError, "internal", "internal error")
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// placementView is how the list shows a sandbox no live node answers
// for: from its placement, in state, saying why.
func placementView(p store.Placement, state, reason string) map[string]any {
	return map[string]any{"id": p.SandboxID, "tenant": p.Tenant, "state": state, "reason": reason,
		"cpus": p.CPUs, "memory_mb": p.MemoryMiB, "created_at": p.Created.UTC()}
}

// readBody reads r's body, at most maxBody bytes; if it cannot, it has
// answered r.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", "request body is larger than 1 MiB")
		return nil, false
	}
	return body, true
}

// relay writes a node's answer as this replica's.
func relay(w http.ResponseWriter, res *http.Response, body []byte) {
	if ct := res.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if _, ok := w.(e2bWriter); ok {
		writeJSON(w, status, map[string]any{"code": status, "message": msg})
		return
	}
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
