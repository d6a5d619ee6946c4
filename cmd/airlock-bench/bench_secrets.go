package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/secrets"
)

// secretsBenchHost is the name the secret interceptor rows' upstream
// serves; the placeholder is what a guest would hold.
const (
	secretsBenchHost = "api.bench"
	secretsBenchPH   = "airlock-secret-0123456789abcdef0123456789abcdef"
	secretsBenchConc = 16
)

// secretsBench measures requests through the secret interceptor on the
// host alone, without a sandbox: a client on loopback, Interceptor.Serve
// (the code the shim runs for a flow to a secret's host: TLS termination,
// checks, injection of a placeholder in Authorization, response scrub),
// and a loopback TLS upstream answering "ok" that speaks h2 and http/1.1.
// HTTP/1.1 and HTTP/2 are measured in the same run, alternating, best of
// runs: n sequential requests on one connection, and n requests from
// secretsBenchConc concurrent clients (HTTP/1.1: a connection each, as
// clients do; HTTP/2: streams of one connection).
func secretsBench(ctx context.Context, n, runs int) ([][3]string, error) {
	upCA, err := secrets.NewCA([]string{secretsBenchHost})
	if err != nil {
		return nil, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(hi.ServerName) },
		NextProtos:     []string{"h2", "http/1.1"},
	})
	if err != nil {
		return nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: time.Minute, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer bench-secret-value" {
			http.Error(w, "no value", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	var served sync.WaitGroup
	served.Go(func() { _ = srv.Serve(ln) })
	defer served.Wait()
	defer srv.Close()

	ca, err := secrets.NewCA([]string{secretsBenchHost})
	if err != nil {
		return nil, err
	}
	upRoots := x509.NewCertPool()
	upRoots.AppendCertsFromPEM(upCA.CertPEM())
	guestRoots := x509.NewCertPool()
	guestRoots.AppendCertsFromPEM(ca.CertPEM())
	ic := &secrets.Interceptor{
		CA:      ca,
		Secrets: []secrets.Binding{{Name: "API_KEY", Hosts: []string{secretsBenchHost}, Placeholder: secretsBenchPH, Value: "bench-secret-value"}},
		RootCAs: upRoots,
	}
	through := &icBench{ic: ic, upstream: ln.Addr().String(), roots: guestRoots, auth: "Bearer " + secretsBenchPH}
	direct := &icBench{upstream: ln.Addr().String(), roots: upRoots, auth: "Bearer bench-secret-value"}
	defer through.wait()

	// best[proto][through?][concurrent?]
	best := map[string]*[2][2]time.Duration{"http/1.1": {}, "h2": {}}
	for range runs {
		for _, proto := range []string{"http/1.1", "h2"} {
			for i, b := range []*icBench{direct, through} {
				for j, conc := range []int{1, secretsBenchConc} {
					if err := ctx.Err(); err != nil {
						return nil, err
					}
					d, err := b.run(ctx, proto, n, conc)
					if err != nil {
						return nil, fmt.Errorf("%s, %d clients: %w", proto, conc, err)
					}
					if r := &best[proto][i][j]; *r == 0 || d < *r {
						*r = d
					}
				}
			}
		}
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	h1, h2 := best["http/1.1"], best["h2"]
	note := fmt.Sprintf("host only (Interceptor.Serve on loopback, no sandbox; the same clients straight to the upstream for the difference), %d requests, best of %d; the value injected into Authorization", n, runs)
	row := func(what string, p *[2][2]time.Duration, j int, ratio string) [3]string {
		return [3]string{what, fmt.Sprintf("%.0f µs/request (+%.0f µs over direct)%s", us(p[1][j]), us(p[1][j])-us(p[0][j]), ratio), note}
	}
	ratio := func(j int) string {
		return fmt.Sprintf("; HTTP/2 through it %.2fx HTTP/1.1, its own cost %.2fx", us(h2[1][j])/us(h1[1][j]), (us(h2[1][j])-us(h2[0][j]))/(us(h1[1][j])-us(h1[0][j])))
	}
	return [][3]string{
		row("secret interceptor, HTTP/1.1, one connection", h1, 0, ""),
		row("secret interceptor, HTTP/2, one connection", h2, 0, ratio(0)),
		row(fmt.Sprintf("secret interceptor, HTTP/1.1, %d clients (a connection each)", secretsBenchConc), h1, 1, ""),
		row(fmt.Sprintf("secret interceptor, HTTP/2, %d clients (streams of one connection)", secretsBenchConc), h2, 1, ratio(1)),
	}, nil
}

// icBench drives an Interceptor the way the egress engine does: each
// client connection is one Serve call with its own upstream connection.
type icBench struct {
	ic       *secrets.Interceptor // nil: straight to the upstream
	upstream string
	roots    *x509.CertPool
	auth     string // the Authorization the client sends
	serving  sync.WaitGroup
}

func (b *icBench) wait() { b.serving.Wait() }

// benchClient sends one request at a time (HTTP/1.1) or many (HTTP/2).
type benchClient interface {
	do(ctx context.Context) error
	Close() error
}

// h1Client writes requests and reads responses on one TLS connection, as
// the unit tests' guests do (one goroutine at a time).
type h1Client struct {
	c    *tls.Conn
	br   *bufio.Reader
	auth string
}

func (h *h1Client) Close() error { return h.c.Close() }

func (h *h1Client) do(context.Context) error {
	if _, err := io.WriteString(h.c, "GET /v1/models HTTP/1.1\r\nHost: "+secretsBenchHost+"\r\nAuthorization: "+h.auth+"\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return err
	}
	return checkBenchResponse(resp)
}

// h2Client sends requests as streams of one HTTP/2 connection.
type h2Client struct {
	cc   *http.ClientConn
	auth string
}

func (h *h2Client) Close() error { return h.cc.Close() }

func (h *h2Client) do(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+secretsBenchHost+"/v1/models", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", h.auth)
	resp, err := h.cc.RoundTrip(req)
	if err != nil {
		return err
	}
	return checkBenchResponse(resp)
}

func checkBenchResponse(resp *http.Response) error {
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != "ok" {
		return fmt.Errorf("status %d: %q", resp.StatusCode, body)
	}
	return nil
}

// dial opens one intercepted connection speaking proto ("http/1.1" or
// "h2") and returns a client over it.
func (b *icBench) dial(ctx context.Context, proto string) (benchClient, error) {
	guest, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	c := tls.Client(guest, &tls.Config{ServerName: secretsBenchHost, RootCAs: b.roots, NextProtos: []string{proto}})
	if err := c.HandshakeContext(ctx); err != nil {
		guest.Close()
		return nil, err
	}
	if got := c.ConnectionState().NegotiatedProtocol; got != proto {
		guest.Close()
		return nil, fmt.Errorf("negotiated %q, want %q", got, proto)
	}
	if proto != "h2" {
		return &h1Client{c: c, br: bufio.NewReader(c), auth: b.auth}, nil
	}
	var p http.Protocols
	p.SetHTTP2(true)
	tr := &http.Transport{
		Protocols:          &p,
		DisableCompression: true,
		DialTLSContext:     func(context.Context, string, string) (net.Conn, error) { return c, nil },
	}
	cc, err := tr.NewClientConn(ctx, "https", secretsBenchHost+":443")
	if err != nil {
		guest.Close()
		return nil, err
	}
	return &h2Client{cc: cc, auth: b.auth}, nil
}

// connect returns the client's TCP connection: to an intercepted flow (a
// Serve call with its own upstream connection), or straight to the
// upstream.
func (b *icBench) connect(ctx context.Context) (net.Conn, error) {
	if b.ic == nil {
		return net.Dial("tcp", b.upstream)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	guest, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	inner, err := ln.Accept()
	if err != nil {
		guest.Close()
		return nil, err
	}
	up, err := net.Dial("tcp", b.upstream)
	if err != nil {
		guest.Close()
		inner.Close()
		return nil, err
	}
	b.serving.Go(func() {
		if err := b.ic.Serve(context.WithoutCancel(ctx), secrets.Flow{Guest: inner, Upstream: up}); err != nil {
			fmt.Fprintln(os.Stderr, "bench: interceptor:", err)
		}
	})
	return guest, nil
}

// run sends n requests from conc clients and returns the wall time. The
// connections are opened before the clock starts.
func (b *icBench) run(ctx context.Context, proto string, n, conc int) (time.Duration, error) {
	conns := 1
	if proto != "h2" {
		conns = conc
	}
	var ccs []benchClient
	defer func() {
		for _, cc := range ccs {
			cc.Close()
		}
	}()
	for range conns {
		cc, err := b.dial(ctx, proto)
		if err != nil {
			return 0, err
		}
		ccs = append(ccs, cc)
	}
	start := time.Now()
	errs := make([]error, conc)
	var wg sync.WaitGroup
	for i := range conc {
		cc := ccs[i%len(ccs)]
		wg.Go(func() {
			for range n / conc {
				if err := cc.do(ctx); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start) * time.Duration(n) / time.Duration(n/conc*conc), errors.Join(errs...)
}
