package api

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/browser"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// BrowserTokenParam is the query parameter of a signed browser URL: a
// CDP or VNC WebSocket that a client which cannot set headers opens.
const BrowserTokenParam = "token"

// Signed browser URLs live DefaultBrowserURLTTL unless the start asks for
// another lifetime, at most MaxBrowserURLTTL. They stay valid until then
// even if the key that asked for them is revoked: keep them short.
const (
	DefaultBrowserURLTTL = 10 * time.Minute
	MaxBrowserURLTTL     = time.Hour
)

var errNoBrowsers = &Error{http.StatusServiceUnavailable, "unavailable", "browsers are not available on this server"}

// BrowserInfo is the answer of the browser routes.
type BrowserInfo struct {
	sandbox.BrowserStatus
	// CDPURL is the DevTools WebSocket; it takes the API key like every
	// route (Authorization: Bearer).
	CDPURL string `json:"cdp_url"`
	// CDPHTTPURL is the same endpoint for clients that discover the
	// WebSocket through /json/version (Playwright's connectOverCDP).
	CDPHTTPURL string `json:"cdp_http_url"`
	// SignedCDPURL carries a token instead of the key, for clients that
	// cannot set headers; it works until SignedExpiresAt.
	SignedCDPURL    string    `json:"signed_cdp_url,omitempty"`
	SignedExpiresAt time.Time `json:"signed_expires_at,omitzero"`
	// VNCURL is the live view's VNC-over-WebSocket stream (for a noVNC
	// client of your own); view-only unless the start asked for
	// interactive.
	VNCURL string `json:"vnc_url,omitempty"`
	// ViewURL is noVNC's page of the live view on the sandbox's preview
	// host, with the sandbox's preview token; "" without a preview domain
	// (the page comes from the guest, so it is never served from the API's
	// own origin).
	ViewURL string `json:"view_url,omitempty"`
}

type browserStartRequest struct {
	// View waits for the live view too (a plain start leaves it starting).
	View        bool `json:"view"`
	Interactive bool `json:"interactive"`
	// TTLSec is the lifetime of the signed URL (0: DefaultBrowserURLTTL).
	TTLSec int `json:"ttl_s"`
}

// browserSandbox is the sandbox of a browser route, or false once r is
// answered (no such sandbox for the caller, or no browsers here).
func (s *Server) browserSandbox(w http.ResponseWriter, r *http.Request) (store.Sandbox, bool) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return sb, false
	}
	if s.cfg.Browsers == nil {
		s.fail(w, r, errNoBrowsers)
		return sb, false
	}
	return sb, true
}

// startBrowser serves POST /v1/sandboxes/{id}/browser: start the
// sandbox's Chromium if it is not running and say where to reach it.
func (s *Server) startBrowser(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.browserSandbox(w, r)
	if !ok {
		return
	}
	var req browserStartRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ttl := time.Duration(req.TTLSec) * time.Second
	switch {
	case req.TTLSec == 0:
		ttl = DefaultBrowserURLTTL
	case req.TTLSec < 0 || ttl > MaxBrowserURLTTL:
		s.fail(w, r, invalidf("ttl_s must be between 1 and %d", int(MaxBrowserURLTTL/time.Second)))
		return
	}
	v := sandbox.ViewBackground
	switch {
	case req.Interactive:
		v = sandbox.ViewInteractive
	case req.View:
		v = sandbox.ViewWait
	}
	st, err := s.cfg.Browsers.StartBrowser(r.Context(), callerOf(r), sb.ID, v)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.browserInfo(r, sb.ID, sb.Tenant, st, ttl, req.Interactive))
}

// getBrowser serves GET /v1/sandboxes/{id}/browser: the status, starting
// nothing.
func (s *Server) getBrowser(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.browserSandbox(w, r)
	if !ok {
		return
	}
	st, err := s.cfg.Browsers.BrowserStatus(r.Context(), callerOf(r), sb.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	info := BrowserInfo{BrowserStatus: st}
	if st.Running {
		info = s.browserInfo(r, sb.ID, sb.Tenant, st, 0, false)
	}
	writeJSON(w, http.StatusOK, info)
}

// browserInfo fills in the URLs of a started browser (signed ones if ttl).
func (s *Server) browserInfo(r *http.Request, id, tenant string, st sandbox.BrowserStatus, ttl time.Duration, interactive bool) BrowserInfo {
	info := BrowserInfo{BrowserStatus: st}
	ws, http := "ws", "http"
	if r.TLS != nil {
		ws, http = "wss", "https"
	}
	base := "/v1/sandboxes/" + id + "/browser"
	info.CDPURL = ws + "://" + r.Host + base + "/cdp"
	info.CDPHTTPURL = http + "://" + r.Host + base + "/cdp"
	info.VNCURL = ws + "://" + r.Host + base + "/vnc"
	if interactive {
		info.VNCURL += "?interactive=1"
	}
	if ttl > 0 && len(s.cfg.Secret) > 0 {
		exp := time.Now().Add(ttl).Truncate(time.Second)
		info.SignedCDPURL = info.CDPURL + "?" + BrowserTokenParam + "=" + s.browserToken(id, tenant, exp)
		info.SignedExpiresAt = exp.UTC()
	}
	if s.cfg.PreviewDomain != "" {
		port := st.ViewPort
		tok := s.PreviewToken(id)
		q := url.Values{"autoconnect": {"1"}, "resize": {"scale"}, "view_only": {"1"}, PreviewTokenParam: {tok},
			"path": {"websockify?" + url.Values{PreviewTokenParam: {tok}}.Encode()}}
		if interactive && st.InteractivePort != 0 {
			port = st.InteractivePort
			q.Del("view_only")
		}
		if port != 0 {
			info.ViewURL = s.PreviewURL(id, port) + "vnc.html?" + q.Encode()
		}
	}
	return info
}

// browserTokenClaims are what a signed browser URL's token says.
type browserTokenClaims struct {
	Sandbox string `json:"s"`
	Tenant  string `json:"t"`
	Expires int64  `json:"e"`
}

// browserToken signs (sandbox, tenant, expiry) with the server's secret.
func (s *Server) browserToken(id, tenant string, exp time.Time) string {
	b, _ := json.Marshal(browserTokenClaims{id, tenant, exp.Unix()})
	payload := base64.RawURLEncoding.EncodeToString(b)
	return payload + "." + base64.RawURLEncoding.EncodeToString(s.browserMAC(payload))
}

func (s *Server) browserMAC(payload string) []byte {
	m := hmac.New(sha256.New, s.cfg.Secret)
	m.Write([]byte("airlock browser url\x00" + payload))
	return m.Sum(nil)
}

// browserTokenCaller checks a signed URL's token for sandbox id and
// returns the caller it stands for.
func (s *Server) browserTokenCaller(tok, id string) (sandbox.Caller, bool) {
	if len(s.cfg.Secret) == 0 || len(tok) > 1024 {
		return sandbox.Caller{}, false
	}
	payload, mac, ok := strings.Cut(tok, ".")
	if !ok {
		return sandbox.Caller{}, false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || subtle.ConstantTimeCompare(got, s.browserMAC(payload)) != 1 {
		return sandbox.Caller{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	var cl browserTokenClaims
	if err != nil || json.Unmarshal(b, &cl) != nil || cl.Sandbox != id || time.Now().Unix() > cl.Expires {
		return sandbox.Caller{}, false
	}
	return sandbox.Caller{Tenant: cl.Tenant, Via: "browser-url"}, true
}

// browserTokenRoute reports whether pattern is a route a signed browser
// URL opens.
func browserTokenRoute(pattern string) bool {
	return pattern == "GET /v1/sandboxes/{id}/browser/cdp" || pattern == "GET /v1/sandboxes/{id}/browser/cdp/{path...}" ||
		pattern == "GET /v1/sandboxes/{id}/browser/vnc"
}

// browserCDP serves GET /v1/sandboxes/{id}/browser/cdp and what is under
// it: Chromium's DevTools (browser.Proxy), started on first use.
func (s *Server) browserCDP(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.browserSandbox(w, r)
	if !ok {
		return
	}
	c := callerOf(r)
	c.Peer = remoteIP(r)
	base := "/v1/sandboxes/" + sb.ID + "/browser/cdp"
	pub := &url.URL{Scheme: "ws", Host: r.Host, Path: base}
	if r.TLS != nil {
		pub.Scheme = "wss"
	}
	if tok := r.URL.Query().Get(BrowserTokenParam); tok != "" {
		pub.RawQuery = url.Values{BrowserTokenParam: {tok}}.Encode()
	}
	p := &browser.Proxy{
		Dial:   func(ctx context.Context) (net.Conn, error) { return s.cfg.Browsers.DialBrowser(ctx, c, sb.ID) },
		Public: pub, Prefix: base, Log: s.log,
		Fail: s.browserFail,
	}
	p.ServeHTTP(w, r)
}

// browserVNC serves GET /v1/sandboxes/{id}/browser/vnc: the live view's
// VNC stream over WebSocket (websockify in the guest), view-only unless
// ?interactive=1. Only the stream: noVNC's page is the guest's and is not
// served from the API's origin (see BrowserInfo.ViewURL).
func (s *Server) browserVNC(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.browserSandbox(w, r)
	if !ok {
		return
	}
	if !isUpgrade(r) {
		s.fail(w, r, &Error{http.StatusUpgradeRequired, "upgrade_required", "this is a WebSocket endpoint (VNC over WebSocket, for noVNC)"})
		return
	}
	c := callerOf(r)
	c.Peer = remoteIP(r)
	interactive := r.URL.Query().Get("interactive") == "1"
	dial := func(ctx context.Context) (net.Conn, error) {
		return s.cfg.Browsers.DialBrowserView(ctx, c, sb.ID, interactive)
	}
	browser.WebSocketProxy(dial, "/websockify", s.browserFail).ServeHTTP(w, r)
}

// browserFail answers a browser route's error: the manager's categories as
// everywhere, a failed round trip to the guest as 502.
func (s *Server) browserFail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	if re, ok := errors.AsType[*browser.RequestError](err); ok {
		if re.Status == http.StatusNotFound {
			s.fail(w, r, &Error{http.StatusNotFound, "not_found", re.Message})
		} else {
			s.fail(w, r, &Error{http.StatusBadRequest, "invalid", re.Message})
		}
		return
	}
	if pe := publicError(err); pe.Status != http.StatusInternalServerError {
		s.fail(w, r, err)
		return
	}
	s.log.Debug("browser proxy failed", "request_id", requestID(r), "err", err)
	s.fail(w, r, &Error{http.StatusBadGateway, "bad_gateway", fmt.Sprintf("no answer from the sandbox's browser (%v)", oneLine(err))})
}

// oneLine is err's text on one line, at most 200 bytes.
func oneLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return msg
}
