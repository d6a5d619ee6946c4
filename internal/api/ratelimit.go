package api

import (
	"sync"

	"golang.org/x/time/rate"
)

// TenantLimiters are per-tenant request buckets: a tenant's keys' rate
// per minute, in bursts of a tenth of a minute's requests (at least 1).
// The API server and a cluster's control tier each keep one. Safe for
// concurrent use; the zero value is ready.
type TenantLimiters struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// Get returns tenant's bucket, re-rated if perMin changed.
func (t *TenantLimiters) Get(tenant string, perMin int) *rate.Limiter {
	lim, burst := rate.Limit(float64(perMin)/60), max(1, perMin/10)
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.m[tenant]
	switch {
	case !ok:
		if t.m == nil {
			t.m = map[string]*rate.Limiter{}
		}
		l = rate.NewLimiter(lim, burst)
		t.m[tenant] = l
	case l.Limit() != lim || l.Burst() != burst:
		l.SetLimit(lim)
		l.SetBurst(burst)
	}
	return l
}

// Lookup returns tenant's bucket if it has one.
func (t *TenantLimiters) Lookup(tenant string) (*rate.Limiter, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.m[tenant]
	return l, ok
}
