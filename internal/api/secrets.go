package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Secrets is the secrets part of the manager (sandbox.Manager's methods of
// the same names): the caller's tenant's vault of host-side secrets, and
// the live change of a sandbox's secrets. Values go in, never out. Errors
// are categorized with errdefs.
type Secrets interface {
	// SetVaultSecret stores value as c's tenant's vault secret name, for
	// hosts (none: each sandbox names them).
	SetVaultSecret(ctx context.Context, c sandbox.Caller, name string, hosts []string, value string) (sandbox.VaultSecret, error)
	// VaultSecrets lists c's tenant's vault secrets, never values.
	VaultSecrets(ctx context.Context, c sandbox.Caller) ([]sandbox.VaultSecret, error)
	// DeleteVaultSecret removes one (ErrNotFound if none).
	DeleteVaultSecret(ctx context.Context, c sandbox.Caller, name string) error
	// SetSecret adds or replaces a running or paused sandbox's secret:
	// value, or sec.Vault naming a vault secret.
	SetSecret(ctx context.Context, c sandbox.Caller, id string, sec netconf.Secret, value string) (sandbox.NetworkChange, error)
	// RemoveSecret removes a running or paused sandbox's secret.
	RemoveSecret(ctx context.Context, c sandbox.Caller, id, name string) (sandbox.NetworkChange, error)
}

var (
	errNoSecrets     = &Error{http.StatusServiceUnavailable, "unavailable", "secrets are not available on this server"}
	errNoVaultSecret = &Error{http.StatusNotFound, "not_found", "secret not found"}
	errVaultFull     = &Error{http.StatusTooManyRequests, "resource_exhausted", fmt.Sprintf("the vault holds %d secrets, the most a tenant may: remove one first", sandbox.MaxVaultSecrets)}
)

// VaultSecret is the API's view of a vault secret: never its value.
type VaultSecret struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func viewVaultSecret(v sandbox.VaultSecret) VaultSecret {
	hosts := v.Hosts
	if hosts == nil {
		hosts = []string{}
	}
	return VaultSecret{Name: v.Name, Hosts: hosts, CreatedAt: v.Created.UTC(), UpdatedAt: v.Updated.UTC()}
}

// putVaultSecret stores the body's value under the path's name.
func (s *Server) putVaultSecret(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		s.fail(w, r, errNoSecrets)
		return
	}
	var req struct {
		Value string   `json:"value"`
		Hosts []string `json:"hosts"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Value == "" {
		s.fail(w, r, invalidf("value is required"))
		return
	}
	v, err := s.cfg.Secrets.SetVaultSecret(r.Context(), callerOf(r), r.PathValue("name"), req.Hosts, req.Value)
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		err = face(err, errVaultFull)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewVaultSecret(v))
}

func (s *Server) listVaultSecrets(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		s.fail(w, r, errNoSecrets)
		return
	}
	list, err := s.cfg.Secrets.VaultSecrets(r.Context(), callerOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []VaultSecret{}
	for _, v := range list {
		out = append(out, viewVaultSecret(v))
	}
	writeJSON(w, http.StatusOK, map[string][]VaultSecret{"secrets": out})
}

func (s *Server) deleteVaultSecret(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		s.fail(w, r, errNoSecrets)
		return
	}
	err := s.cfg.Secrets.DeleteVaultSecret(r.Context(), callerOf(r), r.PathValue("name"))
	if errors.Is(err, errdefs.ErrNotFound) {
		err = face(err, errNoVaultSecret)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SandboxSecret is the body of PUT /v1/sandboxes/{id}/secrets/{name}: the
// secret's hosts and either its value or the name of a vault secret.
type SandboxSecret struct {
	Hosts  []string `json:"hosts"`
	Header string   `json:"header"`
	Value  string   `json:"value"`
	Vault  string   `json:"vault"`
}

// putSandboxSecret adds or replaces a running or paused sandbox's secret.
func (s *Server) putSandboxSecret(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		s.fail(w, r, errNoSecrets)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var req SandboxSecret
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if (req.Value == "") == (req.Vault == "") {
		s.fail(w, r, invalidf("give the secret's value or the name of a vault secret (vault), not both"))
		return
	}
	sec := netconf.Secret{Name: r.PathValue("name"), Hosts: req.Hosts, Header: req.Header, Vault: req.Vault}
	ch, err := s.cfg.Secrets.SetSecret(r.Context(), callerOf(r), sb.ID, sec, req.Value)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NetworkState{Network: ch.Network, Closed: ch.Closed, Applied: ch.Applied})
}

// deleteSandboxSecret removes a running or paused sandbox's secret.
func (s *Server) deleteSandboxSecret(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Secrets == nil {
		s.fail(w, r, errNoSecrets)
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ch, err := s.cfg.Secrets.RemoveSecret(r.Context(), callerOf(r), sb.ID, r.PathValue("name"))
	if errors.Is(err, errdefs.ErrNotFound) {
		err = face(err, errNoVaultSecret)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, NetworkState{Network: ch.Network, Closed: ch.Closed, Applied: ch.Applied})
}
