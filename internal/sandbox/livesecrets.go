package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// SetSecret adds secret sec to sandbox id, or replaces its secret of that
// name (keeping its placeholder unless sec gives one), while it runs or is
// paused: value is its value, or "" when sec.Vault names a secret of c's
// tenant's vault (resolved as at create). The guest's new execs see the
// placeholder in $NAME; a running sandbox's shim injects it into new
// requests to its hosts at once; the values are sealed again so a pause
// keeps them, and a paused sandbox gets them when it resumes. Audited as
// sandbox.secret.set (name, hosts, vault; never the value). Errors:
// ErrInvalid (a bad name, host or value; a name already used by a plain
// environment variable; mode none), ErrFailedPrecondition (neither running
// nor paused), ErrUnavailable (the shim did not take it: nothing changed).
func (m *Manager) SetSecret(ctx context.Context, c Caller, id string, sec netconf.Secret, value string) (NetworkChange, error) {
	if _, err := m.lookup(ctx, c, id); err != nil {
		return NetworkChange{}, err
	}
	var given netconf.Values
	if value != "" {
		given = netconf.Values{sec.Name: value}
	}
	asked := []netconf.Secret{sec}
	asked[0].Hosts = slices.Clone(sec.Hosts)
	given, err := m.resolveVault(ctx, c.Tenant, asked, given)
	if err != nil {
		return NetworkChange{}, err
	}
	sec = asked[0]
	if _, ok := given[sec.Name]; !ok {
		return NetworkChange{}, fmt.Errorf("%w: secret %s has no value (give one, or name a vault secret)", errdefs.ErrInvalid, sec.Name)
	}
	ch, err := m.changeSecrets(ctx, id, func(cur []netconf.Secret, vals netconf.Values, env map[string]string) ([]netconf.Secret, error) {
		i := slices.IndexFunc(cur, func(s netconf.Secret) bool { return s.Name == sec.Name })
		if i >= 0 {
			if sec.Placeholder == "" {
				sec.Placeholder = cur[i].Placeholder
			}
			cur = slices.Delete(slices.Clone(cur), i, i+1)
		} else if _, used := env[sec.Name]; used {
			return nil, fmt.Errorf("%w: %s is an environment variable of the sandbox, not a secret", errdefs.ErrInvalid, sec.Name)
		}
		vals[sec.Name] = given[sec.Name]
		return append(slices.Clone(cur), sec), nil
	})
	clear(given)
	if err != nil {
		return NetworkChange{}, err
	}
	d := map[string]any{"name": sec.Name, "applied": ch.Applied, "closed": ch.Closed}
	if i := slices.IndexFunc(ch.Network.Secrets, func(s netconf.Secret) bool { return s.Name == sec.Name }); i >= 0 {
		d["hosts"] = ch.Network.Secrets[i].Hosts
	}
	if sec.Vault != "" {
		d["vault"] = sec.Vault
	}
	m.audit(ctx, c, id, "sandbox.secret.set", d)
	return ch, nil
}

// RemoveSecret removes secret name from sandbox id while it runs or is
// paused: no request is injected with its value from then on (a running
// sandbox's connections that were injected are closed), new execs no
// longer see $NAME, and the sealed values no longer hold it. Audited as
// sandbox.secret.rm. Errors as SetSecret, and ErrNotFound for a name the
// sandbox has no secret of.
func (m *Manager) RemoveSecret(ctx context.Context, c Caller, id, name string) (NetworkChange, error) {
	if _, err := m.lookup(ctx, c, id); err != nil {
		return NetworkChange{}, err
	}
	ch, err := m.changeSecrets(ctx, id, func(cur []netconf.Secret, vals netconf.Values, env map[string]string) ([]netconf.Secret, error) {
		i := slices.IndexFunc(cur, func(s netconf.Secret) bool { return s.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("%w: sandbox %s has no secret %q", errdefs.ErrNotFound, id, name)
		}
		if env[name] == cur[i].Placeholder {
			delete(env, name)
		}
		delete(vals, name)
		return slices.Delete(slices.Clone(cur), i, i+1), nil
	})
	if err != nil {
		return NetworkChange{}, err
	}
	m.audit(ctx, c, id, "sandbox.secret.rm", map[string]any{"name": name, "applied": ch.Applied, "closed": ch.Closed})
	return ch, nil
}

// changeSecrets applies edit to sandbox id's secrets, their values and its
// default environment (copies edit may change), one change at a time,
// then stores, seals and (running) pushes the result.
func (m *Manager) changeSecrets(ctx context.Context, id string, edit func(cur []netconf.Secret, vals netconf.Values, env map[string]string) ([]netconf.Secret, error)) (NetworkChange, error) {
	m.netMu.Lock()
	defer m.netMu.Unlock()
	sb, err := m.get(ctx, id)
	if err != nil {
		return NetworkChange{}, err
	}
	if sb.State != store.StateRunning && sb.State != store.StatePaused {
		return NetworkChange{}, fmt.Errorf("%w: sandbox %s is %s: its secrets can be changed while it runs or is paused", errdefs.ErrFailedPrecondition, id, sb.State)
	}
	old := netconf.Values{}
	if len(sb.Network.Secrets) > 0 {
		if old, err = m.openSecrets(id); err != nil {
			return NetworkChange{}, fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
		}
	}
	defer clear(old)
	vals := maps.Clone(old)
	defer clear(vals)
	env := maps.Clone(sb.Env)
	if env == nil {
		env = map[string]string{}
	}
	secs, err := edit(sb.Network.Secrets, vals, env)
	if err != nil {
		return NetworkChange{}, err
	}
	next := sb.Network
	next.Secrets = secs
	norm, err := next.Normalize(vals)
	if err != nil {
		return NetworkChange{}, err
	}
	next.Secrets = norm.Secrets
	for _, s := range next.Secrets {
		env[s.Name] = s.Placeholder
	}
	for k, v := range caEnv {
		switch _, set := env[k]; {
		case len(next.Secrets) > 0 && !set:
			env[k] = v
		case len(next.Secrets) == 0 && set && env[k] == v:
			// The last secret is gone, and with it the guest's
			// interception CA: NODE_EXTRA_CA_CERTS would name a
			// missing file.
			delete(env, k)
		}
	}
	switch sb.State {
	case store.StateRunning:
		return m.setRunningSecrets(ctx, sb, next, vals, env, old)
	default:
		return m.setPausedSecrets(ctx, id, next, vals, env, old)
	}
}

// setRunningSecrets stores next and env, seals vals and has sb's shim
// inject them. If the shim refuses them or cannot be reached while it
// still runs, the row and the sealed values are put back (old).
func (m *Manager) setRunningSecrets(ctx context.Context, sb store.Sandbox, next netconf.Spec, vals netconf.Values, env map[string]string, old netconf.Values) (NetworkChange, error) {
	if err := m.Store.SetNetworkEnv(ctx, sb.ID, next, env); err != nil {
		return NetworkChange{}, err
	}
	restore := func() error {
		bg := context.WithoutCancel(ctx)
		return errors.Join(m.Store.SetNetworkEnv(bg, sb.ID, sb.Network, sb.Env), m.sealSecrets(sb.ID, old))
	}
	if err := m.sealSecrets(sb.ID, vals); err != nil {
		return NetworkChange{}, errors.Join(err, restore())
	}
	pctx, cancel := context.WithTimeout(ctx, pushTimeout)
	closed, err := m.shims().Get(m.L.Socket(sb.ID)).SetSecrets(pctx, next.Secrets, vals, env)
	cancel()
	if err == nil {
		return NetworkChange{Network: next, Closed: closed, Applied: "running"}, nil
	}
	if cur, gerr := m.get(ctx, sb.ID); gerr == nil && cur.State == store.StatePaused {
		return NetworkChange{Network: next, Applied: "resume"}, nil
	}
	if rerr := restore(); rerr != nil {
		return NetworkChange{}, errors.Join(err, fmt.Errorf("restore the stored secrets: %w", rerr))
	}
	if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		return NetworkChange{}, err
	}
	return NetworkChange{}, fmt.Errorf("%w: sandbox %s: its supervisor did not take the new secrets; nothing changed: %w", errdefs.ErrUnavailable, sb.ID, err)
}

// setPausedSecrets stores next and env and seals vals for a paused
// sandbox's resume, holding the shim lock so that no resume starts a shim
// on the old set meanwhile.
func (m *Manager) setPausedSecrets(ctx context.Context, id string, next netconf.Spec, vals netconf.Values, env map[string]string, old netconf.Values) (NetworkChange, error) {
	err := m.whilePaused(ctx, id, func() error {
		if err := m.sealSecrets(id, vals); err != nil {
			return err
		}
		if err := m.Store.SetNetworkEnv(ctx, id, next, env); err != nil {
			return errors.Join(err, m.sealSecrets(id, old))
		}
		return nil
	})
	if err != nil {
		return NetworkChange{}, err
	}
	return NetworkChange{Network: next, Applied: "resume"}, nil
}
