package api

import (
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// NetworkPolicy is the body of PUT /v1/sandboxes/{id}/network: the whole
// new egress policy (rules not listed are removed).
type NetworkPolicy struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow"`
}

// NetworkState is the answer of GET and PUT /v1/sandboxes/{id}/network.
type NetworkState struct {
	// Network is the sandbox's network as the catalog keeps it (secrets
	// by name and placeholder, never values).
	Network netconf.Spec `json:"network"`
	// Closed counts the open connections the change closed (PUT only).
	Closed int `json:"closed,omitempty"`
	// Applied is "running" when the sandbox enforces the policy now,
	// "resume" when a paused sandbox gets it on resume (PUT only).
	Applied string `json:"applied,omitempty"`
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NetworkState{Network: sb.Network})
}

// setNetwork replaces a running or paused sandbox's egress policy; the
// manager validates it and checks the platform floor for a tenant, as
// create does.
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req NetworkPolicy
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ch, err := s.cfg.Sandboxes.SetNetwork(r.Context(), callerOf(r), sb.ID, sandbox.EgressPolicy{Mode: req.Mode, Allow: req.Allow})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NetworkState{Network: ch.Network, Closed: ch.Closed, Applied: ch.Applied})
}
