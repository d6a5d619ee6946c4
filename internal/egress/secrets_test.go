package egress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// upstreamTLS serves HTTPS for name on 127.0.0.1, recording Authorization
// headers, with a certificate from its own CA (returned as a pool).
func upstreamTLS(t *testing.T, name string) (uint16, *x509.CertPool, func() []string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caT := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caT, caT, &caKey.PublicKey, caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	lt := &x509.Certificate{SerialNumber: big.NewInt(2), DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, _ := x509.CreateCertificate(rand.Reader, lt, ca, &key.PublicKey, caKey)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return uint16(ln.Addr().(*net.TCPAddr).Port), pool, func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(seen) }
}

func TestSecretInjectedOnlyForItsHost(t *testing.T) {
	const value = "real-secret-value-123"
	port, pool, seen := upstreamTLS(t, "api.test")
	echo, _ := echoServer(t)
	spec := netconf.Spec{Secrets: []netconf.Secret{{Name: "API_KEY", Hosts: []string{"api.test"}}}}
	e := newEnv(t, spec, netconf.Values{"API_KEY": value}, func(c *Config) { c.UpstreamRoots = pool })
	ph := e.eng.cfg.Spec.Secrets[0].Placeholder
	if !netconf.ValidPlaceholder(ph) {
		t.Fatalf("placeholder %q", ph)
	}
	if _, ips := e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "api.test"); len(ips) != 1 || ips[0] != pubC {
		t.Fatalf("api.test resolved to %v", ips)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(e.eng.CACertPEM()) {
		t.Fatal("CACertPEM holds no certificate")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	raw, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(pubC, port))
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: roots})
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest("GET", "https://api.test/v1", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("response %d %q", res.StatusCode, body)
	}
	if got := seen(); len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw %q", got)
	}

	// The placeholder in plain bytes to another destination: the flow is
	// cut before it reaches the listener, and the block is audited.
	got, _ := e.roundTrip(t, netip.AddrPortFrom(pubA, echo), "GET / HTTP/1.1\r\nX-Key: "+ph+"\r\n\r\n")
	if strings.Contains(got, ph) {
		t.Fatalf("the echo server got the placeholder: %q", got)
	}
	acts := strings.Join(e.actions(), "\n")
	if !strings.Contains(acts, "net.secret.inject") || !strings.Contains(acts, "net.secret.block") {
		t.Fatalf("events:\n%s", acts)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.events {
		for _, v := range ev.Detail {
			if s, ok := v.(string); ok && strings.Contains(s, value) {
				t.Fatalf("event %s holds the secret value", ev.Action)
			}
		}
	}
}

func TestSNIMustMatchTheDomainRule(t *testing.T) {
	port, accepted := echoServer(t)
	e := newEnv(t, netconf.Spec{Mode: "deny", Allow: []string{"a.test"}}, nil, nil)
	e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "a.test")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	raw, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(pubA, port))
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{ServerName: "evil.test", InsecureSkipVerify: true})
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err == nil {
		t.Fatal("a TLS handshake with a mismatched SNI went through")
	}
	c.Close()
	if !testutil.WaitFor(t, 5*time.Second, func() bool {
		return slices.ContainsFunc(e.actions(), func(s string) bool { return strings.HasPrefix(s, "net.deny") && strings.HasSuffix(s, "sni:mismatch") })
	}) {
		t.Fatalf("no sni:mismatch denial in %v", e.actions())
	}
	// The upstream connection was dialled (before the hello existed) but
	// got no byte of it: the echo server answered nothing useful. Its
	// accept loop counts the connection in its own time.
	if !testutil.WaitFor(t, 5*time.Second, func() bool { return accepted() == 1 }) {
		t.Fatalf("accepted %d", accepted())
	}
}

// TestSlowClientHelloStillIntercepted: a guest that connects to a secret's
// host and sends its ClientHello only after firstByteWait (a loaded or
// emulated guest) still gets the interceptor, not the upstream's own TLS.
func TestSlowClientHelloStillIntercepted(t *testing.T) {
	const value = "real-secret-value-slow"
	port, pool, seen := upstreamTLS(t, "api.test")
	spec := netconf.Spec{Secrets: []netconf.Secret{{Name: "API_KEY", Hosts: []string{"api.test"}}}}
	e := newEnv(t, spec, netconf.Values{"API_KEY": value}, func(c *Config) { c.UpstreamRoots = pool })
	ph := e.eng.cfg.Spec.Secrets[0].Placeholder
	if _, ips := e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "api.test"); len(ips) != 1 || ips[0] != pubC {
		t.Fatalf("api.test resolved to %v", ips)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.eng.CACertPEM())
	raw, err := e.guest.DialTCP(t.Context(), netip.AddrPortFrom(pubC, port))
	if err != nil {
		t.Fatal(err)
	}
	// The stimulus: a client that says nothing for twice the wait that
	// lets a server-first protocol's greeting through.
	time.Sleep(2 * firstByteWait)
	c := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: roots})
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatalf("handshake with the interceptor after a slow start: %v", err)
	}
	req, _ := http.NewRequest("GET", "https://api.test/v1", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	if res, err := http.ReadResponse(bufio.NewReader(c), req); err != nil || res.StatusCode != 200 {
		t.Fatalf("response %v, %v", res, err)
	}
	if got := seen(); len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw %q", got)
	}
}
