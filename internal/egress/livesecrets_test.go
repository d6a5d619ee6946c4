package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// httpsGet sends one GET with Authorization auth from the guest to
// api.test at dst, trusting the engine's current CA, and reports whether
// the request got an answer.
func (e *env) httpsGet(t *testing.T, dst netip.AddrPort, auth string) error {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.eng.CACertPEM())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	raw, err := e.guest.DialTCP(ctx, dst)
	if err != nil {
		return err
	}
	c := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: roots})
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest("GET", "https://api.test/v1", nil)
	req.Header.Set("Authorization", auth)
	if err := req.Write(c); err != nil {
		return err
	}
	res, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	return nil
}

// TestSetSecretsAddsAndRemovesLive: a sandbox without secrets gets one
// live (a CA appears, the next request to its host is injected); the
// secret removed, no request is injected any more and the CA goes; the
// values are in no event.
func TestSetSecretsAddsAndRemovesLive(t *testing.T) {
	const value = "live-secret-value-8c1d"
	port, pool, seen := upstreamTLS(t, "api.test")
	e := newEnv(t, netconf.Spec{}, nil, func(c *Config) { c.UpstreamRoots = pool })
	if e.eng.CACertPEM() != nil {
		t.Fatal("a CA without secrets")
	}
	e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "api.test")
	dst := netip.AddrPortFrom(pubC, port)

	n, err := netconf.Spec{Secrets: []netconf.Secret{{Name: "API_KEY", Hosts: []string{"api.test"}}}}.Normalize(netconf.Values{"API_KEY": value})
	if err != nil {
		t.Fatal(err)
	}
	ph := n.Secrets[0].Placeholder
	ch, err := e.eng.SetSecrets(n.Secrets, netconf.Values{"API_KEY": value})
	if err != nil || !ch.CAChanged {
		t.Fatalf("SetSecrets: %+v %v", ch, err)
	}
	if err := e.httpsGet(t, dst, "Bearer "+ph); err != nil {
		t.Fatal(err)
	}
	if got := seen(); len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw %q, want the value injected", got)
	}

	// The same hosts again: the CA stays (the guest need not learn it).
	if ch, err := e.eng.SetSecrets(n.Secrets, netconf.Values{"API_KEY": value}); err != nil || ch.CAChanged {
		t.Fatalf("same hosts: %+v %v", ch, err)
	}
	// A secret without its value is refused and changes nothing.
	if _, err := e.eng.SetSecrets(append(slices.Clone(n.Secrets), netconf.Secret{Name: "B", Hosts: []string{"b.test"}, Placeholder: netconf.NewPlaceholder()}), netconf.Values{"API_KEY": value}); err == nil {
		t.Fatal("a secret without a value was taken")
	}

	// Removed: the placeholder goes through as it is.
	ch, err = e.eng.SetSecrets(nil, nil)
	if err != nil || !ch.CAChanged || e.eng.CACertPEM() != nil {
		t.Fatalf("remove: %+v %v", ch, err)
	}
	// The guest trusts no interception CA now: the real certificate
	// answers, which the guest's client checks against the upstream's CA.
	raw, err := e.guest.DialTCP(t.Context(), dst)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: pool})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest("GET", "https://api.test/v1", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	if err := req.Write(c); err != nil {
		t.Fatalf("after removal: %v", err)
	}
	if _, err := http.ReadResponse(bufio.NewReader(c), req); err != nil {
		t.Fatalf("after removal: %v", err)
	}
	c.Close()
	if got := seen(); len(got) != 2 || got[1] != "Bearer "+ph {
		t.Fatalf("upstream saw %q after removal, want the placeholder as sent", got)
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

// TestSetSecretsClosesInjectedConnections: a keep-alive connection that
// was injected with a secret is closed when the secrets change, so a
// removed secret is injected into no later request on it.
func TestSetSecretsClosesInjectedConnections(t *testing.T) {
	const value = "live-secret-value-44aa"
	port, pool, _ := upstreamTLS(t, "api.test")
	spec := netconf.Spec{Secrets: []netconf.Secret{{Name: "API_KEY", Hosts: []string{"api.test"}}}}
	e := newEnv(t, spec, netconf.Values{"API_KEY": value}, func(c *Config) { c.UpstreamRoots = pool })
	e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "api.test")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.eng.CACertPEM())
	raw, err := e.guest.DialTCP(t.Context(), netip.AddrPortFrom(pubC, port))
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{ServerName: "api.test", RootCAs: roots})
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, _ := http.NewRequest("GET", "https://api.test/v1", nil)
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	ch, err := e.eng.SetSecrets(nil, nil)
	if err != nil || ch.Closed != 1 {
		t.Fatalf("SetSecrets: %+v %v; want 1 closed", ch, err)
	}
	_ = req.Write(c)
	if _, err := http.ReadResponse(br, req); err == nil {
		t.Fatal("the injected connection still serves requests after the secret was removed")
	}
}
