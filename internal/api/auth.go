package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

type keyCtx struct{}

// authed is what authenticate learned of a request: its key and the
// caller the manager acts for.
type authed struct {
	key    store.APIKey
	caller sandbox.Caller
}

// keyOf returns the authenticated key of r (zero for unauthenticated
// routes).
func keyOf(r *http.Request) store.APIKey {
	a, _ := r.Context().Value(keyCtx{}).(authed)
	return a.key
}

// callerOf returns the caller of an authenticated request (zero, which
// sees only tenant "" and has default limits, for unauthenticated routes).
func callerOf(r *http.Request) sandbox.Caller {
	a, _ := r.Context().Value(keyCtx{}).(authed)
	return a.caller
}

// CallerOf returns the caller a request was authenticated as, for
// adapters mounted with HandleAuthenticated (MCP): the key's tenant, id,
// admin flag and limits (the server's defaults filling the gaps); Via is
// "api" (set your own).
func CallerOf(ctx context.Context) (sandbox.Caller, bool) {
	a, ok := ctx.Value(keyCtx{}).(authed)
	return a.caller, ok
}

// authenticate requires a valid key (Authorization: Bearer, or X-API-KEY
// as E2B's SDKs send it; on /v1 routes, without either, the dashboard's
// session cookie: session.go), then applies its tenant's rate limit.
// Failures are audited as auth.denied, without the key. On a cluster's
// node, the node token is the only way in (nodeAuthenticate).
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.cfg.NodeToken != nil {
		return s.nodeAuthenticate(next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := localCaller(r); ok {
			// In-process (Local): the process's own caller, no key.
			r = r.WithContext(context.WithValue(r.Context(), keyCtx{}, authed{store.APIKey{Tenant: c.Tenant, Admin: c.Admin}, c}))
			next.ServeHTTP(w, r)
			return
		}
		if bt := r.URL.Query().Get(BrowserTokenParam); bt != "" && r.Header.Get("Authorization") == "" && browserTokenRoute(r.Pattern) {
			// A signed browser URL (browser.go): its token names the
			// sandbox and tenant, and expires.
			c, ok := s.browserTokenCaller(bt, r.PathValue("id"))
			if !ok {
				s.denied(r, "invalid or expired browser token")
				s.fail(w, r, errUnauth)
				return
			}
			if !s.limiter(c.Tenant, s.cfg.Defaults.RatePerMin).Allow() {
				w.Header().Set("Retry-After", "1")
				s.fail(w, r, &Error{http.StatusTooManyRequests, "resource_exhausted", "rate limit for this tenant"})
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), keyCtx{}, authed{store.APIKey{Tenant: c.Tenant}, c}))
			next.ServeHTTP(w, r)
			return
		}
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			// The header E2B's SDKs send the key in.
			tok = r.Header.Get("X-API-KEY")
			ok = tok != ""
		}
		var k store.APIKey
		var err error
		if !ok && r.Header.Get("Authorization") == "" && sessionID(r) != "" && cookieRoute(r.Pattern) {
			k, err = s.sessionAuth(w, r)
		} else {
			k, err = s.lookupKey(r, tok, ok)
		}
		if err != nil {
			if errors.Is(err, errUnauth) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="airlock"`)
			}
			s.fail(w, r, err)
			return
		}
		noteKey(r, k)
		c := sandbox.KeyCaller(k, s.cfg.Defaults, "api")
		r = r.WithContext(context.WithValue(r.Context(), keyCtx{}, authed{k, c}))
		if lim := c.Limits; !s.limiter(k.Tenant, lim.RatePerMin).Allow() {
			w.Header().Set("Retry-After", "1")
			s.fail(w, r, &Error{http.StatusTooManyRequests, "resource_exhausted",
				fmt.Sprintf("rate limit: at most %d requests per minute for this tenant", lim.RatePerMin)})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// lookupKey authenticates an API key (present: the request sent one) for
// every surface that takes one: the API's header and the dashboard's
// sign-in. A key that does not authenticate is errUnauth, audited as
// auth.denied without the key.
func (s *Server) lookupKey(r *http.Request, tok string, present bool) (store.APIKey, error) {
	if !present {
		s.denied(r, "missing key")
		return store.APIKey{}, errUnauth
	}
	k, err := s.cfg.Keys.LookupKey(r.Context(), strings.TrimSpace(tok))
	if err != nil {
		if !errors.Is(err, store.ErrBadKey) {
			return store.APIKey{}, err
		}
		s.denied(r, "invalid key")
		return store.APIKey{}, errUnauth
	}
	return k, nil
}

// denied audits a failed authentication, at most deniedAudit's rate.
func (s *Server) denied(r *http.Request, reason string) {
	if s.deniedAudit.Allow() {
		s.audit(r, "", "auth.denied", map[string]any{"reason": reason, "method": r.Method, "route": r.Pattern})
	}
}

// AllowTenant takes one request from tenant's rate limit, for a surface
// that authenticates without an API key (E2B's per-sandbox access tokens):
// false means answer 429. It shares the bucket the tenant's keys fill, at
// the rate their last request set (the server's default before any).
func (s *Server) AllowTenant(tenant string) bool {
	l, ok := s.limiters.Lookup(tenant)
	if !ok {
		l = s.limiter(tenant, s.cfg.Defaults.RatePerMin)
	}
	return l.Allow()
}

// limiter returns the token bucket of tenant, re-rated if the key's rate
// changed.
func (s *Server) limiter(tenant string, perMin int) *rate.Limiter {
	return s.limiters.Get(tenant, perMin)
}

// noSandbox is the answer for a sandbox r's caller cannot use:
// errNoSandbox, byte for byte, except for the process's own caller (Local),
// who gets the manager's words (cause).
func noSandbox(r *http.Request, cause error) error {
	if _, local := localCaller(r); local {
		return cause
	}
	return errNoSandbox
}

// sandbox returns the sandbox named by the {id} path value if r's caller
// may see it; every other case is errNoSandbox, byte for byte.
func (s *Server) sandbox(r *http.Request) (store.Sandbox, error) {
	sb, err := s.cfg.Sandboxes.Get(r.Context(), callerOf(r), r.PathValue("id"))
	if err != nil {
		if pe := publicError(err); pe.Status == http.StatusNotFound || pe.Status == http.StatusBadRequest {
			return sb, noSandbox(r, err)
		}
		return sb, err
	}
	return sb, nil
}
