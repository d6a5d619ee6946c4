package egress

import (
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// holdServer accepts connections and keeps them open, echoing what it
// reads, until the test ends.
func holdServer(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// openConn dials dst from the guest and checks one echo round trip; the
// connection stays open.
func (e *env) openConn(t *testing.T, dst netip.AddrPort) net.Conn {
	t.Helper()
	c, err := e.guest.DialTCP(t.Context(), dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo through %s: %q %v", dst, b, err)
	}
	return c
}

// closedByGuest reports whether the guest's end of c sees the flow end.
func closedByGuest(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func (e *env) policyCloses() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		if ev.Action == "net.deny" && strings.HasPrefix(str(ev.Detail["reason"]), "closed by a policy change: ") {
			out = append(out, str(ev.Detail["dst"]))
		}
	}
	return out
}

func TestSetPolicyOpensAndClosesADomain(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec netconf.Spec
	}{
		{"plain copy", netconf.Spec{Mode: "deny"}},
		{"engine flow", netconf.Spec{Mode: "deny", RateBytes: 64 << 20}}, // shaped: the engine's tcpFlow
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := holdServer(t)
			e := newEnv(t, tc.spec, nil, nil)
			gw := netip.AddrPortFrom(netconf.GatewayIP, 53)
			dst := netip.AddrPortFrom(pubA, port)

			// Deny without rules: the name does not resolve, the address is refused.
			if rc, _ := e.resolve(t, gw, "a.test"); rc != mdns.RcodeNameError {
				t.Fatalf("a.test before the rule: rcode %d, want NXDOMAIN", rc)
			}
			if _, err := e.roundTrip(t, dst, "x"); err == nil {
				t.Fatal("a.test's address reachable before the rule")
			}

			// The rule added: resolving and connecting work at once.
			if n, err := e.eng.SetPolicy("deny", []string{"a.test"}); err != nil || n != 0 {
				t.Fatalf("SetPolicy: closed %d, %v", n, err)
			}
			if rc, ips := e.resolve(t, gw, "a.test"); rc != mdns.RcodeSuccess || len(ips) != 1 || ips[0] != pubA {
				t.Fatalf("a.test after the rule: rcode %d %v", rc, ips)
			}
			c := e.openConn(t, dst)
			if n := e.eng.openFlows(); n != 1 {
				t.Fatalf("%d open flows, want 1", n)
			}

			// The rule removed: the live connection is closed and recorded.
			n, err := e.eng.SetPolicy("deny", nil)
			if err != nil || n != 1 {
				t.Fatalf("SetPolicy: closed %d, %v; want 1", n, err)
			}
			if !closedByGuest(c) {
				t.Fatal("the connection the new policy forbids is still open")
			}
			if got := e.policyCloses(); !slices.Equal(got, []string{dst.String()}) {
				t.Fatalf("policy-change denials %v, want [%s]", got, dst)
			}
			if !testutil.WaitFor(t, 5*time.Second, func() bool { return e.eng.openFlows() == 0 }) {
				t.Fatalf("%d flows still tracked after the close", e.eng.openFlows())
			}
			if _, err := e.roundTrip(t, dst, "x"); err == nil {
				t.Fatal("a.test's address reachable after the rule was removed")
			}
			if rc, _ := e.resolve(t, gw, "a.test"); rc != mdns.RcodeNameError {
				t.Fatalf("a.test after removal: rcode %d, want NXDOMAIN", rc)
			}
		})
	}
}

func TestSetPolicyKeepsWhatTheNewPolicyAllows(t *testing.T) {
	port := holdServer(t)
	e := newEnv(t, netconf.Spec{}, nil, nil)
	a := e.openConn(t, netip.AddrPortFrom(pubA, port))
	b := e.openConn(t, netip.AddrPortFrom(pubB, port))
	n, err := e.eng.SetPolicy("deny", []string{pubA.String()})
	if err != nil || n != 1 {
		t.Fatalf("SetPolicy: closed %d, %v; want 1", n, err)
	}
	if !closedByGuest(b) {
		t.Fatal("the flow to b, which the new policy denies, is open")
	}
	// a still works.
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(a, "more"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(a, buf); err != nil || string(buf) != "more" {
		t.Fatalf("allowed flow after the change: %q %v", buf, err)
	}
	if got := e.policyCloses(); !slices.Equal(got, []string{netip.AddrPortFrom(pubB, port).String()}) {
		t.Fatalf("policy-change denials %v", got)
	}
}

func TestSetPolicyClosesUDPFlows(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	port := uint16(pc.LocalAddr().(*net.UDPAddr).Port)
	e := newEnv(t, netconf.Spec{}, nil, nil)
	dst := netip.AddrPortFrom(pubA, port)
	c, err := e.guest.DialUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("dgram")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "dgram" {
		t.Fatalf("udp echo: %q %v", buf[:n], err)
	}
	if n, err := e.eng.SetPolicy("deny", nil); err != nil || n != 1 {
		t.Fatalf("SetPolicy: closed %d, %v; want 1", n, err)
	}
	if !testutil.WaitFor(t, 5*time.Second, func() bool { return e.eng.openFlows() == 0 }) {
		t.Fatalf("%d flows still tracked after the close", e.eng.openFlows())
	}
	if got := e.policyCloses(); !slices.Equal(got, []string{dst.String()}) {
		t.Fatalf("policy-change denials %v", got)
	}
}

func TestSetPolicyRejectsBadRulesAndChangesNothing(t *testing.T) {
	port := holdServer(t)
	e := newEnv(t, netconf.Spec{}, nil, nil)
	c := e.openConn(t, netip.AddrPortFrom(pubA, port))
	if _, err := e.eng.SetPolicy("deny", []string{"*.com"}); err == nil {
		t.Fatal("a wildcard on a public suffix was accepted")
	}
	if _, err := e.eng.SetPolicy("sideways", nil); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "more"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
		t.Fatalf("flow after a refused change: %v", err)
	}
	if got, err := e.roundTrip(t, netip.AddrPortFrom(pubB, port), "x"); err != nil {
		t.Fatalf("public mode after a refused change: %q %v", got, err)
	}
}

// TestSetPolicyDomainRuleAndSNI: a connection opened in public mode (its
// bytes copied blindly, its SNI never read) that the new policy allows
// only by a domain rule cannot be checked and is closed (sni:unchecked);
// one opened under that domain rule (its first bytes read) stays when an
// unrelated rule is added.
func TestSetPolicyDomainRuleAndSNI(t *testing.T) {
	port := holdServer(t)
	e := newEnv(t, netconf.Spec{}, nil, nil)
	gw := netip.AddrPortFrom(netconf.GatewayIP, 53)
	dst := netip.AddrPortFrom(pubA, port)
	if rc, _ := e.resolve(t, gw, "a.test"); rc != mdns.RcodeSuccess {
		t.Fatalf("a.test rcode %d", rc)
	}
	blind := e.openConn(t, dst)
	if n, err := e.eng.SetPolicy("deny", []string{"a.test"}); err != nil || n != 1 {
		t.Fatalf("SetPolicy: closed %d, %v; want the unchecked connection", n, err)
	}
	if !closedByGuest(blind) {
		t.Fatal("a connection whose SNI was never read is open under a domain rule")
	}
	if !slices.ContainsFunc(e.actions(), func(s string) bool { return s == "net.deny "+dst.String()+" sni:unchecked" }) {
		t.Fatalf("no sni:unchecked denial in %v", e.actions())
	}

	checked := e.openConn(t, dst) // opened under the domain rule: inspected
	if n, err := e.eng.SetPolicy("deny", []string{"a.test", "b.test"}); err != nil || n != 0 {
		t.Fatalf("adding a rule: closed %d, %v; want 0", n, err)
	}
	_ = checked.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(checked, "more"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(checked, make([]byte, 4)); err != nil {
		t.Fatalf("the checked connection after a rule was added: %v", err)
	}
}
