package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Dashboard sessions. Signing in to the dashboard (dashboard.go) with an
// API key makes a session: a random 256-bit id in an HttpOnly,
// SameSite=Strict cookie (Secure over TLS), bound to the key's id, never
// to the key itself, which is neither kept nor sent back. Sessions live in
// the server's memory only: a restart of `airlock serve` signs everyone
// out, and servers of one state dir do not share them.
//
// On /v1 routes (not the preview route, which serves guest pages, nor
// /mcp or E2B's routes) the cookie stands in for the Authorization header,
// and only when no Authorization or X-API-KEY header is sent:
//
//   - the key is looked up again by id on every request: a revoked or
//     deleted key ends the session there;
//   - a state-changing request (anything but GET, HEAD, OPTIONS) must carry
//     the session's CSRF token in X-Airlock-CSRF, and if it sends an Origin
//     it must be the server's own;
//   - a WebSocket upgrade must come from the server's own Origin.
//
// A session ends after sessionIdle without a request, sessionMax after it
// began, on sign out, or when its key is revoked.

// SessionCookie is the name of the dashboard's session cookie over plain
// HTTP; over TLS it is SecureSessionCookie, whose __Host- prefix makes
// browsers refuse it from a sibling host (a preview host setting a
// cookie for the parent domain) and without Secure.
const (
	SessionCookie       = "airlock_session"
	SecureSessionCookie = "__Host-airlock_session"
)

// CSRFHeader carries a session's CSRF token on state-changing requests
// authenticated by the session cookie.
const CSRFHeader = "X-Airlock-CSRF"

const (
	sessionIdle = 12 * time.Hour
	sessionMax  = 7 * 24 * time.Hour
	// maxSessions caps the sessions of a server, maxKeySessions those of
	// one key (its oldest is ended to make room).
	maxSessions    = 10000
	maxKeySessions = 32
	// tokenLen is the length of a session id and of a CSRF token: 32
	// random bytes, unpadded base64url.
	tokenLen = 43
)

// KeyGetter is the optional ability of Config.Keys that dashboard sessions
// need: a key's record by id (revoked ones too; an error wrapping
// store.ErrBadKey if there is none), to re-check the key of a session on
// every request. Without it signing in to the dashboard answers 503.
type KeyGetter interface {
	GetKey(ctx context.Context, id string) (store.APIKey, error)
}

var _ KeyGetter = (*store.Store)(nil)

type session struct {
	keyID   string
	csrf    string
	created time.Time
	used    time.Time
}

// sessions are the dashboard's sign-ins, by the SHA-256 of their ids (a
// map lookup then says nothing of an id's bytes through its timing). The
// zero value is ready to use.
type sessions struct {
	mu sync.Mutex
	m  map[[32]byte]*session
}

func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// wellFormed reports whether t has a token's shape (length and alphabet),
// before anything else is done with it.
func wellFormed(t string) bool {
	if len(t) != tokenLen {
		return false
	}
	for _, c := range []byte(t) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (s *session) live(now time.Time) bool {
	return now.Sub(s.used) < sessionIdle && now.Sub(s.created) < sessionMax
}

// create makes a session of keyID and returns its id and CSRF token.
func (ss *sessions) create(keyID string, now time.Time) (id, csrf string, err error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[[32]byte]*session{}
	}
	var oldest [32]byte
	var oldestAt time.Time
	n := 0
	for h, s := range ss.m {
		if !s.live(now) {
			delete(ss.m, h)
			continue
		}
		if s.keyID == keyID {
			n++
			if oldestAt.IsZero() || s.created.Before(oldestAt) {
				oldest, oldestAt = h, s.created
			}
		}
	}
	if n >= maxKeySessions {
		delete(ss.m, oldest)
	}
	if len(ss.m) >= maxSessions {
		return "", "", fmt.Errorf("%w: too many dashboard sessions on this server", errdefs.ErrResourceExhausted)
	}
	id, csrf = newToken(), newToken()
	ss.m[sha256.Sum256([]byte(id))] = &session{keyID: keyID, csrf: csrf, created: now, used: now}
	return id, csrf, nil
}

// get returns the live session of id and counts now as its use.
func (ss *sessions) get(id string, now time.Time) (session, bool) {
	if !wellFormed(id) {
		return session{}, false
	}
	h := sha256.Sum256([]byte(id))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[h]
	if !ok {
		return session{}, false
	}
	if !s.live(now) {
		delete(ss.m, h)
		return session{}, false
	}
	s.used = now
	return *s, true
}

// end ends session id (a missing one is fine).
func (ss *sessions) end(id string) {
	if !wellFormed(id) {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, sha256.Sum256([]byte(id)))
}

// cookieName is the session cookie's name for r.
func cookieName(r *http.Request) string {
	if r.TLS != nil {
		return SecureSessionCookie
	}
	return SessionCookie
}

// sessionID is the value of r's session cookie ("" if none).
func sessionID(r *http.Request) string {
	c, err := r.Cookie(cookieName(r))
	if err != nil {
		return ""
	}
	return c.Value
}

// stripSessionCookie removes the dashboard's session cookies from h's
// Cookie headers (a request proxied to a guest).
func stripSessionCookie(h http.Header) {
	vals := h.Values("Cookie")
	if !slices.ContainsFunc(vals, func(v string) bool { return strings.Contains(v, SessionCookie) }) {
		return // left as sent: re-encoding could drop cookies Go finds odd
	}
	var keep []string
	for _, c := range (&http.Request{Header: http.Header{"Cookie": vals}}).Cookies() {
		if c.Name != SessionCookie && c.Name != SecureSessionCookie {
			keep = append(keep, c.Name+"="+c.Value)
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// sessionCookie is the cookie that sets (value "" and maxAge < 0: clears)
// the session.
func sessionCookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: cookieName(r), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	}
}

// cookieRoute reports whether the session cookie may authenticate the
// route of pattern: the /v1 routes except the preview route, whose
// answers are the guest's pages.
func cookieRoute(pattern string) bool {
	if _, p, ok := strings.Cut(pattern, " "); ok {
		pattern = p
	}
	return strings.HasPrefix(pattern, "/v1/") && !strings.Contains(pattern, "/ports/")
}

// safeMethod reports whether m changes nothing (and so needs no CSRF
// token).
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin reports whether r's Origin is the server's own: its host
// (with port) is r's Host, its scheme the one r came over.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || u.Path != "" || u.User != nil {
		return false
	}
	want := "http"
	if r.TLS != nil {
		want = "https"
	}
	return u.Scheme == want && strings.EqualFold(u.Host, r.Host)
}

var (
	errCSRF = &Error{http.StatusForbidden, "permission_denied",
		"a state-changing request authenticated by the dashboard's session cookie must carry its CSRF token in " + CSRFHeader + " and come from the server's own origin"}
	errCrossOrigin = &Error{http.StatusForbidden, "permission_denied",
		"a WebSocket authenticated by the dashboard's session cookie must come from the server's own origin"}
	errNoSessions = &Error{http.StatusServiceUnavailable, "unavailable", "dashboard sessions are not available on this server"}
)

// signIn authenticates an API key exactly as the API does (lookupKey) and
// makes a session of it: the cookie to set, and the key.
func (s *Server) signIn(r *http.Request, key string) (*http.Cookie, store.APIKey, error) {
	if _, ok := s.cfg.Keys.(KeyGetter); !ok || s.cfg.NodeToken != nil {
		return nil, store.APIKey{}, errNoSessions // a node serves the control tier only
	}
	k, err := s.lookupKey(r, key, key != "")
	if err != nil {
		return nil, k, err
	}
	// A sign-in replaces the browser's session, if it had one.
	s.sess.end(sessionID(r))
	id, _, err := s.sess.create(k.ID, time.Now())
	if err != nil {
		return nil, k, err
	}
	return sessionCookie(r, id, int(sessionMax/time.Second)), k, nil
}

// signedIn returns the live session of r's cookie and its key, which is
// looked up again (a revoked or deleted key ends the session). It checks
// no CSRF token: pages that only read call it.
func (s *Server) signedIn(r *http.Request) (session, store.APIKey, error) {
	id := sessionID(r)
	sess, ok := s.sess.get(id, time.Now())
	kg, kok := s.cfg.Keys.(KeyGetter)
	if !ok || !kok {
		return session{}, store.APIKey{}, errUnauth
	}
	k, err := kg.GetKey(r.Context(), sess.keyID)
	if err == nil && k.Revoked {
		err = store.ErrBadKey
	}
	if err != nil {
		if !errors.Is(err, store.ErrBadKey) {
			return session{}, k, err
		}
		s.sess.end(id)
		return session{}, store.APIKey{}, errUnauth
	}
	return sess, k, nil
}

// downloadRoute is the route of a guest file's bytes. Its answers to the
// cookie are attachments: the dashboard's download links save the file,
// and a browser never shows it as a page of the dashboard's origin.
const downloadRoute = "GET /v1/sandboxes/{id}/files"

// attachment is the Content-Disposition of a download of the guest file
// p: its base name, quoted or RFC 2231-encoded by mime.FormatMediaType
// (guest names are hostile: quotes, control bytes, non-ASCII), or no name
// when it cannot be encoded.
func attachment(p string) string {
	name := path.Base(p)
	if name == "/" || name == "." {
		return "attachment"
	}
	if v := mime.FormatMediaType("attachment", map[string]string{"filename": name}); v != "" {
		return v
	}
	return "attachment"
}

// sessionAuth authenticates a /v1 request by its session cookie, with the
// CSRF and origin checks described above.
// Its answers get a CSP that sandboxes them, should a browser be led to
// show one (a guest's file) as a page of the dashboard's origin, and are
// not to be cached; a guest file's bytes are an attachment.
func (s *Server) sessionAuth(w http.ResponseWriter, r *http.Request) (store.APIKey, error) {
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	if r.Pattern == downloadRoute {
		w.Header().Set("Content-Disposition", attachment(r.URL.Query().Get("path")))
	}
	sess, k, err := s.signedIn(r)
	if err != nil {
		if errors.Is(err, errUnauth) {
			s.denied(r, "invalid session")
		}
		return k, err
	}
	if isUpgrade(r) && !sameOrigin(r) {
		s.denied(r, "cross-origin websocket")
		return store.APIKey{}, errCrossOrigin
	}
	if !safeMethod(r.Method) {
		tok := r.Header.Get(CSRFHeader)
		if subtle.ConstantTimeCompare([]byte(tok), []byte(sess.csrf)) != 1 ||
			(r.Header.Get("Origin") != "" && !sameOrigin(r)) {
			s.denied(r, "csrf")
			return store.APIKey{}, errCSRF
		}
	}
	return k, nil
}

// isUpgrade reports whether r asks for a WebSocket.
func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}
