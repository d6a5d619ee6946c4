package control

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// E2B's API on the control tier. The nodes serve E2B's routes as a
// single host does (internal/e2b); a replica places E2B's creates, merges
// its lists, and proxies everything about one sandbox to its node: the
// control-plane routes with the node token and the caller it
// authenticated, and the in-sandbox traffic (envd's commands and files,
// the code interpreter), which E2B's SDKs send to the API's origin with
// the E2b-Sandbox-Id header, untouched: the node checks the sandbox's
// access token itself, as a single host does. What stays on one node
// (snapshots, forks, creates from a snapshot, E2B's signed file URLs) is
// refused with a message that says so.

// e2bSandboxHeader names the sandbox of E2B's in-sandbox traffic.
const e2bSandboxHeader = "E2b-Sandbox-Id"

// e2bWriter marks the answer to one of E2B's routes: the errors this
// replica writes itself take E2B's shape ({"code", "message"}), which the
// SDKs read.
type e2bWriter struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController (the proxy's flushes) reach the
// connection's writer.
func (w e2bWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// e2b serves h as one of E2B's routes.
func e2b(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { h(e2bWriter{w}, r) }
}

func (s *Server) registerE2B() {
	for _, p := range []string{"POST /sandboxes", "POST /v2/sandboxes"} {
		s.mux.HandleFunc(p, e2b(s.authed(s.createE2B)))
	}
	for _, p := range []string{"GET /sandboxes", "GET /v2/sandboxes"} {
		s.mux.HandleFunc(p, e2b(s.authed(s.listE2B)))
	}
	s.mux.HandleFunc("POST /sandboxes/{id}/pause", e2b(s.authed(s.pauseE2B)))
	for _, p := range []string{"/sandboxes/{id}", "/sandboxes/{id}/{rest...}", "/v2/sandboxes/{id}/{rest...}"} {
		s.mux.HandleFunc(p, e2b(s.authed(s.proxied)))
	}
	notHere := func(what string) http.HandlerFunc {
		return e2b(func(w http.ResponseWriter, _ *http.Request) {
			writeError(w, http.StatusNotImplemented, "unsupported", what+" are not served by the cluster's control tier yet: they stay on the node that made them")
		})
	}
	for p, what := range map[string]string{
		"POST /sandboxes/{id}/fork": "forks", "POST /sandboxes/{id}/snapshots": "snapshots", "GET /snapshots": "snapshots",
		"DELETE /templates/{id}": "snapshots", "/files": "E2B's signed file URLs (uploadUrl, downloadUrl)",
	} {
		s.mux.HandleFunc(p, notHere(what))
	}
}

// createE2B places E2B's create (v1 or v2) and has the node make it.
// E2B's requests carry no size: the sandbox is placed and reserved as
// the default 1 vCPU and 512 MiB, and the node gives it its template's.
func (s *Server) createE2B(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		TemplateID string `json:"templateID"`
	}
	if len(bytes.TrimSpace(body)) > 0 && json.Unmarshal(body, &req) != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", "the body is not a JSON object")
		return
	}
	s.createOn(w, r, keyOf(r), cluster.Request{CPUs: 1, MemoryMiB: 512, Image: cmp.Or(req.TemplateID, "base")}, r.URL.Path, body, "sandboxID")
}

// listE2B merges the tenant's sandboxes from the nodes that run some, in
// E2B's shape (one array; the nodes' pages are not continued).
func (s *Server) listE2B(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	ps, ok := s.placementsOf(w, r, k)
	if !ok {
		return
	}
	byNode := map[string]bool{}
	for _, p := range ps {
		if p.State == store.PlacementPlaced {
			byNode[p.Node] = true
		}
	}
	out := s.listNodes(r, k, byNode, r.URL.RequestURI(), func(body io.Reader) ([]json.RawMessage, error) {
		var page []json.RawMessage
		err := json.NewDecoder(body).Decode(&page)
		return page, err
	})
	writeJSON(w, http.StatusOK, out)
}

// pauseE2B is E2B's pause through the node's export route, so that a
// sandbox paused from E2B's SDK resumes on another node too; E2B's answer
// is 204.
func (s *Server) pauseE2B(w http.ResponseWriter, r *http.Request) {
	k := keyOf(r)
	p, node, ok := s.placement(w, r, k)
	if !ok {
		return
	}
	res, out, ok := s.export(w, r, k, p, node, nil)
	switch {
	case !ok:
	case res.StatusCode == http.StatusOK:
		w.WriteHeader(http.StatusNoContent)
	case res.StatusCode == http.StatusConflict || res.StatusCode == http.StatusPreconditionFailed:
		// E2B answers 409 for a sandbox that is already paused.
		writeError(w, http.StatusConflict, "failed_precondition", errorMessage(out, res.Status))
	default:
		writeError(w, res.StatusCode, "unavailable", errorMessage(out, res.Status))
	}
}

// inSandbox proxies E2B's in-sandbox traffic for sandbox id to its node,
// as it came: its authorization is the sandbox's access token, which the
// node checks.
func (s *Server) inSandbox(w http.ResponseWriter, r *http.Request, id string) {
	w = e2bWriter{w}
	p, err := s.cfg.Store.PlacementOf(r.Context(), id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", "sandbox "+id+" not found")
		return
	case err != nil:
		s.internal(w, err)
		return
	case p.State == store.PlacementLost:
		writeError(w, http.StatusConflict, "failed_precondition", "sandbox "+id+" is failed: "+p.Reason)
		return
	}
	node, ok := s.node(p.Node)
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "unavailable", "the sandbox's node "+p.Node+" is not live now (a paused sandbox resumes on another node on its next connect)")
		return
	}
	out, err := s.toNode(r, node, store.APIKey{})
	if err != nil {
		s.internal(w, err)
		return
	}
	// The client's own credentials (the access token, envd's user) go
	// through; none of the node's.
	out.Header = r.Header.Clone()
	out.Header.Del(api.NodeCallerHeader)
	s.proxy.ServeHTTP(w, out)
}
