package secrets

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

// h2guest is the sandbox's side of one intercepted connection, as an
// HTTP client connection that offers h2 and http/1.1.
type h2guest struct {
	cc    *http.ClientConn
	alpn  string     // what the guest's handshake negotiated
	serve chan error // Serve's result
}

// connectH2 runs Serve for one flow and returns an HTTP client connection
// over it that offers h2 (and http/1.1) in ALPN.
func (h *harness) connectH2(t *testing.T, sni string) *h2guest {
	t.Helper()
	gside, iside := tcpPair(t)
	up, err := net.Dial("tcp", h.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	g := &h2guest{serve: make(chan error, 1)}
	go func() { g.serve <- h.ic.Serve(t.Context(), Flow{Guest: iside, Upstream: up}) }()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.ic.CA.CertPEM())
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	tr := &http.Transport{
		Protocols:          &p,
		DisableCompression: true,
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c := tls.Client(gside, &tls.Config{ServerName: sni, RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}})
			if err := c.HandshakeContext(ctx); err != nil {
				return nil, err
			}
			g.alpn = c.ConnectionState().NegotiatedProtocol
			return c, nil
		},
	}
	g.cc, err = tr.NewClientConn(t.Context(), "https", sni+":443")
	if err != nil {
		gside.Close()
		<-g.serve //nolint:errcheck // only waiting for the goroutine to end
		t.Fatalf("guest connection: %v", err)
	}
	t.Cleanup(func() {
		g.cc.Close()
		gside.Close()
		<-g.serve //nolint:errcheck // only waiting for the goroutine to end; its result is not the subject here
	})
	return g
}

// do sends one request and reads the whole response.
func (g *h2guest) do(t *testing.T, method, url string, header http.Header, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header["User-Agent"] = []string{""} // none: the guest's transport would add Go's
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := g.cc.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp, string(b)
}

func newH2Harness(t *testing.T, secrets []Binding) *harness {
	t.Helper()
	h := &harness{upstreamH2: true}
	return h.start(t, secrets, h.handle)
}

func TestInterceptHTTP2Injects(t *testing.T) {
	t.Parallel()
	h := newH2Harness(t, testSecrets)
	g := h.connectH2(t, "api.test")
	if g.alpn != "h2" {
		t.Fatalf("guest ALPN = %q, want h2", g.alpn)
	}

	// Concurrent streams, each with the value in a header and the query,
	// reflected back in a header and the body.
	const n = 8
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, body := g.do(t, "GET", "https://api.test/echo?key="+ph1, http.Header{"Authorization": {"Bearer " + ph1}}, nil)
			if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
				t.Errorf("status %d, proto %s: %s", resp.StatusCode, resp.Proto, body)
			}
			assertNoValue(t, "response header", fmt.Sprint(resp.Header))
			assertNoValue(t, "response body", body)
			if resp.Header.Get("X-Echo") != "Bearer "+ph1 || !strings.Contains(body, "auth=Bearer "+ph1) {
				t.Errorf("reflection not replaced by the placeholder: header %q body %q", resp.Header.Get("X-Echo"), body)
			}
			if resp.ContentLength != int64(len(body)) {
				t.Errorf("Content-Length %d for a body of %d bytes", resp.ContentLength, len(body))
			}
		})
	}
	wg.Wait()
	got := h.seen()
	if len(got) != n {
		t.Fatalf("upstream saw %d requests, want %d", len(got), n)
	}
	for _, s := range got {
		if s.proto != "HTTP/2.0" || s.header.Get("Authorization") != "Bearer "+apiValue || s.uri != "/echo?key="+apiValue || s.host != "api.test" {
			t.Errorf("upstream saw %+v", s)
		}
		if s.header.Get("User-Agent") != "" || s.header.Get("Accept-Encoding") != "identity" {
			t.Errorf("upstream headers %v", s.header)
		}
	}

	// A streamed reflection; bodies of known and unknown length go
	// through unchanged (the guest's own placeholder is not rewritten).
	resp, body := g.do(t, "GET", "https://api.test/stream", http.Header{"Authorization": {"Bearer " + ph1}}, nil)
	if resp.StatusCode != 200 || body != "Bearer "+ph1+"|end" {
		t.Errorf("streamed response %d %q", resp.StatusCode, body)
	}
	resp, body = g.do(t, "POST", "https://api.test/x", nil, strings.NewReader("k="+ph1))
	if resp.StatusCode != 200 || body != "ok" {
		t.Errorf("POST: %d %q", resp.StatusCode, body)
	}
	resp, body = g.do(t, "POST", "https://api.test/x", nil, io.MultiReader(strings.NewReader("unknown "), strings.NewReader("length")))
	if resp.StatusCode != 200 || body != "ok" {
		t.Errorf("POST of unknown length: %d %q", resp.StatusCode, body)
	}
	got = h.seen()
	if len(got) != n+3 || got[n+1].body != "k="+ph1 || got[n+2].body != "unknown length" {
		t.Errorf("upstream saw %+v", got[n:])
	}

	var injects []Event
	for _, ev := range h.audit() {
		assertNoValue(t, "event", fmt.Sprint(ev))
		if ev.Action == ActionInject {
			injects = append(injects, ev)
		}
	}
	if len(injects) != n+1 || injects[0].Host != "api.test" || !slices.Equal(injects[0].Secrets, []string{"API_KEY"}) ||
		injects[0].Method != "GET" || injects[0].Path != "/echo" {
		t.Errorf("inject events = %+v", injects)
	}
	g.cc.Close()
	if err := <-g.serve; err != nil {
		t.Errorf("Serve: %v", err)
	}
	g.serve <- nil
}

func TestInterceptHTTP2BlocksForeignPlaceholder(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		header http.Header
		url    string
		body   io.Reader
	}{
		"header":         {header: http.Header{"X-Key": {ph2}}},
		"with own":       {header: http.Header{"Authorization": {"Bearer " + ph1}, "X-Key": {strings.ToUpper(ph2)}}},
		"query":          {url: "/?k=" + ph2},
		"body":           {body: strings.NewReader("k=" + ph2)},
		"streamed body":  {body: io.MultiReader(strings.NewReader("k="), strings.NewReader(ph2))},
		"big body":       {body: bytes.NewReader(append(bytes.Repeat([]byte("x"), maxBufferedBody), ph2...))},
		"wrong host":     {header: http.Header{"Authorization": {"Bearer " + ph1}}, url: "https://other.test/"},
		"absolute other": {url: "https://api.test:99999/"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newH2Harness(t, testSecrets)
			g := h.connectH2(t, "api.test")
			url := "https://api.test/"
			if strings.HasPrefix(tt.url, "https://") {
				url = tt.url
			} else if tt.url != "" {
				url = "https://api.test" + tt.url
			}
			method := "GET"
			if tt.body != nil {
				method = "POST"
			}
			req, err := http.NewRequestWithContext(t.Context(), method, url, tt.body)
			if err != nil {
				t.Fatal(err)
			}
			for k, vs := range tt.header {
				req.Header[k] = vs
			}
			resp, err := g.cc.RoundTrip(req)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusMisdirectedRequest {
					t.Errorf("status %d: %s", resp.StatusCode, b)
				}
			}
			// The refusal ends the connection (GOAWAY, then close).
			if err := <-g.serve; !errors.Is(err, ErrRefused) {
				t.Errorf("Serve: %v, want ErrRefused", err)
			}
			g.serve <- nil
			for _, s := range h.seen() {
				if strings.Contains(s.body, ph2) || strings.Contains(fmt.Sprint(s.header), ph2) || strings.Contains(s.uri, ph2) {
					t.Errorf("upstream saw the placeholder: %+v", s)
				}
				if !strings.Contains(name, "body") {
					t.Errorf("upstream saw %+v", s)
				}
			}
			evs := h.audit()
			if len(evs) != 1 || evs[0].Action != ActionBlock || evs[0].Host != "api.test" {
				t.Fatalf("events = %+v", evs)
			}
			if tt.header["X-Key"] != nil || tt.body != nil || strings.Contains(tt.url, ph2) {
				if !slices.Equal(evs[0].Secrets, []string{"OTHER"}) {
					t.Errorf("events = %+v", evs)
				}
			}
		})
	}
}

func TestInterceptHTTP2OnlyWhenUpstreamSpeaksIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t) // an upstream of http/1.1 only
	g := h.connectH2(t, "api.test")
	if g.alpn != "http/1.1" {
		t.Fatalf("guest ALPN = %q, want http/1.1", g.alpn)
	}
	resp, body := g.do(t, "GET", "https://api.test/echo", http.Header{"Authorization": {"Bearer " + ph1}}, nil)
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 {
		t.Fatalf("status %d, proto %s: %s", resp.StatusCode, resp.Proto, body)
	}
	if got := h.seen(); len(got) != 1 || got[0].header.Get("Authorization") != "Bearer "+apiValue || got[0].proto != "HTTP/1.1" {
		t.Fatalf("upstream saw %+v", got)
	}
}

func TestInterceptHTTP2RefusesConnect(t *testing.T) {
	t.Parallel()
	h := newH2Harness(t, testSecrets)
	g := h.connectH2(t, "api.test")
	req, err := http.NewRequestWithContext(t.Context(), http.MethodConnect, "https://api.test:443", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Path = ""
	resp, err := g.cc.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("status %d", resp.StatusCode)
		}
	}
	if err := <-g.serve; !errors.Is(err, ErrRefused) {
		t.Errorf("Serve: %v, want ErrRefused", err)
	}
	g.serve <- nil
	if got := h.seen(); len(got) != 0 {
		t.Errorf("upstream saw %+v", got)
	}
}

// Bodies read whole share a per-connection budget: more concurrent 1 MiB
// uploads than it holds are streamed through the guard instead, and all
// arrive intact (none waits for a share: that would stall the connection's
// flow control).
func TestInterceptHTTP2BufferBudget(t *testing.T) {
	t.Parallel()
	h := newH2Harness(t, testSecrets)
	g := h.connectH2(t, "api.test")
	const n = 3 * h2BufferBudget / maxBufferedBody
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := bytes.Repeat([]byte{'a' + byte(i)}, maxBufferedBody)
			resp, got := g.do(t, "POST", "https://api.test/x", nil, bytes.NewReader(body))
			if resp.StatusCode != 200 || got != "ok" {
				t.Errorf("upload %d: %d %q", i, resp.StatusCode, got)
			}
		})
	}
	wg.Wait()
	seen := h.seen()
	if len(seen) != n {
		t.Fatalf("upstream saw %d uploads, want %d", len(seen), n)
	}
	for _, s := range seen {
		if len(s.body) != maxBufferedBody || strings.Count(s.body, s.body[:1]) != maxBufferedBody {
			t.Errorf("upload of %d bytes arrived damaged (%d bytes)", maxBufferedBody, len(s.body))
		}
	}
}
