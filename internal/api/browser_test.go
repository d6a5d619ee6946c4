package api

import (
	"net/http"

	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestBrowserToken: a signed browser URL's token opens its own sandbox
// until it expires, as its tenant, and nothing else; a tampered one and a
// server without a secret open nothing.
func TestBrowserToken(t *testing.T) {
	s := &Server{cfg: Config{Secret: []byte(strings.Repeat("s", 32))}}
	const id, other = "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"
	tok := s.browserToken(id, "acme", time.Now().Add(time.Minute))
	c, ok := s.browserTokenCaller(tok, id)
	if !ok || c.Tenant != "acme" || c.Admin || c.Via != "browser-url" {
		t.Fatalf("valid token: %+v %v", c, ok)
	}
	if _, ok := s.browserTokenCaller(tok, other); ok {
		t.Error("the token opened another sandbox")
	}
	if _, ok := s.browserTokenCaller(s.browserToken(id, "acme", time.Now().Add(-time.Second)), id); ok {
		t.Error("an expired token opened the sandbox")
	}
	payload, mac, _ := strings.Cut(tok, ".")
	forged := s.browserToken(id, "other-tenant", time.Now().Add(time.Minute))
	fpayload, _, _ := strings.Cut(forged, ".")
	for _, bad := range []string{"", ".", payload, payload + ".", "." + mac, fpayload + "." + mac, tok + "x", strings.Repeat("a", 2000)} {
		if _, ok := s.browserTokenCaller(bad, id); ok {
			t.Errorf("token %q opened the sandbox", bad)
		}
	}
	other2 := &Server{cfg: Config{Secret: []byte(strings.Repeat("t", 32))}}
	if _, ok := other2.browserTokenCaller(tok, id); ok {
		t.Error("another server's secret accepted the token")
	}
	if _, ok := (&Server{}).browserTokenCaller(tok, id); ok {
		t.Error("a server without a secret accepted a token")
	}
	for pattern, want := range map[string]bool{
		"GET /v1/sandboxes/{id}/browser/cdp":           true,
		"GET /v1/sandboxes/{id}/browser/cdp/{path...}": true,
		"GET /v1/sandboxes/{id}/browser/vnc":           true,
		"POST /v1/sandboxes/{id}/browser":              false,
		"POST /v1/sandboxes/{id}/exec":                 false,
	} {
		if browserTokenRoute(pattern) != want {
			t.Errorf("browserTokenRoute(%q) != %v", pattern, want)
		}
	}
}

// TestBrowserTokenOnlyOnBrowserRoutes: a valid token is no key for any
// other route.
func TestBrowserTokenOnlyOnBrowserRoutes(t *testing.T) {
	t.Parallel()
	var srv *Server
	h := newHarness(t, store.APIKey{}, func(s *Server) { s.cfg.Secret = []byte(strings.Repeat("s", 32)); srv = s })
	tok := srv.browserToken("aliceaaaaaaa", "alice", time.Now().Add(time.Minute))
	r := h.do("", http.MethodGet, "/v1/sandboxes/aliceaaaaaaa?token="+tok, nil)
	if r.code != http.StatusUnauthorized {
		t.Errorf("GET sandbox with a browser token: %d %s", r.code, r.body)
	}
	r = h.do("", http.MethodGet, "/v1/sandboxes/aliceaaaaaaa/browser/cdp/json/version?token="+tok, nil)
	if r.code == http.StatusUnauthorized || r.code == http.StatusNotFound || r.code < 400 {
		t.Errorf("the browser route with its token: %d %s (want past auth, to the fake's guest that has no browser)", r.code, r.body)
	}
	// Bob's sandbox with Alice's token: as absent as with her key.
	r = h.do("", http.MethodGet, "/v1/sandboxes/bobbbbbbbbbb/browser/cdp?token="+tok, nil)
	if r.code != http.StatusUnauthorized {
		t.Errorf("another sandbox with the token: %d %s", r.code, r.body)
	}
}
