// Package browser serves a sandbox's Chromium to clients: a Chrome
// DevTools Protocol endpoint that unmodified Playwright, Puppeteer and
// chromedp connect to (Proxy), and a chromedp connection for airlock's own
// tools (NewContext). It only moves bytes: the sandbox manager decides who
// may reach which sandbox, and gives this package a Dialer for that.
package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"
)

// Dialer opens a TCP stream to the DevTools port of one sandbox's browser
// (sandbox.Manager.DialBrowser, bound to a caller and a sandbox).
type Dialer func(ctx context.Context) (net.Conn, error)

// upstreamHost is the Host the proxy sends: Chromium answers only requests
// whose Host is an IP address or localhost (its DNS-rebinding check).
const upstreamHost = "127.0.0.1"

// maxJSON caps a DevTools JSON answer read from the guest.
const maxJSON = 1 << 20

// Proxy serves one browser's DevTools endpoint under a path prefix:
//
//	<prefix>                       WebSocket to the browser target (or, as a
//	                               plain GET, /json/version)
//	<prefix>/json/version          Chromium's version document
//	<prefix>/json, /json/list      the page targets
//	<prefix>/devtools/browser/ID   WebSocket to the browser target
//	<prefix>/devtools/page/ID      WebSocket to a page target
//
// Every webSocketDebuggerUrl in a JSON answer is rewritten to point at the
// proxy (Public). Nothing of the client's request but the WebSocket
// handshake and the path reaches Chromium: no credentials, no cookies, no
// Origin (Chromium refuses WebSocket clients that send one unless told to
// accept any, which would let a page in the browser drive it).
type Proxy struct {
	// Dial reaches the guest's DevTools port.
	Dial Dialer
	// Public is the endpoint as clients reach it, ws:// or wss:// with
	// the prefix's path (and a query that authenticates, if any).
	Public *url.URL
	// Prefix is the path the routes are under.
	Prefix string
	// Fail, if set, answers every error (the API's envelope): a
	// *RequestError for a request the proxy refuses, else a failed round
	// trip to the browser. Without it: JSON {"code", "message"}.
	Fail func(http.ResponseWriter, *http.Request, error)
	Log  *slog.Logger
}

// ServeHTTP routes a request under p.Prefix.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, p.Prefix)
	rest = "/" + strings.Trim(rest, "/")
	switch {
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		p.reject(w, r, http.StatusMethodNotAllowed, "the DevTools endpoint takes GET")
	case rest == "/" && isWebSocket(r):
		p.websocket(w, r, "")
	case rest == "/" || rest == "/json/version":
		p.version(w, r)
	case rest == "/json" || rest == "/json/list":
		p.list(w, r)
	case strings.HasPrefix(rest, "/devtools/browser/") || strings.HasPrefix(rest, "/devtools/page/"):
		if !isWebSocket(r) {
			p.reject(w, r, http.StatusBadRequest, "this is a WebSocket endpoint")
			return
		}
		if !validTarget(rest) {
			p.reject(w, r, http.StatusBadRequest, "bad target id")
			return
		}
		p.websocket(w, r, rest)
	default:
		p.reject(w, r, http.StatusNotFound, "no such DevTools route (try "+p.Prefix+"/json/version)")
	}
}

// RequestError is a request the proxy refuses (a route it does not have,
// a bad target id): the status and why. Fail gets it, if set.
type RequestError struct {
	Status  int
	Message string
}

func (e *RequestError) Error() string { return e.Message }

// reject refuses r with status and msg, through Fail if set.
func (p *Proxy) reject(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if p.Fail != nil {
		p.Fail(w, r, &RequestError{status, msg})
		return
	}
	httpError(w, status, msg)
}

// validTarget accepts /devtools/{browser,page}/ID with an ID of letters,
// digits and dashes (Chromium's are 32 hex digits or a UUID).
func validTarget(path string) bool {
	parts := strings.Split(path, "/")
	if len(parts) != 4 || parts[3] == "" || len(parts[3]) > 64 {
		return false
	}
	for _, c := range parts[3] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
			return false
		}
	}
	return true
}

func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// Version is Chromium's /json/version document.
type Version struct {
	Browser              string `json:"Browser"`
	ProtocolVersion      string `json:"Protocol-Version"`
	UserAgent            string `json:"User-Agent"`
	V8Version            string `json:"V8-Version,omitempty"`
	WebKitVersion        string `json:"WebKit-Version,omitempty"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
}

// client is an HTTP client whose every request dials d afresh.
func client(d Dialer) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:           func(ctx context.Context, _, _ string) (net.Conn, error) { return d(ctx) },
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: 30 * time.Second,
		},
		Timeout: time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// getJSON GETs path from the browser into v.
func getJSON(ctx context.Context, d Dialer, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+upstreamHost+path, nil)
	if err != nil {
		return err
	}
	resp, err := client(d).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("browser answered %s to %s", resp.Status, path)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJSON)).Decode(v); err != nil {
		return fmt.Errorf("browser's %s: %w", path, err)
	}
	return nil
}

// GetVersion reads the browser's /json/version.
func GetVersion(ctx context.Context, d Dialer) (Version, error) {
	var v Version
	err := getJSON(ctx, d, "/json/version", &v)
	return v, err
}

// browserPath is the path of the browser target's WebSocket.
func browserPath(ctx context.Context, d Dialer) (string, error) {
	v, err := GetVersion(ctx, d)
	if err != nil {
		return "", err
	}
	u, err := url.Parse(v.WebSocketDebuggerURL)
	if err != nil || !strings.HasPrefix(u.Path, "/devtools/browser/") || !validTarget(u.Path) {
		return "", fmt.Errorf("browser's webSocketDebuggerUrl %q is not a browser target", v.WebSocketDebuggerURL)
	}
	return u.Path, nil
}

// public is the public URL of target path (the prefix itself for "").
func (p *Proxy) public(path string) string {
	u := *p.Public
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawPath = ""
	return u.String()
}

func (p *Proxy) version(w http.ResponseWriter, r *http.Request) {
	v, err := GetVersion(r.Context(), p.Dial)
	if err != nil {
		p.upstreamError(w, r, err)
		return
	}
	v.WebSocketDebuggerURL = p.public("")
	writeJSON(w, v)
}

// target is an entry of /json/list; fields other than these are dropped.
type target struct {
	Description          string `json:"description"`
	ID                   string `json:"id"`
	Title                string `json:"title"`
	Type                 string `json:"type"`
	URL                  string `json:"url"`
	WebSocketDebuggerURL string `json:"webSocketDebuggerUrl,omitempty"`
}

func (p *Proxy) list(w http.ResponseWriter, r *http.Request) {
	var ts []target
	if err := getJSON(r.Context(), p.Dial, "/json/list", &ts); err != nil {
		p.upstreamError(w, r, err)
		return
	}
	for i := range ts {
		ts[i].WebSocketDebuggerURL = ""
		if path := "/devtools/page/" + ts[i].ID; validTarget(path) && ts[i].Type == "page" {
			ts[i].WebSocketDebuggerURL = p.public(path)
		}
	}
	writeJSON(w, ts)
}

// websocket proxies a WebSocket handshake and then its bytes to path (the
// browser target if "").
func (p *Proxy) websocket(w http.ResponseWriter, r *http.Request, path string) {
	if path == "" {
		var err error
		if path, err = browserPath(r.Context(), p.Dial); err != nil {
			p.upstreamError(w, r, err)
			return
		}
	}
	WebSocketProxy(p.Dial, path, p.upstreamError).ServeHTTP(w, r)
}

// WebSocketProxy returns a reverse proxy that sends a WebSocket handshake
// to path on the guest port d reaches, with Host 127.0.0.1 and no header
// but the handshake's own (no credentials, cookies or Origin), then moves
// the connection's bytes both ways. fail answers errors.
func WebSocketProxy(d Dialer, path string, fail func(http.ResponseWriter, *http.Request, error)) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL = &url.URL{Scheme: "http", Host: upstreamHost, Path: path}
			out.Host = upstreamHost
			keep := http.Header{}
			for _, h := range []string{"Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version", "Sec-Websocket-Extensions", "Sec-Websocket-Protocol"} {
				if v, ok := out.Header[h]; ok {
					keep[h] = v
				}
			}
			out.Header = keep
		},
		Transport: &http.Transport{
			DialContext:           func(ctx context.Context, _, _ string) (net.Conn, error) { return d(ctx) },
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: 30 * time.Second,
		},
		ErrorHandler: fail,
	}
}

// upstreamError answers a failed round trip to the browser.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	if p.Log != nil {
		p.Log.Debug("browser proxy", "path", r.URL.Path, "err", err)
	}
	if p.Fail != nil {
		p.Fail(w, r, err)
		return
	}
	httpError(w, http.StatusBadGateway, "no answer from the sandbox's browser: "+err.Error())
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func httpError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
}
