package api

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Preview hosts: with Config.PreviewDomain set, port P of sandbox ID is
// served at http://P-ID.<domain>/, the whole host for that port (so apps
// that use absolute paths work, unlike under the /v1 preview route's
// prefix). Such a request is the sandbox's if it carries
//
//   - an API key that may use the sandbox (Authorization: Bearer), or
//   - the sandbox's preview token: header X-Airlock-Preview-Token (or
//     E2B-Traffic-Access-Token, as E2B's SDKs send it), the cookie
//     airlock_preview_token, or the query parameter airlock_preview_token,
//     which a GET answers with a redirect to the same URL without it that
//     sets the cookie (HttpOnly, SameSite=Lax, for this host only). A
//     shared link works in a browser that way.
//
// Neither is sent on to the guest. Anything else is 401, before the
// sandbox is looked up.

// PreviewTokenParam is the query parameter and cookie of a preview token.
const PreviewTokenParam = "airlock_preview_token"

var previewLabelRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]{1,5})-([a-z2-7]{12,20})$`) })

// validPreviewDomain checks a preview domain: a DNS name, with a port.
func validPreviewDomain(d string) error {
	host := d
	if h, p, err := net.SplitHostPort(d); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("api: preview domain %q: bad port", d)
		}
		host = h
	}
	if host == "" || len(host) > 200 || strings.Trim(host, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" || strings.HasPrefix(host, ".") || strings.Contains(host, "..") {
		return fmt.Errorf("api: preview domain %q is not a lower-case DNS name", d)
	}
	return nil
}

// hostName is h without a port, lower-cased.
func hostName(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(h)
}

// previewHost parses a request's Host as a preview host.
func (s *Server) previewHost(h string) (previewTarget, bool) {
	label, ok := strings.CutSuffix(hostName(h), "."+hostName(s.cfg.PreviewDomain))
	if !ok {
		return previewTarget{}, false
	}
	m := previewLabelRe().FindStringSubmatch(label)
	if m == nil {
		return previewTarget{}, false
	}
	port, err := strconv.Atoi(m[1])
	if err != nil || port < 1 || port > 65535 {
		return previewTarget{}, false
	}
	return previewTarget{id: m[2], port: uint16(port), host: true}, true
}

// PreviewToken is sandbox id's preview token: an HMAC of its id under the
// server's secret ("" without one).
func (s *Server) PreviewToken(id string) string {
	if len(s.cfg.Secret) == 0 {
		return ""
	}
	m := hmac.New(sha256.New, s.cfg.Secret)
	m.Write([]byte("airlock preview token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// PreviewURL is the URL of port of sandbox id on its preview host, ""
// without a preview domain.
func (s *Server) PreviewURL(id string, port uint16) string {
	if s.cfg.PreviewDomain == "" {
		return ""
	}
	return fmt.Sprintf("http://%d-%s.%s/", port, id, s.cfg.PreviewDomain)
}

// hostPreview serves a request to a preview host.
func (s *Server) hostPreview(w http.ResponseWriter, r *http.Request, t previewTarget) {
	tok := r.Header.Get("X-Airlock-Preview-Token")
	if tok == "" {
		tok = r.Header.Get("E2B-Traffic-Access-Token")
	}
	fromQuery := false
	if tok == "" {
		if tok = r.URL.Query().Get(PreviewTokenParam); tok != "" {
			fromQuery = true
		}
	}
	if tok == "" {
		if c, err := r.Cookie(PreviewTokenParam); err == nil {
			tok = c.Value
		}
	}
	var c sandbox.Caller
	switch {
	case tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.PreviewToken(t.id))) == 1:
		sb, err := s.cfg.Sandboxes.Get(r.Context(), sandbox.Caller{Admin: true, Via: "preview"}, t.id)
		if err != nil {
			s.fail(w, r, errNoSandbox)
			return
		}
		c = sandbox.Caller{Tenant: sb.Tenant, Via: "preview"}
	case strings.HasPrefix(r.Header.Get("Authorization"), "Bearer "):
		k, err := s.cfg.Keys.LookupKey(r.Context(), strings.TrimSpace(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")))
		if err != nil {
			s.unauthorized(w, r)
			return
		}
		c = sandbox.KeyCaller(k, s.cfg.Defaults, "preview")
		if !s.limiter(k.Tenant, c.Limits.RatePerMin).Allow() {
			w.Header().Set("Retry-After", "1")
			s.fail(w, r, &Error{http.StatusTooManyRequests, "resource_exhausted", "rate limit for this tenant"})
			return
		}
	default:
		s.unauthorized(w, r)
		return
	}
	if fromQuery && (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isUpgrade(r) {
		// Keep the token in a cookie for this host and drop it from the URL
		// (not for a WebSocket handshake, which cannot follow a redirect:
		// noVNC's path carries the token, for frames whose cookies a
		// browser keeps apart).
		http.SetCookie(w, &http.Cookie{Name: PreviewTokenParam, Value: tok, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
		u := *r.URL
		q := u.Query()
		q.Del(PreviewTokenParam)
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusFound)
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, MaxPreviewBody)
	}
	c.Peer = remoteIP(r)
	t.caller = c
	ctx := context.WithValue(r.Context(), previewKey{}, t)
	s.previewProxy.ServeHTTP(w, r.WithContext(ctx))
}

// unauthorized answers a preview host request without valid credentials.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="airlock preview"`)
	s.fail(w, r, &Error{http.StatusUnauthorized, "unauthenticated", "a preview host needs the sandbox's preview token (" + PreviewTokenParam + ") or an API key that may use the sandbox"})
}

// stripPreviewToken removes the preview token from an outbound request.
func stripPreviewToken(out *http.Request) {
	out.Header.Del("X-Airlock-Preview-Token")
	out.Header.Del("E2B-Traffic-Access-Token")
	if out.URL.Query().Has(PreviewTokenParam) {
		q := out.URL.Query()
		q.Del(PreviewTokenParam)
		out.URL.RawQuery = q.Encode()
	}
	if cs := out.Cookies(); len(cs) > 0 {
		out.Header.Del("Cookie")
		for _, c := range cs {
			if c.Name != PreviewTokenParam {
				out.AddCookie(c)
			}
		}
	}
}

// previewLink serves GET /v1/sandboxes/{id}/preview?port=N: the URL of the
// port on its preview host, with the sandbox's preview token in it (a
// link that works in a browser; anyone who has it reaches the port), and
// the token alone.
func (s *Server) previewLink(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.cfg.PreviewDomain == "" {
		s.fail(w, r, &Error{http.StatusNotFound, "not_found", "this server has no preview domain (airlock serve --preview-domain); use the /v1/sandboxes/{id}/ports/{port}/ route"})
		return
	}
	port, err := strconv.ParseUint(r.URL.Query().Get("port"), 10, 16)
	if err != nil || port == 0 {
		s.fail(w, r, errBadPort)
		return
	}
	tok := s.PreviewToken(sb.ID)
	writeJSON(w, http.StatusOK, map[string]any{
		"url": s.PreviewURL(sb.ID, uint16(port)) + "?" + PreviewTokenParam + "=" + tok, "host": strings.TrimSuffix(strings.TrimPrefix(s.PreviewURL(sb.ID, uint16(port)), "http://"), "/"),
		"token": tok, "port": port,
	})
}
