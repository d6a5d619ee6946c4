package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/store"
)

type keyCtx struct{}

// keyOf returns the authenticated key of r (zero for unauthenticated
// routes).
func keyOf(r *http.Request) store.APIKey {
	k, _ := r.Context().Value(keyCtx{}).(store.APIKey)
	return k
}

// authenticate requires a valid Bearer key, then applies its tenant's rate
// limit. Failures are audited as auth.denied, without the key.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		var k store.APIKey
		err := store.ErrBadKey
		if ok {
			k, err = s.cfg.Keys.LookupKey(r.Context(), strings.TrimSpace(tok))
		}
		if err != nil {
			if !errors.Is(err, store.ErrBadKey) {
				s.fail(w, r, err)
				return
			}
			if s.deniedAudit.Allow() {
				reason := "missing key"
				if ok {
					reason = "invalid key"
				}
				s.audit(r, "", "auth.denied", map[string]any{"reason": reason, "method": r.Method, "route": r.Pattern})
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
			s.fail(w, r, errUnauth)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), keyCtx{}, k))
		if lim := s.limitsOf(k); !s.limiter(k.Tenant, lim.RatePerMin).Allow() {
			w.Header().Set("Retry-After", "1")
			s.fail(w, r, &Error{http.StatusTooManyRequests, "resource_exhausted",
				fmt.Sprintf("rate limit: at most %d requests per minute for this tenant", lim.RatePerMin)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// limitsOf returns k's limits with the server's defaults filled in.
func (s *Server) limitsOf(k store.APIKey) Limits {
	d := s.cfg.Defaults
	pick := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	return Limits{
		MaxSandboxes: pick(k.MaxSandboxes, d.MaxSandboxes),
		MaxVCPUs:     pick(k.MaxVCPUs, d.MaxVCPUs),
		MaxMemoryMiB: pick(k.MaxMemoryMiB, d.MaxMemoryMiB),
		RatePerMin:   pick(k.RatePerMin, d.RatePerMin),
	}
}

// limiter returns the token bucket of tenant (burst: a tenth of a minute's
// requests, at least 1), re-rated if the key's rate changed.
func (s *Server) limiter(tenant string, perMin int) *rate.Limiter {
	lim := rate.Limit(float64(perMin) / 60)
	burst := max(1, perMin/10)
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.limiters[tenant]
	if !ok {
		l = rate.NewLimiter(lim, burst)
		s.limiters[tenant] = l
	} else if l.Limit() != lim || l.Burst() != burst {
		l.SetLimit(lim)
		l.SetBurst(burst)
	}
	return l
}

// visible reports whether k may see sb.
func visible(k store.APIKey, sb store.Sandbox) bool {
	return k.Admin || sb.Tenant == k.Tenant
}

// sandbox returns the sandbox named by the {id} path value if r's key may
// see it; every other case is errNoSandbox, byte for byte.
func (s *Server) sandbox(r *http.Request) (store.Sandbox, error) {
	id := r.PathValue("id")
	sb, err := s.cfg.Sandboxes.Get(r.Context(), id)
	if err != nil {
		if pe := publicError(err); pe.Status == http.StatusNotFound || pe.Status == http.StatusBadRequest {
			return sb, errNoSandbox
		}
		return sb, err
	}
	if !visible(keyOf(r), sb) {
		return store.Sandbox{}, errNoSandbox
	}
	return sb, nil
}

// reserve checks a create of cpus and mem against tenant's quota (live
// sandboxes plus creates in flight) and holds the resources until release.
func (s *Server) reserve(ctx context.Context, tenant string, lim Limits, cpus, mem int) (release func(), err error) {
	sbs, err := s.cfg.Sandboxes.List(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	use := s.pending[tenant]
	for _, sb := range sbs {
		// Rows still creating are this server's creates in flight, already
		// counted in pending (only the API sets a tenant).
		if sb.Tenant != tenant || sb.State == store.StateFailed || sb.State == store.StateCreating {
			continue
		}
		use.MaxSandboxes++
		use.MaxVCPUs += sb.CPUs
		use.MaxMemoryMiB += sb.MemoryMiB
	}
	quota := func(name string, used, add, max int, unit string) error {
		return &Error{http.StatusTooManyRequests, "resource_exhausted",
			fmt.Sprintf("quota %s: the tenant uses %d%s of %d%s; this sandbox needs %d%s more", name, used, unit, max, unit, add, unit)}
	}
	switch {
	case use.MaxSandboxes+1 > lim.MaxSandboxes:
		return nil, quota("max_sandboxes", use.MaxSandboxes, 1, lim.MaxSandboxes, "")
	case use.MaxVCPUs+cpus > lim.MaxVCPUs:
		return nil, quota("max_vcpus", use.MaxVCPUs, cpus, lim.MaxVCPUs, "")
	case use.MaxMemoryMiB+mem > lim.MaxMemoryMiB:
		return nil, quota("max_memory_mb", use.MaxMemoryMiB, mem, lim.MaxMemoryMiB, " MiB")
	}
	p := s.pending[tenant]
	p.MaxSandboxes++
	p.MaxVCPUs += cpus
	p.MaxMemoryMiB += mem
	s.pending[tenant] = p
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		p := s.pending[tenant]
		p.MaxSandboxes--
		p.MaxVCPUs -= cpus
		p.MaxMemoryMiB -= mem
		if p == (Limits{}) {
			delete(s.pending, tenant)
		} else {
			s.pending[tenant] = p
		}
	}, nil
}
