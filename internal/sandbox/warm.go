package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// Warm pools keep sandboxes started ahead of the creates that take them.
// A warm sandbox is an ordinary sandbox (a template clone, with its own
// randomness and identity from its start) owned by WarmTenant, which no
// API key can have, and never used: no exec, file or code call reaches it,
// because no caller but the local admin sees it. A create whose request a
// running sandbox can still take (its image, CPUs, memory and disk equal
// the pool's; no volumes, host directories or published ports; network
// mode not none; the tenant's network limits equal the pool's) claims one
// instead of starting a sandbox: one catalog statement gives the row to
// the creator (store.ClaimSandbox), its secrets' values are sealed, and
// the shim is then told the rest (its default environment and secrets,
// egress policy, tenant, lifetime and idle pause). Anything
// else is created as before. RunWarm refills the pools in the background.

// WarmTenant owns the sandboxes of warm pools until a create claims one.
// Tenant names are [a-z0-9_-] (store), so no API key's tenant is this.
const WarmTenant = "@warm"

// warmPoolKey is the metadata key naming a warm sandbox's pool.
const warmPoolKey = "airlock.dev/warm-pool"

// MaxWarmPool bounds a pool's size on one host.
const MaxWarmPool = 64

// warmOrphanGrace is how long RunWarm keeps warm sandboxes of pools it
// was not told about, after it starts: the pools' owner (serve's flags, a
// cluster's controller) sets them within it, and their sandboxes are kept.
const warmOrphanGrace = time.Minute

// warmRetry is how soon a pool whose fill failed is tried again, and how
// often RunWarm looks at the pools without being asked.
const warmRetry = 10 * time.Second

var warmPoolName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`) })

// WarmPool is what a pool keeps ready: Size started sandboxes of Image
// with CPUs and MemoryMiB (zero: the defaults of a create).
type WarmPool struct {
	Image     string
	CPUs      int
	MemoryMiB int
	Size      int
}

// WarmState is a pool on this host: its sandboxes started and unclaimed,
// the size it aims for, and why its last fill failed.
type WarmState struct {
	Spec  WarmPool // with the defaults filled in; Spec.Size is what it aims for
	Ready int
	Err   string
}

type warmPools struct {
	mu      sync.Mutex
	pools   map[string]*warmPoolState
	deleted map[string]bool // pools deleted since RunWarm started
	kick    chan struct{}
	started time.Time // RunWarm's start; zero before
	// warming holds the warm sandboxes whose Python kernel is starting
	// (warmKernel): not counted ready, and taken only when no other is.
	warming map[string]bool
}

type warmPoolState struct {
	spec  WarmPool
	err   string
	retry time.Time // after a failed fill: not before
}

func (m *Manager) warmState() *warmPools {
	m.warmOnce.Do(func() {
		m.warm = &warmPools{pools: map[string]*warmPoolState{}, deleted: map[string]bool{}, kick: make(chan struct{}, 1), warming: map[string]bool{}}
	})
	return m.warm
}

func (w *warmPools) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// SetWarmPool creates or changes pool name. Its sandboxes of an older
// spec are replaced; a size of 0 keeps none.
func (m *Manager) SetWarmPool(name string, p WarmPool) error {
	if !warmPoolName().MatchString(name) {
		return fmt.Errorf("%w: warm pool name %q: lower-case letters, digits and '-', at most 63", errdefs.ErrInvalid, name)
	}
	if p.Size < 0 || p.Size > MaxWarmPool {
		return fmt.Errorf("%w: warm pool %s: size must be between 0 and %d", errdefs.ErrInvalid, name, MaxWarmPool)
	}
	p.Image = cmp.Or(p.Image, "base")
	p.CPUs = cmp.Or(p.CPUs, 1)
	p.MemoryMiB = cmp.Or(p.MemoryMiB, 512)
	o := CreateOptions{Image: p.Image, CPUs: p.CPUs, MemoryMiB: p.MemoryMiB}
	if err := o.validate(0); err != nil {
		return fmt.Errorf("warm pool %s: %w", name, err)
	}
	w := m.warmState()
	w.mu.Lock()
	if cur, ok := w.pools[name]; !ok || cur.spec != p {
		w.pools[name] = &warmPoolState{spec: p}
	}
	delete(w.deleted, name)
	w.mu.Unlock()
	w.poke()
	return nil
}

// DeleteWarmPool drops pool name; RunWarm removes its sandboxes.
func (m *Manager) DeleteWarmPool(name string) {
	w := m.warmState()
	w.mu.Lock()
	_, ok := w.pools[name]
	delete(w.pools, name)
	w.deleted[name] = true
	w.mu.Unlock()
	if ok {
		w.poke()
	}
}

// WarmPools reports every pool on this host.
func (m *Manager) WarmPools(ctx context.Context) (map[string]WarmState, error) {
	sbs, err := m.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	return m.WarmPoolsIn(sbs), nil
}

// WarmPoolsIn reports every pool on this host, counting its ready
// sandboxes in sbs (the catalog's, listed by the caller).
func (m *Manager) WarmPoolsIn(sbs []store.Sandbox) map[string]WarmState {
	w := m.warmState()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]WarmState, len(w.pools))
	for name, p := range w.pools {
		out[name] = WarmState{Spec: p.spec, Err: p.err}
	}
	for _, sb := range sbs {
		name := sb.Metadata[warmPoolKey]
		if p, ok := w.pools[name]; ok && sb.Tenant == WarmTenant && sb.State == store.StateRunning && p.matches(sb) && !w.warming[sb.ID] {
			st := out[name]
			st.Ready++
			out[name] = st
		}
	}
	return out
}

// matches reports whether warm sandbox sb is of p's current spec.
func (p *warmPoolState) matches(sb store.Sandbox) bool {
	return sb.Image == p.spec.Image && sb.CPUs == p.spec.CPUs && sb.MemoryMiB == p.spec.MemoryMiB
}

// RunWarm keeps the warm pools filled until ctx ends: it starts what a
// pool lacks one sandbox at a time (a host that starts many at once
// starts each slower), and removes the sandboxes of pools that are gone,
// shrank or changed, and warm sandboxes that failed.
func (m *Manager) RunWarm(ctx context.Context) {
	w := m.warmState()
	w.mu.Lock()
	w.started = time.Now()
	w.mu.Unlock()
	tick := time.NewTicker(warmRetry)
	defer tick.Stop()
	for {
		for ctx.Err() == nil && m.warmStep(ctx) {
		}
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-tick.C:
		}
	}
}

// warmStep does one thing the pools need (a removal or a start) and
// reports whether it did anything.
func (m *Manager) warmStep(ctx context.Context) bool {
	sbs, err := m.Store.ListSandboxes(ctx)
	if err != nil {
		m.log().Warn("warm pools: list sandboxes", "err", err)
		return false
	}
	w := m.warmState()
	w.mu.Lock()
	have := map[string]int{}
	var drop []store.Sandbox
	for _, sb := range sbs {
		if sb.Tenant != WarmTenant {
			continue
		}
		name := sb.Metadata[warmPoolKey]
		p, ok := w.pools[name]
		switch {
		case sb.State == store.StateFailed:
			drop = append(drop, sb)
		case !ok:
			if w.deleted[name] || time.Since(w.started) > warmOrphanGrace {
				drop = append(drop, sb)
			}
		case !p.matches(sb):
			drop = append(drop, sb)
		case sb.State == store.StateRunning || sb.State == store.StateCreating:
			if have[name] >= p.spec.Size {
				drop = append(drop, sb)
			} else {
				have[name]++
			}
		}
	}
	var fill string
	for _, name := range slices.Sorted(maps.Keys(w.pools)) {
		p := w.pools[name]
		if have[name] < p.spec.Size && time.Now().After(p.retry) {
			fill = name
			break
		}
	}
	var spec WarmPool
	if fill != "" {
		spec = w.pools[fill].spec
	}
	w.mu.Unlock()

	if len(drop) > 0 {
		sb := drop[0]
		if err := m.remove(ctx, sb.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log().Warn("warm pools: remove", "sandbox_id", sb.ID, "err", err)
			return false
		}
		m.log().Info("warm pools: removed", "sandbox_id", sb.ID, "pool", sb.Metadata[warmPoolKey], "state", sb.State)
		return true
	}
	if fill == "" {
		return false
	}
	t0 := time.Now()
	sb, err := m.startWarm(ctx, fill, spec)
	w.mu.Lock()
	if p, ok := w.pools[fill]; ok && p.spec == spec {
		p.err = ""
		if err != nil {
			p.err = strings.Join(strings.Fields(err.Error()), " ")
			p.retry = time.Now().Add(warmRetry)
		}
	}
	w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			m.log().Warn("warm pools: start", "pool", fill, "err", err)
		}
		return false
	}
	m.log().Info("warm pools: started", "pool", fill, "sandbox_id", sb.ID, "ms", time.Since(t0).Milliseconds())
	return true
}

// startWarm starts one sandbox of pool name.
func (m *Manager) startWarm(ctx context.Context, name string, p WarmPool) (store.Sandbox, error) {
	img, err := m.Store.GetImage(ctx, p.Image)
	if err != nil {
		return store.Sandbox{}, err
	}
	diskMiB := template.DiskMiB(img.Size)
	if err := m.CheckSpace(ctx, fmt.Sprintf("a warm sandbox's disk (%d MiB)", diskMiB), int64(diskMiB)<<20); err != nil {
		return store.Sandbox{}, err
	}
	sb, err := m.create(ctx, CreateOptions{
		Image: p.Image, CPUs: p.CPUs, MemoryMiB: p.MemoryMiB, DiskMiB: diskMiB, Timeout: MaxTimeout,
		Tenant: WarmTenant, Metadata: map[string]string{warmPoolKey: name},
		Network: DefaultLimits.withNetLimits(netconf.Spec{}),
	})
	if err != nil {
		return sb, err
	}
	m.audit(ctx, Caller{Tenant: WarmTenant, Admin: true, Via: "warm-pool"}, sb.ID, "sandbox.create", map[string]any{"pool": name, "image": sb.Image, "cpus": sb.CPUs, "memory_mb": sb.MemoryMiB})
	if sb.Runtime == "gvisor" {
		m.warmKernel(ctx, sb)
	}
	return sb, nil
}

// warmKernelTimeout bounds a warm sandbox's Python kernel start.
const warmKernelTimeout = 2 * time.Minute

// warmKernel starts a warm Python kernel in warm sandbox sb, as a template
// saved running carries one in its clones (gVisor's templates are images):
// the claiming sandbox's first Python code then answers at once instead of
// after the kernel's start (2.4 s here), if its default context has no env.
// A claim meanwhile is served: the default context waits for the warm-up
// and adopts the kernel. An image without python3 and ipykernel has none.
func (m *Manager) warmKernel(ctx context.Context, sb store.Sandbox) {
	w := m.warmState()
	w.mu.Lock()
	w.warming[sb.ID] = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.warming, sb.ID)
		w.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(ctx, warmKernelTimeout)
	defer cancel()
	t0 := time.Now()
	if err := m.shims().Get(m.L.Socket(sb.ID)).WarmContext(ctx); err != nil {
		m.log().Info("warm pools: no warm python kernel", "sandbox_id", sb.ID, "err", err)
		return
	}
	m.log().Info("warm pools: python kernel started", "sandbox_id", sb.ID, "ms", time.Since(t0).Milliseconds())
}

// claimWarm gives c a warm sandbox for o if one fits, with o's settings
// pushed to its shim; false: create one. o is Create's, its quota held.
func (m *Manager) claimWarm(ctx context.Context, c Caller, o CreateOptions) (store.Sandbox, bool) {
	if o.imageDigest != "" || o.buildRoot != "" || len(o.mounts) > 0 || len(o.Network.Ports) > 0 {
		return store.Sandbox{}, false
	}
	img, err := m.Store.GetImage(ctx, cmp.Or(o.Image, "base"))
	if err != nil {
		return store.Sandbox{}, false
	}
	if err := o.validate(img.Size); err != nil || o.Network.Mode == "none" {
		return store.Sandbox{}, false
	}
	rt, err := m.runtimeName(ctx)
	if err != nil {
		return store.Sandbox{}, false
	}
	w := m.warmState()
	w.mu.Lock()
	var names []string
	for name, p := range w.pools {
		if p.spec.Image == o.Image && p.spec.CPUs == o.CPUs && p.spec.MemoryMiB == o.MemoryMiB {
			names = append(names, name)
		}
	}
	w.mu.Unlock()
	if len(names) == 0 {
		return store.Sandbox{}, false
	}
	sbs, err := m.Store.ListSandboxes(ctx)
	if err != nil {
		return store.Sandbox{}, false
	}
	// One whose kernel is still starting comes last: taking it still
	// beats starting one (its first code waits for the rest of the start).
	w.mu.Lock()
	slices.SortStableFunc(sbs, func(a, b store.Sandbox) int {
		return cmp.Compare(b2i(w.warming[a.ID]), b2i(w.warming[b.ID]))
	})
	w.mu.Unlock()
	for _, sb := range sbs {
		if sb.Tenant != WarmTenant || sb.State != store.StateRunning || !slices.Contains(names, sb.Metadata[warmPoolKey]) ||
			sb.Runtime != rt || sb.Image != o.Image || sb.CPUs != o.CPUs || sb.MemoryMiB != o.MemoryMiB || sb.DiskMiB != o.DiskMiB || !sameLimits(sb.Network, o.Network) {
			continue
		}
		pool := sb.Metadata[warmPoolKey]
		next := sb.Network
		next.Mode, next.Allow, next.Secrets = o.Network.Mode, o.Network.Allow, o.Network.Secrets
		claimed, err := m.Store.ClaimSandbox(ctx, sb.ID, WarmTenant, store.Claim{
			Tenant: o.Tenant, Metadata: o.Metadata, Env: o.Env, Network: next, IdlePause: o.IdlePause,
			Timeout: o.Timeout, Source: "warm:" + pool, At: time.Now(),
		})
		if errors.Is(err, errdefs.ErrConflict) {
			continue // another create took it
		}
		w.poke()
		if err != nil {
			m.log().Warn("warm pools: claim", "sandbox_id", sb.ID, "err", err)
			return store.Sandbox{}, false
		}
		err = nil
		if len(o.Secrets) > 0 {
			// Sealed first, so that a resume of the sandbox binds them.
			err = m.sealSecrets(sb.ID, o.Secrets)
		}
		if err == nil {
			err = m.pushClaim(ctx, claimed, sb.Network, o.Secrets)
		}
		if err != nil {
			// Never hand out a sandbox that runs with settings other
			// than the ones asked for.
			m.log().Warn("warm pools: the claimed sandbox did not take its settings; removing it and creating one", "sandbox_id", sb.ID, "err", err)
			_ = m.remove(context.WithoutCancel(ctx), sb.ID)
			return store.Sandbox{}, false
		}
		return claimed, true
	}
	return store.Sandbox{}, false
}

// pushClaim tells claimed sandbox sb's shim what its row now says: the
// default environment and the secrets with their values vals, the egress
// policy (was: the pool's), and, through a refresh, the tenant, lifetime
// and idle pause.
func (m *Manager) pushClaim(ctx context.Context, sb store.Sandbox, was netconf.Spec, vals netconf.Values) error {
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	sc := m.shims().Get(m.L.Socket(sb.ID))
	if len(sb.Env) > 0 || len(sb.Network.Secrets) > 0 {
		if _, err := sc.SetSecrets(ctx, sb.Network.Secrets, vals, sb.Env); err != nil {
			return fmt.Errorf("environment and secrets: %w", err)
		}
	}
	if sb.Network.Mode != was.Mode || !slices.Equal(sb.Network.Allow, was.Allow) {
		if _, err := sc.SetPolicy(ctx, sb.Network.Mode, sb.Network.Allow); err != nil {
			return fmt.Errorf("egress policy: %w", err)
		}
	}
	return sc.Refresh(ctx)
}

// sameLimits reports whether a and b have the same network limits (what
// a running sandbox cannot change).
func sameLimits(a, b netconf.Spec) bool {
	return a.RateBytes == b.RateBytes && a.MaxConns == b.MaxConns && a.ConnRate == b.ConnRate &&
		a.DestsPerMin == b.DestsPerMin && a.UDPRate == b.UDPRate
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
