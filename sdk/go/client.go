package airlock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// Version is the SDK version sent in the default User-Agent.
const Version = "0.1.0"

// Client talks to one airlock API server. Create it with New or NewFromEnv.
// A Client is safe for concurrent use.
type Client struct {
	base      string // without a trailing slash
	apiKey    string
	hc        *http.Client
	userAgent string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc. The Client
// never sets hc.Timeout: a timeout there also cuts exec streams and file
// transfers, so prefer context deadlines.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent replaces the User-Agent header ("airlock-go/<Version>").
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// New returns a Client for the server at baseURL (for example
// "http://127.0.0.1:8080"; a path prefix is kept) that authenticates with
// apiKey. It does no I/O; a malformed baseURL surfaces on the first call.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:      strings.TrimRight(baseURL, "/"),
		apiKey:    apiKey,
		hc:        &http.Client{},
		userAgent: "airlock-go/" + Version,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// NewFromEnv returns a Client for AIRLOCK_HOST authenticating with
// AIRLOCK_API_KEY. It fails if AIRLOCK_HOST is unset; a missing key is left
// to the server to reject (401).
func NewFromEnv(opts ...Option) (*Client, error) {
	host := os.Getenv("AIRLOCK_HOST") //nolint:forbidigo // NewFromEnv is the SDK's documented way to read AIRLOCK_HOST
	if host == "" {
		return nil, errors.New("airlock: AIRLOCK_HOST is not set")
	}
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	return New(host, os.Getenv("AIRLOCK_API_KEY"), opts...), nil //nolint:forbidigo // as above, AIRLOCK_API_KEY
}

// sandboxPath returns the path of sandbox id followed by the given segments.
func sandboxPath(id string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// newRequest builds a request for path (absolute, under /v1) with query q.
func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("airlock: build request: %w", err)
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	return req, nil
}

// send performs req and returns the response if its status is one of ok;
// otherwise it consumes the body into an *APIError.
func (c *Client) send(req *http.Request, ok ...int) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("airlock: %s %s: %w", req.Method, req.URL.Path, err)
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			return resp, nil
		}
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

// jsonRequest builds a request with in (if non-nil) as its JSON body.
func (c *Client) jsonRequest(ctx context.Context, method, path string, q url.Values, in any) (*http.Request, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("airlock: encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}

// openStream sends in (if non-nil) as a JSON body and returns the 200
// NDJSON response for the caller to read and close.
func (c *Client) openStream(ctx context.Context, method, path string, q url.Values, in any) (*http.Response, error) {
	req, err := c.jsonRequest(ctx, method, path, q, in)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	return c.send(req, http.StatusOK)
}

// doJSON sends in (if non-nil) as a JSON body and decodes the response into
// out (if non-nil). The response status must be one of ok.
func (c *Client) doJSON(ctx context.Context, method, path string, q url.Values, in, out any, ok ...int) error {
	req, err := c.jsonRequest(ctx, method, path, q, in)
	if err != nil {
		return err
	}
	if out != nil {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := c.send(req, ok...)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("airlock: decode %s %s response: %w", method, path, err)
	}
	return nil
}
