package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// A secret's header scope (netconf.Secret.Header) reaches the interceptor:
// the value goes into that header, and the placeholder in another header is
// refused before the upstream sees the request.
func TestSecretHeaderScope(t *testing.T) {
	const value = "real-scoped-value-456"
	port, pool, seen := upstreamTLS(t, "api.test")
	spec := netconf.Spec{Secrets: []netconf.Secret{{Name: "API_KEY", Hosts: []string{"api.test"}, Header: "authorization"}}}
	e := newEnv(t, spec, netconf.Values{"API_KEY": value}, func(c *Config) { c.UpstreamRoots = pool })
	ph := e.eng.cfg.Spec.Secrets[0].Placeholder
	if _, ips := e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "api.test"); len(ips) != 1 || ips[0] != pubC {
		t.Fatalf("api.test resolved to %v", ips)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.eng.CACertPEM())
	do := func(header string) int {
		t.Helper()
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
		req.Header.Set(header, "Bearer "+ph)
		if err := req.Write(c); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode
	}
	if code := do("Authorization"); code != 200 {
		t.Fatalf("in its header: status %d", code)
	}
	if got := seen(); len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw %q", got)
	}
	if code := do("X-Other"); code != http.StatusForbidden {
		t.Errorf("in another header: status %d, want 403", code)
	}
	if got := seen(); len(got) != 1 {
		t.Errorf("the refused request reached the upstream: %q", got)
	}
}
