package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// The vault: a tenant's host-side secrets, which sandboxes reference by
// name (netconf.Secret.Vault) instead of carrying a value in their
// request. Values are sealed with the host key (sealed.go) bound to the
// tenant and the name, so a row copied to another tenant or name does not
// open; the catalog never holds one in clear, and events and errors name
// secrets, never values.

// Vault limits.
const (
	// MaxVaultSecrets is how many secrets one tenant's vault holds.
	MaxVaultSecrets = 256
	// MaxVaultValue is the largest value, in bytes (a sandbox's secret's).
	MaxVaultValue = netconf.MaxSecretLen
	// maxVaultHosts is how many hosts one vault secret names.
	maxVaultHosts = 32
)

// VaultSecret is a vault secret as callers see it: never its value.
type VaultSecret struct {
	Name string
	// Hosts are the only hosts a sandbox may send the value to (empty:
	// the sandbox names them).
	Hosts   []string
	Created time.Time
	Updated time.Time
}

// vaultAAD binds a sealed vault value to its tenant and name.
func vaultAAD(tenant, name string) []byte {
	return []byte("vault\x00" + tenant + "\x00" + name)
}

// SetVaultSecret stores value as c's tenant's vault secret name, replacing
// one of that name, for the hosts given (normalised as a sandbox secret's;
// none: each sandbox names them). Audited as secret.set with the name and
// hosts. Errors: ErrInvalid (a bad name, host or value), ErrResourceExhausted
// (the vault is full). No error holds the value.
func (m *Manager) SetVaultSecret(ctx context.Context, c Caller, name string, hosts []string, value string) (VaultSecret, error) {
	if !netconf.ValidEnvName(name) {
		return VaultSecret{}, fmt.Errorf("%w: secret name %q must be letters, digits and _, not starting with a digit (at most 128)", errdefs.ErrInvalid, name)
	}
	if len(value) > MaxVaultValue {
		return VaultSecret{}, fmt.Errorf("%w: secret %s: the value is %d bytes, at most %d", errdefs.ErrInvalid, name, len(value), MaxVaultValue)
	}
	if len(hosts) > maxVaultHosts {
		return VaultSecret{}, fmt.Errorf("%w: secret %s: %d hosts, at most %d", errdefs.ErrInvalid, name, len(hosts), maxVaultHosts)
	}
	// The value and hosts are checked as a sandbox's secret would be.
	probe := []string{"example.com"}
	if len(hosts) > 0 {
		probe = hosts
	}
	n, err := netconf.Spec{Secrets: []netconf.Secret{{Name: name, Hosts: probe}}}.Normalize(netconf.Values{name: value})
	if err != nil {
		return VaultSecret{}, err
	}
	if len(hosts) > 0 {
		hosts = n.Secrets[0].Hosts
	} else {
		hosts = nil
	}
	sealed, err := m.seal([]byte(value), vaultAAD(c.Tenant, name))
	if err != nil {
		return VaultSecret{}, fmt.Errorf("seal secret %s: %w", name, err)
	}
	now := time.Now()
	created, err := m.Store.PutVaultSecret(ctx, store.VaultSecret{Tenant: c.Tenant, Name: name, Hosts: hosts, Sealed: sealed, Updated: now}, MaxVaultSecrets)
	if err != nil {
		return VaultSecret{}, err
	}
	d := map[string]any{"name": name, "created": created}
	if len(hosts) > 0 {
		d["hosts"] = hosts
	}
	m.audit(ctx, c, "", "secret.set", d)
	v, err := m.Store.GetVaultSecret(ctx, c.Tenant, name)
	if err != nil {
		return VaultSecret{}, err
	}
	return vaultView(v), nil
}

// VaultSecrets lists c's tenant's vault secrets by name, never values.
func (m *Manager) VaultSecrets(ctx context.Context, c Caller) ([]VaultSecret, error) {
	list, err := m.Store.ListVaultSecrets(ctx, c.Tenant)
	if err != nil {
		return nil, err
	}
	out := make([]VaultSecret, 0, len(list))
	for _, v := range list {
		out = append(out, vaultView(v))
	}
	return out, nil
}

// DeleteVaultSecret removes c's tenant's vault secret name (ErrNotFound if
// there is none). Sandboxes that were given its value keep it until they
// are removed or the secret is removed from them. Audited as secret.rm.
func (m *Manager) DeleteVaultSecret(ctx context.Context, c Caller, name string) error {
	if err := m.Store.DeleteVaultSecret(ctx, c.Tenant, name); err != nil {
		return err
	}
	m.audit(ctx, c, "", "secret.rm", map[string]any{"name": name})
	return nil
}

func vaultView(v store.VaultSecret) VaultSecret {
	return VaultSecret{Name: v.Name, Hosts: v.Hosts, Created: v.Created, Updated: v.Updated}
}

// resolveVault gives each of secs that names a vault secret of tenant its
// value in vals (made if nil) and, where it names no host, the vault
// secret's hosts. A secret may not both name a vault secret and have a
// value given; hosts it names must be among a vault secret's own, where
// that has any. It returns vals.
func (m *Manager) resolveVault(ctx context.Context, tenant string, secs []netconf.Secret, vals netconf.Values) (netconf.Values, error) {
	if slices.ContainsFunc(secs, func(s netconf.Secret) bool { return s.Vault != "" }) {
		vals = maps.Clone(vals) // the caller's map stays as it was
	}
	for i, sec := range secs {
		if sec.Vault == "" {
			continue
		}
		if _, given := vals[sec.Name]; given {
			return nil, fmt.Errorf("%w: secret %s has both a value and a vault secret (%s)", errdefs.ErrInvalid, sec.Name, sec.Vault)
		}
		v, err := m.Store.GetVaultSecret(ctx, tenant, sec.Vault)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("%w: secret %s: no secret %q in the vault (see `airlock secret ls`; add it with `airlock secret set %s`)", errdefs.ErrInvalid, sec.Name, sec.Vault, sec.Vault)
		}
		if err != nil {
			return nil, err
		}
		if len(sec.Hosts) == 0 {
			if len(v.Hosts) == 0 {
				return nil, fmt.Errorf("%w: secret %s: vault secret %s names no hosts: give them (NAME@host)", errdefs.ErrInvalid, sec.Name, sec.Vault)
			}
			secs[i].Hosts = slices.Clone(v.Hosts)
		} else if len(v.Hosts) > 0 {
			for _, h := range sec.Hosts {
				if !vaultAllows(v.Hosts, h) {
					return nil, fmt.Errorf("%w: secret %s: host %q is not one of vault secret %s's hosts (%s)", errdefs.ErrInvalid, sec.Name, h, sec.Vault, strings.Join(v.Hosts, ", "))
				}
			}
		}
		plain, err := m.unseal(v.Sealed, vaultAAD(tenant, sec.Vault))
		if err != nil {
			return nil, fmt.Errorf("vault secret %s does not open: %w", sec.Vault, err)
		}
		if vals == nil {
			vals = netconf.Values{}
		}
		vals[sec.Name] = string(plain)
		clear(plain)
	}
	return vals, nil
}

// vaultAllows reports whether host (a sandbox secret's host pattern) is
// within patterns (a vault secret's): the same pattern, or a name (or a
// narrower wildcard) under a "*.suffix" pattern.
func vaultAllows(patterns []string, host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, p := range patterns {
		if p == host {
			return true
		}
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			name := strings.TrimPrefix(host, "*.")
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		}
	}
	return false
}
