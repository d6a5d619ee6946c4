package airlock

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// VaultSecret is a secret of the key's tenant's vault: a value kept on
// the server (sealed at rest), which sandboxes reference by name
// (Secret.Vault). The server never returns its value.
type VaultSecret struct {
	Name string `json:"name"`
	// Hosts are the only hosts a sandbox may send its value to (empty:
	// each sandbox names them).
	Hosts     []string  `json:"hosts"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SetVaultSecret stores value as the vault secret name (replacing one of
// that name), for hosts (none: each sandbox names them). Errors:
// ErrInvalid (a bad name, host or value: at most 16 KiB, no CR, LF or
// NUL), ErrResourceExhausted (the vault is full).
func (c *Client) SetVaultSecret(ctx context.Context, name, value string, hosts ...string) (*VaultSecret, error) {
	in := struct {
		Value string   `json:"value"`
		Hosts []string `json:"hosts,omitempty"`
	}{value, hosts}
	var out VaultSecret
	if err := c.doJSON(ctx, http.MethodPut, vaultPath(name), nil, in, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListVaultSecrets returns the vault's secrets by name, never values.
func (c *Client) ListVaultSecrets(ctx context.Context) ([]VaultSecret, error) {
	var out struct {
		Secrets []VaultSecret `json:"secrets"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/secrets", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// DeleteVaultSecret removes the vault secret name (ErrNotFound if there is
// none). Sandboxes that were given its value keep it.
func (c *Client) DeleteVaultSecret(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, vaultPath(name), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}

// SetSandboxSecret adds secret s to sandbox id, or replaces its secret of
// that name, while it runs or is paused: s.Value with s.Hosts, or s.Vault
// naming a vault secret. A running sandbox injects it into new requests
// to its hosts at once and new commands see the placeholder in $NAME; a
// paused one gets it when it resumes (NetworkState.Applied). Errors:
// ErrInvalid, ErrNotFound, ErrFailedPrecondition (neither running nor
// paused).
func (c *Client) SetSandboxSecret(ctx context.Context, id string, s Secret) (*NetworkState, error) {
	in := struct {
		Hosts  []string `json:"hosts,omitempty"`
		Header string   `json:"header,omitempty"`
		Value  string   `json:"value,omitempty"`
		Vault  string   `json:"vault,omitempty"`
	}{s.Hosts, s.Header, s.Value, s.Vault}
	var out NetworkState
	if err := c.doJSON(ctx, http.MethodPut, sandboxPath(id, "secrets", s.Name), nil, in, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveSandboxSecret removes secret name from sandbox id while it runs or
// is paused: no request is injected with its value from then on (open
// connections that were injected are closed). ErrNotFound for a secret
// it does not have.
func (c *Client) RemoveSandboxSecret(ctx context.Context, id, name string) (*NetworkState, error) {
	var out NetworkState
	if err := c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "secrets", name), nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

func vaultPath(name string) string { return "/v1/secrets/" + url.PathEscape(name) }
