package airlock

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// Browser is a sandbox's Chromium (sandboxes of the browser image, built
// with `airlock image build browser`).
type Browser struct {
	Running bool `json:"running"`
	// Browser is Chromium's product string ("Chrome/156.0...").
	Browser  string `json:"browser"`
	Protocol string `json:"protocol"`
	// Sandbox is whether Chromium's own sandbox is on.
	Sandbox bool `json:"sandbox"`
	// CDPURL is the DevTools WebSocket; it takes the API key
	// (Authorization: Bearer).
	CDPURL string `json:"cdp_url"`
	// CDPHTTPURL is the same endpoint for clients that discover the
	// WebSocket through /json/version (Playwright's connectOverCDP).
	CDPHTTPURL string `json:"cdp_http_url"`
	// SignedCDPURL carries a short-lived token instead of the key.
	SignedCDPURL    string    `json:"signed_cdp_url,omitempty"`
	SignedExpiresAt time.Time `json:"signed_expires_at,omitzero"`
	// VNCURL is the live view's VNC stream over WebSocket.
	VNCURL string `json:"vnc_url,omitempty"`
	// ViewURL is noVNC's page of the live view on the sandbox's preview
	// host ("" if the server has no preview domain).
	ViewURL string `json:"view_url,omitempty"`
	// Guest ports (see the launcher in the browser image).
	CDPPort         int `json:"cdp_port"`
	ViewPort        int `json:"view_port"`
	InteractivePort int `json:"interactive_port"`
}

// BrowserOptions is how StartBrowser starts a browser.
type BrowserOptions struct {
	// View waits for the live view too (a plain start leaves it starting
	// in the background).
	View bool
	// Interactive also starts the live view with keyboard and mouse (and
	// waits for it).
	Interactive bool
	// SignedURLTTL is how long SignedCDPURL works (0: the server's
	// default, 10 minutes; at most an hour).
	SignedURLTTL time.Duration
}

func browserPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/browser" }

// StartBrowser starts sandbox id's Chromium if it is not running (POST
// /v1/sandboxes/{id}/browser) and says where to reach it.
func (c *Client) StartBrowser(ctx context.Context, id string, o BrowserOptions) (Browser, error) {
	in := map[string]any{"interactive": o.Interactive, "view": o.View}
	if o.SignedURLTTL > 0 {
		in["ttl_s"] = int(o.SignedURLTTL / time.Second)
	}
	var b Browser
	err := c.doJSON(ctx, http.MethodPost, browserPath(id), nil, in, &b, http.StatusOK)
	return b, err
}

// BrowserStatus reports on sandbox id's Chromium, starting nothing.
func (c *Client) BrowserStatus(ctx context.Context, id string) (Browser, error) {
	var b Browser
	err := c.doJSON(ctx, http.MethodGet, browserPath(id), nil, nil, &b, http.StatusOK)
	return b, err
}

// BrowserWebSocket opens the DevTools WebSocket of sandbox id's browser
// target (starting Chromium if needed): the Chrome DevTools Protocol, one
// JSON message per text frame.
func (c *Client) BrowserWebSocket(ctx context.Context, id string) (*websocket.Conn, error) {
	u := strings.Replace(c.base, "http", "ws", 1) + browserPath(id) + "/cdp"
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: c.headers()})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("airlock: browser: %w", err)
	}
	conn.SetReadLimit(128 << 20)
	return conn, nil
}

// headers are the key and user agent a request sends.
func (c *Client) headers() http.Header {
	h := http.Header{}
	if c.apiKey != "" {
		h.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.userAgent != "" {
		h.Set("User-Agent", c.userAgent)
	}
	return h
}

// BrowserProxy returns a handler that serves sandbox id's DevTools
// endpoint under prefix, as Chromium serves it (/json/version, /json/list,
// /devtools/browser/..., the WebSocket at prefix itself), with this
// client's key: serve it on a loopback port and point Playwright or
// Puppeteer at it. Every webSocketDebuggerUrl in an answer is rewritten to
// the handler's own address (the request's Host). Keep prefix secret (a
// random path) if other users can reach the port.
func (c *Client) BrowserProxy(id, prefix string) http.Handler {
	upstream := browserPath(id) + "/cdp"
	return c.prefixProxy(prefix, func(out, _ *http.Request, base *url.URL, rest string) {
		out.URL.Path = strings.TrimSuffix(base.Path, "/") + upstream + rest
		out.Header.Del("Origin")
		out.Header.Del("Accept-Encoding") // ModifyResponse rewrites plain JSON
	}, func(resp *http.Response, prefix string) error {
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			return nil
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		resp.Body.Close()
		if err != nil {
			return err
		}
		// The server's public address of the endpoint, as it wrote it.
		in := resp.Request.URL
		from := "ws://" + in.Host + upstream
		if in.Scheme == "https" {
			from = "wss://" + in.Host + upstream
		}
		local, _ := resp.Request.Context().Value(localHostKey{}).(string)
		b = bytes.ReplaceAll(b, []byte(from), []byte("ws://"+local+prefix))
		resp.Body = io.NopCloser(bytes.NewReader(b))
		resp.ContentLength = int64(len(b))
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return nil
	})
}

// prefixProxy serves the requests under prefix ("" or "/x": the rest of
// their path is rest) from this client's server, with its key and user
// agent and without the client's cookies: rewrite sets the outbound path
// and query (and anything else), modify, if set, edits the answers. The Host a
// request came in with is in its context (localHostKey).
func (c *Client) prefixProxy(prefix string, rewrite func(out, in *http.Request, base *url.URL, rest string),
	modify func(resp *http.Response, prefix string) error) http.Handler {
	prefix = "/" + strings.Trim(prefix, "/")
	if prefix == "/" {
		prefix = ""
	}
	base, _ := url.Parse(c.base)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: base.Scheme, Host: base.Host}
			pr.Out.Host = base.Host
			for k, v := range c.headers() {
				pr.Out.Header[k] = v
			}
			pr.Out.Header.Del("Cookie")
			rewrite(pr.Out, pr.In, base, strings.TrimPrefix(pr.In.URL.Path, prefix))
		},
		Transport: c.hc.Transport,
	}
	if modify != nil {
		rp.ModifyResponse = func(resp *http.Response) error { return modify(resp, prefix) }
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != prefix && !strings.HasPrefix(r.URL.Path, prefix+"/") {
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), localHostKey{}, r.Host)))
	})
}

// localHostKey carries the Host a BrowserProxy request came in with.
type localHostKey struct{}

// PortProxy returns a handler that serves guest port port of sandbox id
// under prefix (HTTP and WebSocket, through the preview route
// /v1/sandboxes/{id}/ports/{port}/ with this client's key). Keep prefix
// secret (a random path) if other users can reach the handler.
func (c *Client) PortProxy(id string, port int, prefix string) http.Handler {
	upstream := "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port)
	return c.prefixProxy(prefix, func(out, in *http.Request, base *url.URL, rest string) {
		out.URL.Path = strings.TrimSuffix(base.Path, "/") + upstream + "/" + strings.TrimPrefix(rest, "/")
		out.URL.RawQuery = in.URL.RawQuery
	}, nil)
}
