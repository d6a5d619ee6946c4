package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Limits are a tenant's quotas. Zero fields take defaults (Or).
type Limits struct {
	MaxSandboxes int
	MaxVCPUs     int
	MaxMemoryMiB int
	MaxDiskMiB   int // sandboxes' disk sizes, snapshots' bytes and volumes' sizes, in MiB
	MaxSnapshots int // named snapshots
	MaxVolumes   int // named volumes
	RatePerMin   int // requests per minute (the HTTP API's rate limiter)
	// Outbound abuse limits of the tenant's sandboxes (netconf.Spec's
	// ConnRate, DestsPerMin, UDPRate), set in each sandbox's network spec
	// at create: 0 means netconf's default, negative no limit.
	NetConnRate    int
	NetDestsPerMin int
	NetUDPRate     int
}

// DefaultLimits apply where neither a key nor the server sets a limit
// (secure by default: no tenant is unlimited).
var DefaultLimits = Limits{MaxSandboxes: 20, MaxVCPUs: 32, MaxMemoryMiB: 32 << 10, MaxDiskMiB: 64 << 10, MaxSnapshots: 100, MaxVolumes: 20, RatePerMin: 1200}

// Or returns l with its zero fields taken from d.
func (l Limits) Or(d Limits) Limits {
	pick := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	return Limits{
		MaxSandboxes: pick(l.MaxSandboxes, d.MaxSandboxes),
		MaxVCPUs:     pick(l.MaxVCPUs, d.MaxVCPUs),
		MaxMemoryMiB: pick(l.MaxMemoryMiB, d.MaxMemoryMiB),
		MaxDiskMiB:   pick(l.MaxDiskMiB, d.MaxDiskMiB),
		MaxSnapshots: pick(l.MaxSnapshots, d.MaxSnapshots),
		MaxVolumes:   pick(l.MaxVolumes, d.MaxVolumes),
		RatePerMin:   pick(l.RatePerMin, d.RatePerMin),
		// Negative (no limit) is a setting too.
		NetConnRate:    cmp.Or(l.NetConnRate, d.NetConnRate),
		NetDestsPerMin: cmp.Or(l.NetDestsPerMin, d.NetDestsPerMin),
		NetUDPRate:     cmp.Or(l.NetUDPRate, d.NetUDPRate),
	}
}

// withNetLimits returns s with l's outbound abuse limits: the tenant's
// (an admin's choice), whatever the creator asked.
func (l Limits) withNetLimits(s netconf.Spec) netconf.Spec {
	s.ConnRate, s.DestsPerMin, s.UDPRate = l.NetConnRate, l.NetDestsPerMin, l.NetUDPRate
	return s
}

// KeyCaller is the caller acting with API key k through surface via: the
// key's tenant, id and admin flag, and its limits with defaults (then
// DefaultLimits) filling the ones it does not set.
func KeyCaller(k store.APIKey, defaults Limits, via string) Caller {
	own := Limits{MaxSandboxes: k.MaxSandboxes, MaxVCPUs: k.MaxVCPUs, MaxMemoryMiB: k.MaxMemoryMiB, MaxDiskMiB: k.MaxDiskMiB, MaxSnapshots: k.MaxSnapshots, MaxVolumes: k.MaxVolumes, RatePerMin: k.RatePerMin,
		NetConnRate: k.NetConnRate, NetDestsPerMin: k.NetDestsPerMin, NetUDPRate: k.NetUDPRate}
	return Caller{Tenant: k.Tenant, KeyID: k.ID, Admin: k.Admin, Limits: own.Or(defaults).Or(DefaultLimits), Via: via}
}

// Caller is who asks the manager to act. Every surface (the local CLI, the
// HTTP API, MCP, the E2B adapter, the dashboard) builds one and passes it
// to the manager, which decides what the caller may see and do: adapters
// translate, the manager decides.
type Caller struct {
	// Tenant owns what the caller creates; "" is the local user (the CLI
	// on the state dir), who is an admin.
	Tenant string
	// KeyID is the API key's id, for the audit trail ("" for local use).
	KeyID string
	// Admin sees and acts on every tenant's sandboxes.
	Admin bool
	// Limits are the tenant's quotas, checked by every create (zero
	// fields: DefaultLimits). The local user (Tenant "") has none.
	Limits Limits
	// Via names the surface for the audit trail: "cli", "api", "mcp", ...
	Via string
	// Peer is the client's IP address where the surface knows it (the
	// preview route), for the audit trail of inbound connections
	// (net.inbound); "" otherwise.
	Peer string
}

// Local is the caller of the CLI working on its own state dir.
func Local() Caller { return Caller{Admin: true, Via: "cli"} }

// Local reports whether c is the local user (the CLI on its own state
// dir, not an API key).
func (c Caller) Local() bool { return c.Tenant == "" && c.KeyID == "" }

// Sees reports whether c may see sb.
func (c Caller) Sees(sb store.Sandbox) bool { return c.Admin || sb.Tenant == c.Tenant }

// Actor is the audit identity of c.
func (c Caller) Actor() Actor { return Actor{Tenant: c.Tenant, KeyID: c.KeyID} }

// lookup returns the reconciled sandbox id if c may see it. Every error
// for a sandbox c cannot use matches ErrNoSandbox. For a caller that is not
// an admin, an absent sandbox, a malformed id and another tenant's
// sandbox give the same error, byte for byte, so ids cannot be probed; an
// admin (who sees everything) gets the precise text.
func (m *Manager) lookup(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	sb, err := m.get(ctx, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
			if c.Admin {
				return store.Sandbox{}, noSandboxError{err}
			}
			return store.Sandbox{}, errNoSandbox
		}
		return store.Sandbox{}, err
	}
	if !c.Sees(sb) {
		return store.Sandbox{}, errNoSandbox
	}
	return sb, nil
}

// ErrNoSandbox matches every error for a sandbox the caller cannot use
// (absent, malformed id, another tenant's): adapters answer it with their
// own not-found, without asking the manager first.
var ErrNoSandbox = errors.New("sandbox not found")

// errNoSandbox is the one answer for a sandbox a caller cannot use.
var errNoSandbox = noSandboxError{fmt.Errorf("%w: %w", errdefs.ErrNotFound, ErrNoSandbox)}

// noSandboxError keeps an error's text and category and also matches
// ErrNoSandbox.
type noSandboxError struct{ err error }

func (e noSandboxError) Error() string        { return e.err.Error() }
func (e noSandboxError) Unwrap() error        { return e.err }
func (e noSandboxError) Is(target error) bool { return target == ErrNoSandbox }

// running returns c's view of sandbox id once it runs (a paused sandbox is
// resumed first: any call to it just works) and the pooled client of its
// shim. On the common path (a running sandbox) it reads the catalog once.
// Errors: errNoSandbox when c may not see id; ErrFailedPrecondition when
// the sandbox is neither running nor resumable (its reason included).
func (m *Manager) running(ctx context.Context, c Caller, id string) (store.Sandbox, *shimclient.Client, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return sb, nil, err
	}
	switch sb.State {
	case store.StatePaused, store.StateResuming, store.StatePausing:
		if sb, err = m.resume(ctx, id); err != nil {
			return sb, nil, err
		}
	}
	if sb.State != store.StateRunning {
		msg := fmt.Sprintf("sandbox %s is %s", id, sb.State)
		if sb.Reason != "" {
			msg += ": " + sb.Reason
		}
		return sb, nil, fmt.Errorf("%w: %s", errdefs.ErrFailedPrecondition, msg)
	}
	return sb, m.shims().Get(m.L.Socket(id)), nil
}

// shims returns the manager's pool of shim connections.
func (m *Manager) shims() *shimclient.Pool {
	m.poolOnce.Do(func() { m.pool = shimclient.NewPool() })
	return m.pool
}

// TenantEgress returns the egress bytes each tenant's ended shim runs
// recorded (api.EgressTotaler). It acts for no caller: the server's
// metrics only.
func (m *Manager) TenantEgress(ctx context.Context) (map[string]uint64, error) {
	return m.Store.TenantEgress(ctx)
}
