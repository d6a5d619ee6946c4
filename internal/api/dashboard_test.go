package api

import (
	"context"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// dashClient is a browser-like client of the dashboard: it follows no
// redirects and sends the session cookie it was given by hand.
type dashClient struct {
	t      *testing.T
	h      *harness
	cookie *http.Cookie
	csrf   string
}

func (c *dashClient) req(method, path string, body io.Reader, hdr http.Header) *http.Response {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.t.Context(), method, c.h.url+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.cookie != nil {
		req.AddCookie(c.cookie)
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { res.Body.Close() })
	return res
}

func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var csrfMetaRe = regexp.MustCompile(`<meta name="airlock-csrf" content="([A-Za-z0-9_-]{43})">`)

// signIn posts key to the sign-in form and returns the signed-in client.
func signIn(t *testing.T, h *harness, key string) *dashClient {
	t.Helper()
	c := &dashClient{t: t, h: h}
	res := c.req(http.MethodPost, "/ui/sign-in", strings.NewReader(url.Values{"key": {key}}.Encode()),
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Origin": {h.url}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
		t.Fatalf("sign in: %d, Location %q; want 303 to /", res.StatusCode, res.Header.Get("Location"))
	}
	for _, ck := range res.Cookies() {
		if ck.Name == SessionCookie {
			c.cookie = ck
		}
	}
	if c.cookie == nil {
		t.Fatal("sign in set no session cookie")
	}
	page := c.req(http.MethodGet, "/", nil, nil)
	body := readAll(t, page)
	m := csrfMetaRe.FindStringSubmatch(body)
	if page.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("dashboard page after sign in: %d, no CSRF token in %q", page.StatusCode, body)
	}
	c.csrf = m[1]
	return c
}

func TestDashboardSignIn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	c := &dashClient{t: t, h: h}

	// Not signed in: the pages send the browser to the sign-in page.
	if res := c.req(http.MethodGet, "/", nil, nil); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/sign-in" {
		t.Fatalf("GET / signed out: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	res := c.req(http.MethodGet, "/ui/sign-in", nil, nil)
	if res.StatusCode != http.StatusOK || !strings.Contains(readAll(t, res), `name="key"`) {
		t.Fatalf("sign-in page: %d", res.StatusCode)
	}
	for _, hd := range []struct{ k, want string }{
		{"X-Frame-Options", "DENY"}, {"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"},
	} {
		if got := res.Header.Get(hd.k); got != hd.want {
			t.Errorf("%s = %q, want %q", hd.k, got, hd.want)
		}
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self';") || strings.Contains(csp, "unsafe-eval") ||
		strings.Contains(csp, "script-src 'self' 'unsafe-inline'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q: want scripts from the server's own files only, no framing", csp)
	}

	// A bad key (a wrong secret, a malformed key, none) fails: 401, no
	// cookie, the key not echoed back, the attempt audited.
	wrong := h.bob[:len(h.bob)-1] + map[bool]string{true: "b", false: "a"}[strings.HasSuffix(h.bob, "a")]
	for _, bad := range []string{wrong, "e2b_nope", ""} {
		res := c.req(http.MethodPost, "/ui/sign-in", strings.NewReader(url.Values{"key": {bad}}.Encode()),
			http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
		body := readAll(t, res)
		if res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 {
			t.Errorf("sign in with %q: %d, cookies %v; want 401 and none", bad, res.StatusCode, res.Cookies())
		}
		if bad != "" && strings.Contains(body, bad) {
			t.Errorf("the sign-in page echoes the key %q", bad)
		}
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{Type: "auth.denied"})
	if err != nil || len(evs) < 3 {
		t.Errorf("auth.denied events: %d, %v; want the 3 failed sign-ins", len(evs), err)
	}

	// A form posted from another origin (login CSRF) is refused.
	res = c.req(http.MethodPost, "/ui/sign-in", strings.NewReader(url.Values{"key": {h.alice}}.Encode()),
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}, "Origin": {"https://evil.example"}})
	if res.StatusCode != http.StatusForbidden || len(res.Cookies()) != 0 {
		t.Errorf("cross-origin sign in: %d, cookies %v; want 403 and none", res.StatusCode, res.Cookies())
	}

	// A good key: the cookie is HttpOnly, SameSite=Strict, Path=/, not
	// Secure over plain HTTP, a 256-bit token that is not the key.
	a := signIn(t, h, h.alice)
	ck := a.cookie
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure || len(ck.Value) != tokenLen ||
		strings.Contains(h.alice, ck.Value) || strings.Contains(ck.Value, h.alice[4:14]) {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, a random 43-char token", ck)
	}
	page := readAll(t, a.req(http.MethodGet, "/", nil, nil))
	if strings.Contains(page, h.alice) || strings.Contains(page, h.alice[14:]) {
		t.Fatal("the dashboard page holds the key")
	}
}

func TestDashboardCookieAuthOnAPI(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	a := signIn(t, h, h.alice)

	// Reads need only the cookie; another tenant's sandbox is 404, byte
	// for byte the API's answer to a key.
	res := a.req(http.MethodGet, "/v1/sandboxes", nil, nil)
	if body := readAll(t, res); res.StatusCode != http.StatusOK || !strings.Contains(body, "aliceaaaaaaa") || strings.Contains(body, "bobbbbbbbbbb") {
		t.Fatalf("list by cookie: %d %s", res.StatusCode, body)
	}
	if res.Header.Get("Content-Security-Policy") == "" || !strings.Contains(res.Header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("a cookie-authenticated answer has CSP %q; want a sandboxing one", res.Header.Get("Content-Security-Policy"))
	}
	if cc := res.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("a cookie-authenticated answer has Cache-Control %q, want no-store", cc)
	}
	if res := a.req(http.MethodGet, "/v1/sandboxes/bobbbbbbbbbb", nil, nil); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's sandbox through alice's session: %d, want 404", res.StatusCode)
	}
	if res := a.req(http.MethodGet, "/ui/sandboxes/bobbbbbbbbbb", nil, nil); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's sandbox page through alice's session: %d, want 404", res.StatusCode)
	}
	if res := a.req(http.MethodGet, "/ui/sandboxes/aliceaaaaaaa", nil, nil); res.StatusCode != http.StatusOK {
		t.Fatalf("alice's sandbox page: %d, want 200", res.StatusCode)
	}

	// A state-changing request by cookie without the CSRF header (or with
	// a wrong one, or from another origin) is refused, and nothing happens.
	for _, hdr := range []http.Header{
		{},
		{CSRFHeader: {"x"}},
		{CSRFHeader: {strings.Repeat("A", tokenLen)}},
		{CSRFHeader: {a.csrf}, "Origin": {"https://evil.example"}},
	} {
		res := a.req(http.MethodPost, "/v1/sandboxes/aliceaaaaaaa/pause", strings.NewReader("{}"), hdr)
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("pause by cookie with %v: %d, want 403", hdr, res.StatusCode)
		}
	}
	if res := a.req(http.MethodDelete, "/v1/sandboxes/aliceaaaaaaa", nil, nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("delete by cookie without CSRF: %d, want 403", res.StatusCode)
	}
	h.fake.mu.Lock()
	paused := len(h.fake.pauses)
	h.fake.mu.Unlock()
	if paused != 0 {
		t.Fatalf("a refused request paused the sandbox (%d pauses)", paused)
	}
	// With it, it works.
	res = a.req(http.MethodPost, "/v1/sandboxes/aliceaaaaaaa/pause", strings.NewReader("{}"), http.Header{CSRFHeader: {a.csrf}, "Origin": {h.url}})
	if body := readAll(t, res); res.StatusCode != http.StatusOK {
		t.Fatalf("pause by cookie with CSRF: %d %s", res.StatusCode, body)
	}
	// Another tenant's sandbox is 404 for state changes too.
	if res := a.req(http.MethodDelete, "/v1/sandboxes/bobbbbbbbbbb", nil, http.Header{CSRFHeader: {a.csrf}}); res.StatusCode != http.StatusNotFound {
		t.Fatalf("deleting bob's sandbox through alice's session: %d, want 404", res.StatusCode)
	}

	// The cookie opens no other surface: not the preview route (guest
	// pages on the dashboard's origin), not E2B's routes.
	if res := a.req(http.MethodGet, "/v1/sandboxes/aliceaaaaaaa/ports/8000/", nil, nil); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("preview route by cookie: %d, want 401", res.StatusCode)
	}
	// An Authorization header wins over the cookie, as today.
	res = a.req(http.MethodGet, "/v1/sandboxes", nil, http.Header{"Authorization": {"Bearer " + h.bob}})
	if body := readAll(t, res); res.StatusCode != http.StatusOK || !strings.Contains(body, "bobbbbbbbbbb") || strings.Contains(body, "aliceaaaaaaa") {
		t.Errorf("header and cookie: %d %s; want bob's list", res.StatusCode, body)
	}
	if res := a.req(http.MethodGet, "/v1/sandboxes", nil, http.Header{"Authorization": {"Basic eDp5"}}); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("a non-Bearer Authorization header with the cookie: %d, want 401", res.StatusCode)
	}

	// An admin's session sees every tenant's sandboxes.
	ad := signIn(t, h, h.admin)
	res = ad.req(http.MethodGet, "/v1/sandboxes", nil, nil)
	if body := readAll(t, res); !strings.Contains(body, "aliceaaaaaaa") || !strings.Contains(body, "bobbbbbbbbbb") {
		t.Errorf("admin's list: %s", body)
	}
}

func TestDashboardWebSocketOrigin(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	a := signIn(t, h, h.alice)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(h.url, "http") + "/v1/sandboxes/aliceaaaaaaa/pty"
	cookie := a.cookie.Name + "=" + a.cookie.Value
	for _, origin := range []string{"https://evil.example", "null", ""} {
		hdr := http.Header{"Cookie": {cookie}}
		if origin != "" {
			hdr.Set("Origin", origin)
		}
		c, res, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil {
			_ = c.CloseNow()
			t.Fatalf("WebSocket by cookie from origin %q was accepted", origin)
		}
		if res == nil || res.StatusCode != http.StatusForbidden {
			t.Fatalf("WebSocket by cookie from origin %q: %v, %v; want 403", origin, res, err)
		}
	}
	h.fake.mu.Lock()
	starts := len(h.fake.starts)
	h.fake.mu.Unlock()
	if starts != 0 {
		t.Fatalf("a refused WebSocket started %d execs", starts)
	}
	// From the server's own origin it opens.
	c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {cookie}, "Origin": {h.url}}})
	if err != nil {
		t.Fatalf("same-origin WebSocket by cookie: %v", err)
	}
	defer func() { _ = c.CloseNow() }()
	typ, b, err := c.Read(ctx)
	if err != nil || typ != websocket.MessageText || !strings.Contains(string(b), `"started"`) {
		t.Fatalf("first message %v %q %v; want started", typ, b, err)
	}
}

func TestDashboardSignOutAndRevoke(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	a := signIn(t, h, h.alice)

	// Signing out needs the page's CSRF token.
	form := func(csrf string) io.Reader { return strings.NewReader(url.Values{"csrf": {csrf}}.Encode()) }
	ct := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	if res := a.req(http.MethodPost, "/ui/sign-out", form("nope"), ct); res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign out without the CSRF token: %d, want 403", res.StatusCode)
	}
	if res := a.req(http.MethodGet, "/v1/sandboxes", nil, nil); res.StatusCode != http.StatusOK {
		t.Fatalf("the session ended without its token: %d", res.StatusCode)
	}
	res := a.req(http.MethodPost, "/ui/sign-out", form(a.csrf), ct)
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/sign-in" {
		t.Fatalf("sign out: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	cleared := false
	for _, ck := range res.Cookies() {
		cleared = cleared || ck.Name == SessionCookie && ck.MaxAge < 0
	}
	if !cleared {
		t.Error("sign out did not clear the cookie")
	}
	// The old cookie is dead on the server, whatever the browser keeps.
	if res := a.req(http.MethodGet, "/v1/sandboxes", nil, nil); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("API by a signed-out cookie: %d, want 401", res.StatusCode)
	}
	if res := a.req(http.MethodGet, "/", nil, nil); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("page by a signed-out cookie: %d, want 303 to sign in", res.StatusCode)
	}

	// Signing in again from a signed-in browser replaces its session.
	c := signIn(t, h, h.alice)
	old := c.cookie
	res = c.req(http.MethodPost, "/ui/sign-in", strings.NewReader(url.Values{"key": {h.alice}}.Encode()),
		http.Header{"Content-Type": {"application/x-www-form-urlencoded"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("second sign in: %d", res.StatusCode)
	}
	if res := c.req(http.MethodGet, "/v1/sandboxes", nil, nil); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the replaced session %q still works: %d", old.Value, res.StatusCode)
	}

	// Revoking the key ends its sessions on their next use.
	b := signIn(t, h, h.bob)
	k, err := h.st.LookupKey(t.Context(), h.bob)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.st.RevokeKey(t.Context(), k.ID); err != nil {
		t.Fatal(err)
	}
	if res := b.req(http.MethodGet, "/v1/sandboxes", nil, nil); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("API by the session of a revoked key: %d, want 401", res.StatusCode)
	}
	if res := b.req(http.MethodGet, "/", nil, nil); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("page by the session of a revoked key: %d, want 303", res.StatusCode)
	}
}

func TestDashboardStatic(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	c := &dashClient{t: t, h: h}
	for path, ct := range map[string]string{
		"/ui/static/list.js":                 "text/javascript",
		"/ui/static/style.css":               "text/css",
		"/ui/static/vendor/xterm/xterm.js":   "text/javascript",
		"/ui/static/vendor/xterm/xterm.css":  "text/css",
		"/ui/static/vendor/xterm/../list.js": "",
		"/ui/static/":                        "",
		"/ui/static/nope.js":                 "",
	} {
		res := c.req(http.MethodGet, path, nil, nil)
		if ct == "" {
			if res.StatusCode == http.StatusOK {
				t.Errorf("GET %s: 200, want an error", path)
			}
			continue
		}
		if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), ct) {
			t.Errorf("GET %s: %d %q, want 200 %s", path, res.StatusCode, res.Header.Get("Content-Type"), ct)
		}
	}
}

func TestSessionsExpire(t *testing.T) {
	t.Parallel()
	var ss sessions
	t0 := time.Unix(1_700_000_000, 0)
	id, csrf, err := ss.create("k1", t0)
	if err != nil || !wellFormed(id) || !wellFormed(csrf) || id == csrf {
		t.Fatalf("create: %q %q %v", id, csrf, err)
	}
	if s, ok := ss.get(id, t0.Add(sessionIdle-time.Second)); !ok || s.keyID != "k1" {
		t.Fatal("a session in use ended")
	}
	if _, ok := ss.get(id, t0.Add(2*sessionIdle)); ok {
		t.Fatal("an idle session lived on")
	}
	id, _, _ = ss.create("k1", t0)
	for now := t0; now.Before(t0.Add(sessionMax)); now = now.Add(sessionIdle / 2) {
		if _, ok := ss.get(id, now); !ok {
			t.Fatalf("a session in use ended at %v", now.Sub(t0))
		}
	}
	if _, ok := ss.get(id, t0.Add(sessionMax)); ok {
		t.Fatal("a session outlived sessionMax")
	}
	for _, bad := range []string{"", id + "x", strings.Repeat("!", tokenLen)} {
		if _, ok := ss.get(bad, t0); ok {
			t.Fatalf("get(%q) found a session", bad)
		}
	}
	// One key holds at most maxKeySessions: the oldest goes.
	first, _, _ := ss.create("k2", t0)
	for i := range maxKeySessions {
		if _, _, err := ss.create("k2", t0.Add(time.Duration(i+1)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := ss.get(first, t0.Add(time.Hour)); ok {
		t.Fatal("a key kept more than maxKeySessions sessions")
	}
}

func TestSessionCookieNames(t *testing.T) {
	t.Parallel()
	plain := httptest.NewRequest(http.MethodGet, "http://airlock.example/", nil)
	tls := httptest.NewRequest(http.MethodGet, "https://airlock.example/", nil)
	if c := sessionCookie(plain, "v", 1); c.Name != SessionCookie || c.Secure {
		t.Errorf("plain HTTP cookie %+v", c)
	}
	// Over TLS: __Host- (browsers then refuse one set by a sibling host,
	// such as a preview host, or without Secure and Path=/).
	if c := sessionCookie(tls, "v", 1); c.Name != SecureSessionCookie || !c.Secure || c.Path != "/" || c.Domain != "" || !c.HttpOnly {
		t.Errorf("TLS cookie %+v", c)
	}
	tls.AddCookie(&http.Cookie{Name: SessionCookie, Value: "plain"})
	if id := sessionID(tls); id != "" {
		t.Errorf("over TLS the plain cookie was taken: %q", id)
	}
}

func TestStripSessionCookie(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"a=1; b=2", "a=1; b=2"},
		{"a=1; " + SessionCookie + "=secret; b=2", "a=1; b=2"},
		{SecureSessionCookie + "=secret", ""},
		{"odd=\"x y\"; keep=1", "odd=\"x y\"; keep=1"}, // untouched without a session cookie
	} {
		h := http.Header{}
		if tc.in != "" {
			h.Set("Cookie", tc.in)
		}
		stripSessionCookie(h)
		if got := h.Get("Cookie"); got != tc.want {
			t.Errorf("stripSessionCookie(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The sandbox page's file browser: an upload by cookie needs the CSRF
// header; a download by cookie is an attachment named after the file
// (hostile names encoded, never raw), sandboxed and not sniffed; a
// download by key is answered as before, with no Content-Disposition.
func TestDashboardFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	a := signIn(t, h, h.alice)
	const name = "<img src=x onerror=alert(1)>\".txt"
	p := "/root/" + name
	q := "/v1/sandboxes/aliceaaaaaaa/files?path=" + url.QueryEscape(p)
	if res := a.req(http.MethodPut, q, strings.NewReader("evil"), nil); res.StatusCode != http.StatusForbidden {
		t.Fatalf("upload by cookie without CSRF: %d, want 403", res.StatusCode)
	}
	res := a.req(http.MethodPut, q, strings.NewReader("<script>alert(1)</script>"), http.Header{CSRFHeader: {a.csrf}, "Origin": {h.url}})
	if body := readAll(t, res); res.StatusCode != http.StatusOK {
		t.Fatalf("upload by cookie with CSRF: %d %s", res.StatusCode, body)
	}

	res = a.req(http.MethodGet, q, nil, nil)
	body := readAll(t, res)
	if res.StatusCode != http.StatusOK || body != "<script>alert(1)</script>" {
		t.Fatalf("download by cookie: %d %q", res.StatusCode, body)
	}
	cd := res.Header.Get("Content-Disposition")
	disp, params, err := mime.ParseMediaType(cd)
	if err != nil || disp != "attachment" || params["filename"] != name {
		t.Errorf("download by cookie: Content-Disposition %q (%v); want an attachment named %q", cd, err, name)
	}
	for k, want := range map[string]string{
		"Content-Type": "application/octet-stream", "X-Content-Type-Options": "nosniff",
		"Content-Security-Policy": "default-src 'none'; sandbox; frame-ancestors 'none'",
	} {
		if got := res.Header.Get(k); got != want {
			t.Errorf("download by cookie: %s %q, want %q", k, got, want)
		}
	}
	// Control bytes in a name are encoded, not sent raw in the header.
	if got := attachment("/tmp/a\r\nSet-Cookie: x=1"); strings.ContainsAny(got, "\r\n") || !strings.HasPrefix(got, "attachment; filename*=utf-8''") {
		t.Errorf("attachment of a name with CR LF: %q", got)
	}
	if got := attachment("/"); got != "attachment" {
		t.Errorf("attachment(/) = %q", got)
	}

	// By key: the API's answer is unchanged.
	byKey := &dashClient{t: t, h: h}
	kres := byKey.req(http.MethodGet, q, nil, http.Header{"Authorization": {"Bearer " + h.alice}})
	if kres.StatusCode != http.StatusOK || kres.Header.Get("Content-Disposition") != "" {
		t.Errorf("download by key: %d, Content-Disposition %q; want 200 and none", kres.StatusCode, kres.Header.Get("Content-Disposition"))
	}
	// Other cookie answers (a listing) are not attachments.
	if res := a.req(http.MethodGet, "/v1/sandboxes/aliceaaaaaaa/files/list?path=/root", nil, nil); res.StatusCode != http.StatusOK || res.Header.Get("Content-Disposition") != "" {
		t.Errorf("listing by cookie: %d, Content-Disposition %q", res.StatusCode, res.Header.Get("Content-Disposition"))
	}
}

// The dashboard's CSP lets images be data: URLs (the code cell's plots)
// and nothing else new: scripts and everything else stay the server's own.
func TestDashboardCSPImages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	a := signIn(t, h, h.alice)
	res := a.req(http.MethodGet, "/ui/sandboxes/aliceaaaaaaa", nil, nil)
	body := readAll(t, res)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("sandbox page: %d", res.StatusCode)
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, d := range strings.Split(csp, ";") {
		d = strings.TrimSpace(d)
		if strings.Contains(d, "data:") && d != "img-src 'self' data:" {
			t.Errorf("CSP directive %q allows data: URLs; only img-src may", d)
		}
	}
	if !strings.Contains(csp, "img-src 'self' data:;") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q: want img-src 'self' data:", csp)
	}
	for _, s := range []string{"usage.js", "files.js", "code.js", "events.js"} {
		if !strings.Contains(body, `<script src="/ui/static/`+s+`" defer></script>`) {
			t.Errorf("the sandbox page does not load %s", s)
		}
		if res := a.req(http.MethodGet, "/ui/static/"+s, nil, nil); res.StatusCode != http.StatusOK {
			t.Errorf("GET /ui/static/%s: %d", s, res.StatusCode)
		}
	}
}

// TestDashboardSessionCrossTenant: through alice's signed-in session, with
// a valid CSRF token and the server's own origin (all a page of the
// dashboard can send), every sandbox route, the sandbox page and the
// terminal's WebSocket answer bob's sandbox as a missing one, byte for
// byte; the server route gives alice nothing of bob's; nothing reaches
// bob's sandbox.
func TestDashboardSessionCrossTenant(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{RatePerMin: 60000}) // three requests per route, in one burst
	a := signIn(t, h, h.alice)
	hdr := http.Header{CSRFHeader: {a.csrf}, "Origin": {h.url}}
	n := 0
	for _, rt := range routes {
		if !strings.Contains(rt.pattern, "{id}") || !cookieRoute(rt.pattern) {
			continue
		}
		n++
		var bodies []string
		for _, id := range []string{"bobbbbbbbbbb", "missingaaaaa"} {
			m, p := concrete(rt.pattern, id)
			res := a.req(m, p, strings.NewReader(`{"cmd":["true"],"path":"/x","from":"/x","to":"/y","signal":9,"timeout_s":5}`), hdr)
			body := readAll(t, res)
			if res.StatusCode != http.StatusNotFound {
				t.Errorf("%s on %s by alice's session: %d %s", rt.pattern, id, res.StatusCode, body)
			}
			bodies = append(bodies, strings.Replace(body, res.Header.Get("X-Request-Id"), "", 1))
		}
		if bodies[0] != bodies[1] {
			t.Errorf("%s: bob's sandbox and a missing one differ:\n%s\n%s", rt.pattern, bodies[0], bodies[1])
		}
	}
	if n < 30 {
		t.Fatalf("only %d sandbox routes by cookie", n)
	}
	if res := a.req(http.MethodGet, "/ui/sandboxes/bobbbbbbbbbb", nil, nil); res.StatusCode != http.StatusNotFound {
		t.Errorf("bob's sandbox page: %d", res.StatusCode)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(h.url, "http") + "/v1/sandboxes/bobbbbbbbbbb/pty"
	c, res, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"Cookie": {a.cookie.Name + "=" + a.cookie.Value}, "Origin": {h.url}}})
	if err == nil {
		_ = c.CloseNow()
		t.Fatal("a terminal on bob's sandbox opened through alice's session")
	}
	if res == nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("a terminal on bob's sandbox through alice's session: %v, %v; want 404", res, err)
	}
	res = a.req(http.MethodGet, "/v1/server", nil, nil)
	if body := readAll(t, res); res.StatusCode != http.StatusOK || strings.Contains(body, "bob") || strings.Contains(body, `"host"`) {
		t.Errorf("the server route by alice's session: %d %s", res.StatusCode, body)
	}
	h.fake.mu.Lock()
	defer h.fake.mu.Unlock()
	if len(h.fake.starts) != 0 || len(h.fake.pauses) != 0 {
		t.Errorf("alice's session reached bob's sandbox: %d execs, %d pauses", len(h.fake.starts), len(h.fake.pauses))
	}
	if _, ok := h.fake.sbs["bobbbbbbbbbb"]; !ok {
		t.Error("alice's session removed bob's sandbox")
	}
}

// TestDashboardServerPage: the server page needs a session (else the
// sign-in page), is served under the dashboard's CSP, and its data comes
// from the /v1/server route its script calls.
func TestDashboardServerPage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	anon := &dashClient{t: t, h: h}
	if res := anon.req(http.MethodGet, "/ui/server", nil, nil); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/sign-in" {
		t.Fatalf("signed out: %d %q", res.StatusCode, res.Header.Get("Location"))
	}
	a := signIn(t, h, h.alice)
	res := a.req(http.MethodGet, "/ui/server", nil, nil)
	body := readAll(t, res)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Security-Policy") != dashboardCSP ||
		!strings.Contains(body, `src="/ui/static/server.js"`) || !strings.Contains(body, `aria-current="page">Server`) {
		t.Fatalf("server page: %d %s", res.StatusCode, body)
	}
	if res := a.req(http.MethodGet, "/ui/static/server.js", nil, nil); res.StatusCode != http.StatusOK || !strings.Contains(readAll(t, res), `api("GET", "/server")`) {
		t.Fatalf("server.js: %d", res.StatusCode)
	}
}
