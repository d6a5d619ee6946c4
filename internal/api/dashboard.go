package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"io/fs"
	"net/http"
	"path"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/dashboard"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// The web dashboard (issue #15), served by the API's own server: pages at
// / and under /ui/ (E2B's routes own /sandboxes and friends), their files
// from internal/dashboard. The pages hold no data of their own: their
// scripts call the /v1 routes with the session cookie (session.go), so
// tenancy, quotas and the audit trail are the API's, decided in one place.
// Guest pages are never served from this origin: the preview route does
// not take the cookie (preview hosts serve guests' pages).

// dashboardCSP forbids inline and foreign scripts, frames and plugins.
// Inline styles are allowed because xterm.js sets its theme in a <style>
// element it makes. Images may be data: URLs: the code cell shows a
// run's PNG and JPEG results as <img src="data:image/png;base64,…">. That
// is safe: an image element runs no script (not even an SVG's), and a
// data: URL fetches nothing, so it can neither load nor leak anything;
// the cell builds only raster types' URLs (never text/html or SVG).
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// maxSignInBody caps the sign-in form.
const maxSignInBody = 4 << 10

// mountDashboard adds the dashboard's routes to the mux.
func (s *Server) mountDashboard() {
	for pattern, h := range map[string]http.HandlerFunc{
		"GET /{$}":                 s.dashList,
		"GET /ui/sign-in":          s.dashSignInPage,
		"POST /ui/sign-in":         s.dashSignIn,
		"POST /ui/sign-out":        s.dashSignOut,
		"GET /ui/sandboxes/{id}":   s.dashSandbox,
		"GET /ui/server":           s.dashServer,
		"GET /ui/static/{path...}": s.dashStatic,
	} {
		s.mux.Handle(pattern, s.instrument("dashboard", dashHeaders(h)))
	}
}

// dashHeaders sets the headers of every dashboard answer.
func dashHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", dashboardCSP)
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		// Not no-referrer: with it Chromium sends "Origin: null" on form
		// posts, and sign-in checks the Origin.
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cross-Origin-Resource-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// page is what the templates get.
type page struct {
	Title     string
	Signed    bool
	Tenant    string
	KeyID     string
	Admin     bool
	CSRF      string
	SandboxID string
	Error     string
	Styles    []string
	Scripts   []string
}

// render writes a page; pages are never cached (they hold the CSRF token).
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	var b bytes.Buffer
	if err := dashboard.Pages.ExecuteTemplate(&b, name, p); err != nil {
		s.log.Error("dashboard template", "request_id", requestID(r), "template", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// signedPage returns the page data of r's session, or redirects to the
// sign-in page and returns false.
func (s *Server) signedPage(w http.ResponseWriter, r *http.Request, title string) (page, store.APIKey, bool) {
	sess, k, err := s.signedIn(r)
	if err != nil {
		if !errors.Is(err, errUnauth) {
			s.log.Error("dashboard session", "request_id", requestID(r), "err", err)
			http.Error(w, "temporarily unavailable; retry later", http.StatusServiceUnavailable)
			return page{}, k, false
		}
		if sessionID(r) != "" {
			http.SetCookie(w, sessionCookie(r, "", -1))
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "/ui/sign-in", http.StatusSeeOther)
		return page{}, k, false
	}
	return page{Title: title, Signed: true, Tenant: k.Tenant, KeyID: k.ID, Admin: k.Admin, CSRF: sess.csrf}, k, true
}

func (s *Server) dashList(w http.ResponseWriter, r *http.Request) {
	p, _, ok := s.signedPage(w, r, "Sandboxes")
	if !ok {
		return
	}
	p.Scripts = []string{"common.js", "list.js"}
	s.render(w, r, http.StatusOK, "list.html", p)
}

// dashServer is the server page: its figures come from GET /v1/server,
// which decides what the session's key may see.
func (s *Server) dashServer(w http.ResponseWriter, r *http.Request) {
	p, _, ok := s.signedPage(w, r, "Server")
	if !ok {
		return
	}
	p.Scripts = []string{"common.js", "server.js"}
	s.render(w, r, http.StatusOK, "server.html", p)
}

func (s *Server) dashSandbox(w http.ResponseWriter, r *http.Request) {
	p, k, ok := s.signedPage(w, r, "Sandbox")
	if !ok {
		return
	}
	// The same answer as the API's for a sandbox the key cannot see.
	if _, err := s.cfg.Sandboxes.Get(r.Context(), sandbox.KeyCaller(k, s.cfg.Defaults, "api"), r.PathValue("id")); err != nil {
		p.Title, p.Error = "Not found", "sandbox not found"
		p.Scripts = nil
		status := http.StatusNotFound
		if pe := publicError(err); pe.Status != http.StatusNotFound && pe.Status != http.StatusBadRequest {
			status, p.Error = pe.Status, pe.Message
		}
		s.render(w, r, status, "error.html", p)
		return
	}
	p.SandboxID = r.PathValue("id")
	p.Styles = []string{"vendor/xterm/xterm.css"}
	p.Scripts = []string{"vendor/xterm/xterm.js", "common.js", "sandbox.js", "actions.js", "usage.js", "files.js", "code.js", "logs.js", "events.js", "browser.js"}
	s.render(w, r, http.StatusOK, "sandbox.html", p)
}

func (s *Server) dashSignInPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "sign-in.html", page{Title: "Sign in"})
}

// dashSignIn takes the form's key, authenticates it as the API does and
// starts a session. A cross-origin form (login CSRF) is refused.
func (s *Server) dashSignIn(w http.ResponseWriter, r *http.Request) {
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(r) {
		s.render(w, r, http.StatusForbidden, "sign-in.html", page{Title: "Sign in", Error: "sign in from this server's own page"})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxSignInBody)
	if err := r.ParseForm(); err != nil {
		s.render(w, r, http.StatusBadRequest, "sign-in.html", page{Title: "Sign in", Error: "the form could not be read"})
		return
	}
	c, k, err := s.signIn(r, r.PostForm.Get("key"))
	if err != nil {
		status, msg := http.StatusUnauthorized, "that key is not valid (it may be mistyped or revoked)"
		if !errors.Is(err, errUnauth) {
			pe := publicError(err)
			status, msg = pe.Status, pe.Message
		}
		s.render(w, r, status, "sign-in.html", page{Title: "Sign in", Error: msg})
		return
	}
	s.auditKey(r, k, "dashboard.sign_in")
	http.SetCookie(w, c)
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// dashSignOut ends the session (the form carries its CSRF token, so no
// other site can sign a user out) and clears the cookie.
func (s *Server) dashSignOut(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxSignInBody)
	_ = r.ParseForm()
	id := sessionID(r)
	if sess, k, err := s.signedIn(r); err == nil {
		if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(sess.csrf)) != 1 {
			s.render(w, r, http.StatusForbidden, "error.html", page{Title: "Forbidden", Error: "sign out from the dashboard's own page"})
			return
		}
		s.sess.end(id)
		s.auditKey(r, k, "dashboard.sign_out")
	}
	http.SetCookie(w, sessionCookie(r, "", -1))
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, "/ui/sign-in", http.StatusSeeOther)
}

// auditKey records an event of key k (a request without the API's
// authentication: the dashboard's sign-in and sign-out).
func (s *Server) auditKey(r *http.Request, k store.APIKey, action string) {
	ctx := context.WithValue(r.Context(), keyCtx{}, authed{k, sandbox.KeyCaller(k, s.cfg.Defaults, "dashboard")})
	s.audit(r.WithContext(ctx), "", action, map[string]any{"via": "dashboard"})
}

// staticTypes are the content types of the static files, fixed here
// rather than taken from the host's MIME database.
var staticTypes = map[string]string{
	".js":  "text/javascript; charset=utf-8",
	".css": "text/css; charset=utf-8",
	".svg": "image/svg+xml",
}

// dashStatic serves the embedded static files (no directory listings).
func (s *Server) dashStatic(w http.ResponseWriter, r *http.Request) {
	p := r.PathValue("path")
	if p == "" || !fs.ValidPath(p) || strings.HasSuffix(p, "/") {
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(dashboard.Static, p)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	ct, ok := staticTypes[path.Ext(p)]
	if !ok {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}
