package secrets

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

const (
	apiValue   = "sk-REAL-api-value-0001"
	otherValue = "REAL-other-value-0002"
)

var testSecrets = []Binding{
	{Name: "API_KEY", Hosts: []string{"api.test"}, Placeholder: ph1, Value: apiValue},
	{Name: "OTHER", Hosts: []string{"other.test", "*.wild.test"}, Placeholder: ph2, Value: otherValue},
}

// seen is what the fake upstream received.
type seen struct {
	method, uri, host string
	header            http.Header
	body              string
	chunked           bool
	proto             string
}

type harness struct {
	ic  *Interceptor
	srv *httptest.Server
	// upstreamH2: the upstream offers h2 as well as http/1.1 (set before
	// start).
	upstreamH2 bool

	mu     sync.Mutex
	reqs   []seen
	events []Event
}

// newHarness starts a TLS upstream for api.test, other.test and *.wild.test
// whose certificates come from a separate test CA, and an Interceptor that
// trusts only that CA.
func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{}
	return h.start(t, testSecrets, h.handle)
}

// start runs handler as the upstream and an Interceptor for secrets.
func (h *harness) start(t *testing.T, secrets []Binding, handler http.HandlerFunc) *harness {
	t.Helper()
	upCA, err := NewCA([]string{"api.test", "other.test", "*.wild.test"})
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewUnstartedServer(handler)
	h.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes we abort are expected
	h.srv.TLS = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(hi.ServerName) }}
	if h.upstreamH2 {
		h.srv.EnableHTTP2 = true
		h.srv.TLS.NextProtos = []string{"h2", "http/1.1"}
	}
	h.srv.StartTLS()
	t.Cleanup(h.srv.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(upCA.CertPEM())

	ca, err := NewCA([]string{"api.test", "other.test", "*.wild.test"})
	if err != nil {
		t.Fatal(err)
	}
	h.ic = &Interceptor{CA: ca, Secrets: secrets, RootCAs: roots, Audit: func(ev Event) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.events = append(h.events, ev)
	}}
	return h
}

// handle is the fake upstream. /echo reflects the Authorization header in a
// header and in the body; /stream reflects it in a streamed body, split
// across flushes; anything else answers "ok".
func (h *harness) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // a truncated request is not recorded
	}
	h.mu.Lock()
	h.reqs = append(h.reqs, seen{r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(body), slices.Contains(r.TransferEncoding, "chunked"), r.Proto})
	h.mu.Unlock()
	auth := r.Header.Get("Authorization")
	switch r.URL.Path {
	case "/echo":
		w.Header().Set("X-Echo", auth)
		w.Header().Set("X-Query", r.URL.RawQuery)
		fmt.Fprintf(w, "auth=%s query=%s body=%s", auth, r.URL.RawQuery, body)
	case "/stream":
		f := w.(http.Flusher)
		for i := 0; i < len(auth); i += 5 {
			_, _ = io.WriteString(w, auth[i:min(i+5, len(auth))])
			f.Flush()
		}
		_, _ = io.WriteString(w, "|end")
	default:
		_, _ = io.WriteString(w, "ok")
	}
}

func (h *harness) seen() []seen {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reqs)
}

func (h *harness) audit() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// tcpPair returns two ends of a loopback TCP connection (unlike net.Pipe,
// it buffers, as the guest's network does).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		ch <- result{c, err}
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return a, r.c
}

// guest is the sandbox's side of one intercepted connection.
type guest struct {
	*tls.Conn
	br    *bufio.Reader
	serve chan error // Serve's result
}

// connect runs Serve for one flow and returns the guest's TLS client (not
// yet handshaken) trusting only the interceptor's CA.
func (h *harness) connect(t *testing.T, sni string, check func(string) error) *guest {
	t.Helper()
	gside, iside := tcpPair(t)
	up, err := net.Dial("tcp", h.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	g := &guest{serve: make(chan error, 1)}
	go func() { g.serve <- h.ic.Serve(t.Context(), Flow{Guest: iside, Upstream: up, CheckSNI: check}) }()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.ic.CA.CertPEM())
	g.Conn = tls.Client(gside, &tls.Config{ServerName: sni, RootCAs: roots, NextProtos: []string{"http/1.1"}})
	g.br = bufio.NewReader(g.Conn)
	t.Cleanup(func() {
		g.Conn.Close()
		<-g.serve //nolint:errcheck // only waiting for the goroutine to end; its result is not the subject here
	})
	return g
}

// do sends a raw request and reads the response and its body.
func (g *guest) do(t *testing.T, raw string) (*http.Response, string) {
	t.Helper()
	if _, err := io.WriteString(g.Conn, raw); err != nil {
		t.Fatalf("write request: %v", err)
	}
	var req *http.Request
	if method, _, _ := strings.Cut(raw, " "); method == http.MethodHead {
		req = &http.Request{Method: method}
	}
	resp, err := http.ReadResponse(g.br, req)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read response body: %v", err)
	}
	return resp, string(body)
}

// assertNoValue fails if s contains any real value.
func assertNoValue(t *testing.T, what, s string) {
	t.Helper()
	for _, v := range []string{apiValue, otherValue} {
		if strings.Contains(s, v) {
			t.Errorf("%s carries a real value: %q", what, s)
		}
	}
}

func TestInterceptInjects(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.connect(t, "api.test", func(string) error { return nil })

	// Bearer and query, reflected back in a header and the body.
	resp, body := g.do(t, "GET /echo?key="+ph1+"&x=1 HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if g.ConnectionState().NegotiatedProtocol != "http/1.1" {
		t.Errorf("ALPN = %q", g.ConnectionState().NegotiatedProtocol)
	}
	got := h.seen()
	if len(got) != 1 || got[0].header.Get("Authorization") != "Bearer "+apiValue || got[0].uri != "/echo?key="+apiValue+"&x=1" {
		t.Fatalf("upstream saw %+v", got)
	}
	if got[0].header.Get("User-Agent") != "" {
		t.Errorf("a User-Agent was added: %q", got[0].header.Get("User-Agent"))
	}
	assertNoValue(t, "response header", fmt.Sprint(resp.Header))
	assertNoValue(t, "response body", body)
	if resp.Header.Get("X-Echo") != "Bearer "+ph1 || !strings.Contains(body, "auth=Bearer "+ph1) {
		t.Errorf("reflection not replaced by the placeholder: header %q body %q", resp.Header.Get("X-Echo"), body)
	}
	if resp.ContentLength != int64(len(body)) {
		t.Errorf("Content-Length %d for a body of %d bytes", resp.ContentLength, len(body))
	}

	// Keep-alive: Basic auth on the same connection, Host with :443 and odd case.
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + ph1))
	resp, body = g.do(t, "GET /echo HTTP/1.1\r\nHost: API.test:443\r\nAuthorization: basic "+basic+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got = h.seen()
	want := "basic " + base64.StdEncoding.EncodeToString([]byte("user:"+apiValue))
	if len(got) != 2 || got[1].header.Get("Authorization") != want {
		t.Fatalf("upstream saw %+v, want Authorization %q", got, want)
	}
	assertNoValue(t, "response", fmt.Sprint(resp.Header)+body)

	// Streamed reflection, split across chunks.
	resp, body = g.do(t, "GET /stream HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != 200 || body != "Bearer "+ph1+"|end" {
		t.Errorf("streamed response %d %q", resp.StatusCode, body)
	}
	if err := <-g.serve; err != nil {
		t.Errorf("Serve: %v", err)
	}
	g.serve <- nil

	var injects []Event
	for _, ev := range h.audit() {
		assertNoValue(t, "event", fmt.Sprint(ev))
		if ev.Action == ActionInject {
			injects = append(injects, ev)
		}
	}
	if len(injects) != 3 || injects[0].Host != "api.test" || !slices.Equal(injects[0].Secrets, []string{"API_KEY"}) ||
		injects[0].Method != "GET" || injects[0].Path != "/echo" {
		t.Errorf("inject events = %+v", injects)
	}
}

func TestInterceptBodies(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.connect(t, "api.test", nil)

	// A chunked body is forwarded intact, and not rewritten.
	resp, body := g.do(t, "POST /echo HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"5\r\nhello\r\n1\r\n \r\n2f\r\n"+ph1+"\r\n0\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := h.seen()
	if len(got) != 1 || got[0].body != "hello "+ph1 || !got[0].chunked {
		t.Fatalf("upstream saw %+v", got)
	}
	// A Content-Length body, with Expect: 100-continue.
	if _, err := io.WriteString(g, "PUT /x HTTP/1.1\r\nHost: api.test\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(g.br, nil)
	if err != nil || resp.StatusCode != 100 {
		t.Fatalf("want 100 Continue, got %v %v", resp, err)
	}
	resp, body = g.do(t, "data")
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := h.seen(); len(got) != 2 || got[1].body != "data" || got[1].header.Get("Expect") != "" {
		t.Fatalf("upstream saw %+v", got)
	}
}

func TestInterceptRequestForms(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.connect(t, "api.test", nil)

	// Absolute form naming the TLS host is forwarded in origin form.
	resp, body := g.do(t, "GET https://api.test/echo?k="+ph1+" HTTP/1.1\r\nHost: api.test\r\nUser-Agent: guest/1\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := h.seen()
	if len(got) != 1 || got[0].uri != "/echo?k="+apiValue || got[0].header.Get("User-Agent") != "guest/1" {
		t.Fatalf("upstream saw %+v", got)
	}
	assertNoValue(t, "response", fmt.Sprint(resp.Header)+body)

	// A value in the path is path-escaped.
	resp, body = g.do(t, "GET /bot"+ph1+"/x HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if got := h.seen(); resp.StatusCode != 200 || len(got) != 2 || got[1].uri != "/bot"+apiValue+"/x" {
		t.Fatalf("status %d %q, upstream saw %+v", resp.StatusCode, body, got)
	}

	// HEAD has no body, whatever the Content-Length says.
	resp, body = g.do(t, "HEAD /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\n\r\n")
	if resp.StatusCode != 200 || body != "" || resp.Header.Get("X-Echo") != "Bearer "+ph1 {
		t.Fatalf("HEAD: status %d, body %q, header %v", resp.StatusCode, body, resp.Header)
	}
	// The connection is still in sync.
	resp, body = g.do(t, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("after HEAD: status %d, body %q", resp.StatusCode, body)
	}
}

func TestInterceptBlocksForeignPlaceholder(t *testing.T) {
	t.Parallel()
	basic := base64.StdEncoding.EncodeToString([]byte("u:" + ph2))
	big := strings.Repeat("x", maxBufferedBody)
	tests := map[string]string{
		"header":         "GET / HTTP/1.1\r\nHost: api.test\r\nX-Key: " + ph2 + "\r\n\r\n",
		"upper header":   "GET / HTTP/1.1\r\nHost: api.test\r\nX-Key: " + strings.ToUpper(ph2) + "\r\n\r\n",
		"basic":          "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " + basic + "\r\n\r\n",
		"query":          "GET /?k=" + ph2 + " HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"body":           fmt.Sprintf("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\nk=%s", len(ph2)+2, ph2),
		"chunked body":   "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nk=air\r\n2c\r\n" + ph2[3:] + "\r\n0\r\n\r\n",
		"big body":       fmt.Sprintf("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n%s%s", len(big)+len(ph2), big, ph2),
		"both with own":  "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph1 + "\r\nX-Key: " + ph2 + "\r\n\r\n",
		"encoded in url": "GET /" + base64.URLEncoding.EncodeToString([]byte("?"+ph2)) + " HTTP/1.1\r\nHost: api.test\r\n\r\n",
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			g := h.connect(t, "api.test", nil)
			resp, body := g.do(t, raw)
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("status %d: %s", resp.StatusCode, body)
			}
			if err := <-g.serve; !errors.Is(err, ErrRefused) {
				t.Errorf("Serve: %v, want ErrRefused", err)
			}
			g.serve <- nil
			if got := h.seen(); len(got) != 0 {
				t.Errorf("upstream saw %+v", got)
			}
			evs := h.audit()
			if len(evs) != 1 || evs[0].Action != ActionBlock || !slices.Equal(evs[0].Secrets, []string{"OTHER"}) || evs[0].Host != "api.test" {
				t.Errorf("events = %+v", evs)
			}
		})
	}
}

func TestInterceptSecretOnlyForItsHosts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.connect(t, "a.wild.test", nil)
	resp, body := g.do(t, "GET /echo HTTP/1.1\r\nHost: a.wild.test\r\nAuthorization: Bearer "+ph2+"\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := h.seen(); len(got) != 1 || got[0].header.Get("Authorization") != "Bearer "+otherValue || got[0].host != "a.wild.test" {
		t.Fatalf("upstream saw %+v", got)
	}
	resp, body = g.do(t, "GET /echo HTTP/1.1\r\nHost: a.wild.test\r\nAuthorization: Bearer "+ph1+"\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("API_KEY placeholder to a.wild.test: status %d: %s", resp.StatusCode, body)
	}
	if got := h.seen(); len(got) != 1 {
		t.Errorf("upstream saw %d requests", len(got))
	}
}

func TestInterceptRefusesRequests(t *testing.T) {
	t.Parallel()
	const host = "Host: api.test\r\n"
	tests := map[string]struct {
		raw    string
		status int
	}{
		"host mismatch":          {"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", 421},
		"host bad port":          {"GET / HTTP/1.1\r\nHost: api.test:99999\r\n\r\n", 421},
		"host userinfo":          {"GET / HTTP/1.1\r\nHost: x@api.test\r\n\r\n", 421},
		"absolute other host":    {"GET https://other.test/ HTTP/1.1\r\n" + host + "\r\n", 421},
		"absolute http":          {"GET http://api.test/ HTTP/1.1\r\n" + host + "\r\n", 421},
		"no host":                {"GET / HTTP/1.1\r\n\r\n", 400},
		"two hosts":              {"GET / HTTP/1.1\r\n" + host + host + "\r\n", 400},
		"cl and te":              {"POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		"duplicate cl":           {"POST / HTTP/1.1\r\n" + host + "Content-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400},
		"cl list":                {"POST / HTTP/1.1\r\n" + host + "Content-Length: 1, 1\r\n\r\nx", 400},
		"cl sign":                {"POST / HTTP/1.1\r\n" + host + "Content-Length: +1\r\n\r\nx", 400},
		"te gzip":                {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
		"te twice":               {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		"obs-fold":               {"GET / HTTP/1.1\r\n" + host + "X-A: 1\r\n 2\r\n\r\n", 400},
		"bare lf":                {"GET / HTTP/1.1\n" + host + "\r\n", 400},
		"bare lf header":         {"GET / HTTP/1.1\r\n" + host + "X-A: 1\nX-B: 2\r\n\r\n", 400},
		"bare cr":                {"GET / HTTP/1.1\r\n" + host + "X-A: 1\r2\r\n\r\n", 400},
		"space before colon":     {"GET / HTTP/1.1\r\n" + host + "Content-Length : 1\r\n\r\nx", 400},
		"control char":           {"GET / HTTP/1.1\r\n" + host + "X-A: a\x01b\r\n\r\n", 400},
		"upgrade":                {"GET / HTTP/1.1\r\n" + host + "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 501},
		"connection upgrade":     {"GET / HTTP/1.1\r\n" + host + "Connection: keep-alive, upgrade\r\n\r\n", 501},
		"h2c":                    {"GET / HTTP/1.1\r\n" + host + "HTTP2-Settings: AAA\r\n\r\n", 501},
		"connect":                {"CONNECT api.test:443 HTTP/1.1\r\n" + host + "\r\n", 405},
		"http2 preface":          {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505},
		"http/1.0":               {"GET / HTTP/1.0\r\n" + host + "\r\n", 505},
		"trailer":                {"POST / HTTP/1.1\r\n" + host + "Trailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: 1\r\n\r\n", 501},
		"expect other":           {"GET / HTTP/1.1\r\n" + host + "Expect: fancy\r\n\r\n", 417},
		"double space":           {"GET  / HTTP/1.1\r\n" + host + "\r\n", 400},
		"head too large":         {"GET / HTTP/1.1\r\n" + host + "X-Big: " + strings.Repeat("a", DefaultMaxHeaderBytes) + "\r\n\r\n", 431},
		"malformed chunked body": {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 502},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			g := h.connect(t, "api.test", nil)
			resp, body := g.do(t, tt.raw)
			if resp.StatusCode != tt.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tt.status, body)
			}
			if !resp.Close {
				t.Error("a refusal did not close the connection")
			}
			if got := h.seen(); len(got) != 0 {
				t.Errorf("upstream saw %+v", got)
			}
			if evs := h.audit(); len(evs) != 1 || evs[0].Reason == "" {
				t.Errorf("events = %+v", evs)
			}
		})
	}
}

func TestInterceptHandshakeRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, sni string
		check     func(string) error
		badRoots  bool
		action    string
	}{
		{"check sni", "api.test", func(string) error { return errors.New("pinned address mismatch") }, false, ActionBlock},
		{"no secret for host", "unbound.test", nil, false, ActionBlock},
		{"wildcard apex", "wild.test", nil, false, ActionBlock},
		{"upstream unverified", "api.test", nil, true, ActionError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if tt.badRoots {
				h.ic.RootCAs = x509.NewCertPool()
			}
			var checked []string
			check := tt.check
			if check != nil {
				check = func(s string) error { checked = append(checked, s); return tt.check(s) }
			}
			g := h.connect(t, tt.sni, check)
			if err := g.Handshake(); err == nil {
				t.Fatal("handshake succeeded")
			}
			if err := <-g.serve; err == nil {
				t.Error("Serve returned nil")
			}
			g.serve <- nil
			if tt.check != nil && !slices.Equal(checked, []string{tt.sni}) {
				t.Errorf("CheckSNI saw %q", checked)
			}
			if got := h.seen(); len(got) != 0 {
				t.Errorf("upstream saw %+v", got)
			}
			evs := h.audit()
			if len(evs) != 1 || evs[0].Action != tt.action || evs[0].Host != tt.sni {
				t.Fatalf("events = %+v", evs)
			}
			// A failed handshake says how long each part took.
			if tt.action == ActionError && !regexp.MustCompile(`^tls handshake: .* \(after [0-9.]+m?s; the ClientHello at [0-9.µ]+m?s, the upstream's handshake [0-9.µ]+m?s\)$`).MatchString(evs[0].Reason) {
				t.Errorf("reason %q lacks the handshake's timings", evs[0].Reason)
			}
		})
	}
}

func TestInterceptPlaintextAndNoSNI(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	g := h.connect(t, "api.test", nil)
	if _, err := io.WriteString(g.NetConn(), "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := <-g.serve; err == nil {
		t.Error("Serve accepted plain HTTP")
	}
	g.serve <- nil

	g = h.connect(t, "", nil)
	g.Conn = tls.Client(g.NetConn(), &tls.Config{InsecureSkipVerify: true})
	if err := g.Handshake(); err == nil {
		t.Error("handshake without SNI succeeded")
	}
	if got := h.seen(); len(got) != 0 {
		t.Errorf("upstream saw %+v", got)
	}
}

func TestInterceptConfigErrors(t *testing.T) {
	t.Parallel()
	ca, err := NewCA([]string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []Binding{
		{Name: "A", Hosts: []string{"api.test"}, Placeholder: "airlock-secret-XYZ", Value: "value-A-42"},
		{Name: "B", Hosts: []string{"api.test"}, Placeholder: ph1, Value: ""},
		{Name: "C", Hosts: []string{"api.test"}, Placeholder: ph1, Value: "line\r\nX-Evil: 1"},
		{Name: "D", Hosts: []string{"bad host"}, Placeholder: ph1, Value: "value-D-42"},
	} {
		a, c := net.Pipe()
		u, d := net.Pipe()
		ic := &Interceptor{CA: ca, Secrets: []Binding{b}}
		err := ic.Serve(t.Context(), Flow{Guest: a, Upstream: u})
		if err == nil || !strings.Contains(err.Error(), "secret "+b.Name) || (b.Value != "" && strings.Contains(err.Error(), b.Value)) {
			t.Errorf("binding %s: err = %v", b.Name, err)
		}
		c.Close()
		d.Close()
	}
}
