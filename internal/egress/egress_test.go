package egress

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/netstack/guesttest"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// Public-looking addresses the test dialer maps to 127.0.0.1 (no packet
// ever leaves the machine).
var (
	pubA = netip.MustParseAddr("93.184.215.10")
	pubB = netip.MustParseAddr("93.184.215.11")
	pubC = netip.MustParseAddr("93.184.215.12")
)

type env struct {
	eng   *Engine
	guest *guesttest.Guest
	dns   *testutil.DNSServer

	mu     sync.Mutex
	events []Event
	dials  []string
}

func newEnv(t *testing.T, spec netconf.Spec, vals netconf.Values, mut func(*Config)) *env {
	t.Helper()
	e := &env{dns: testutil.StartDNS(t, map[string][]string{
		"a.test":      {pubA.String()},
		"b.test":      {pubB.String()},
		"api.test":    {pubC.String()},
		"meta.test":   {"169.254.169.254"},
		"rebind.test": {pubA.String(), "127.0.0.1"},
	})}
	spec, err := spec.Normalize(vals)
	if err != nil {
		t.Fatal(err)
	}
	var d net.Dialer
	cfg := Config{
		Spec:        spec,
		Secrets:     vals,
		DNSUpstream: []string{e.dns.Addr},
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			e.mu.Lock()
			e.dials = append(e.dials, network+" "+address)
			e.mu.Unlock()
			ap := netip.MustParseAddrPort(address)
			if slices.Contains([]netip.Addr{pubA, pubB, pubC}, ap.Addr()) {
				address = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port()).String()
			}
			return d.DialContext(ctx, network, address)
		},
		Audit: func(ev Event) {
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		},
		HostAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.99")},
	}
	if mut != nil {
		mut(&cfg)
	}
	e.eng, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "link")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	host, gl := conn(fds[0]), conn(fds[1])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.eng.ServeLink(ctx, host) }()
	e.guest, err = guesttest.Start(gl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		e.guest.Close()
		_ = e.eng.Close()
		host.Close()
		<-done
	})
	return e
}

func (e *env) actions() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		out = append(out, ev.Action+" "+str(ev.Detail["dst"])+" "+str(ev.Detail["rule"]))
	}
	return out
}

func (e *env) dialed() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.dials)
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// resolve asks the engine's DNS server (at server, over UDP) for name's A
// records from the guest.
func (e *env) resolve(t *testing.T, server netip.AddrPort, name string) (int, []netip.Addr) {
	t.Helper()
	c, err := e.guest.DialUDP(server)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), mdns.TypeA)
	dc := &mdns.Conn{Conn: c}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := dc.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	r, err := dc.ReadMsg()
	if err != nil {
		t.Fatalf("dns %s: %v", name, err)
	}
	var ips []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*mdns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A)
			ips = append(ips, ip.Unmap())
		}
	}
	return r.Rcode, ips
}

// echoServer answers "got:" + what it read after the client half-closes.
func echoServer(t *testing.T) (uint16, func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	n := 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			n++
			mu.Unlock()
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write(append([]byte("got:"), b...))
			}()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func (e *env) roundTrip(t *testing.T, dst netip.AddrPort, msg string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := e.guest.DialTCP(ctx, dst)
	if err != nil {
		return "", err
	}
	defer c.Close()
	// A hang guard, not a bound: TestRateLimit's round trip takes 4 s at
	// its nominal rate, more under -race on a loaded machine.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	_ = c.(interface{ CloseWrite() error }).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestPublicModeAllowsPublicAndDeniesTheFloor(t *testing.T) {
	port, accepted := echoServer(t)
	e := newEnv(t, netconf.Spec{}, nil, nil)
	got, err := e.roundTrip(t, netip.AddrPortFrom(pubA, port), "hi")
	if err != nil || got != "got:hi" {
		t.Fatalf("public: %q, %v", got, err)
	}
	// (Loopback, 0.0.0.0, broadcast and multicast never leave a guest
	// stack as TCP; policy tests cover them, the e2e tests a real guest.)
	for _, a := range []string{"10.0.2.2", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254", "192.0.2.99", "198.18.0.1", "240.0.0.1"} {
		start := time.Now()
		_, err := e.roundTrip(t, netip.AddrPortFrom(netip.MustParseAddr(a), port), "x")
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: err %v, want connection refused", a, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: refusal took %v", a, d)
		}
	}
	if n := accepted(); n != 1 {
		t.Fatalf("listener accepted %d connections, want 1", n)
	}
	if d := e.dialed(); len(d) != 1 {
		t.Fatalf("dialed %v, want only the public one", d)
	}
	acts := e.actions()
	if !slices.ContainsFunc(acts, func(s string) bool {
		return strings.HasPrefix(s, "net.deny 169.254.169.254:") && strings.HasSuffix(s, "floor:metadata")
	}) {
		t.Fatalf("no metadata denial in %v", acts)
	}
	if !slices.ContainsFunc(acts, func(s string) bool { return strings.HasPrefix(s, "net.allow 93.184.215.10:") }) {
		t.Fatalf("no allow event in %v", acts)
	}
}

func TestDenyModeDomainRules(t *testing.T) {
	port, accepted := echoServer(t)
	e := newEnv(t, netconf.Spec{Mode: "deny", Allow: []string{"a.test", "rebind.test"}}, nil, nil)
	gw := netip.AddrPortFrom(netconf.GatewayIP, 53)

	// A raw connect to a.test's address before resolving it is refused.
	if _, err := e.roundTrip(t, netip.AddrPortFrom(pubA, port), "x"); err == nil {
		t.Fatal("raw connect to an unresolved address of an allowed name succeeded")
	}
	if rc, ips := e.resolve(t, gw, "a.test"); rc != mdns.RcodeSuccess || len(ips) != 1 || ips[0] != pubA {
		t.Fatalf("a.test: rcode %d %v", rc, ips)
	}
	if got, err := e.roundTrip(t, netip.AddrPortFrom(pubA, port), "hi"); err != nil || got != "got:hi" {
		t.Fatalf("a.test after resolving: %q %v", got, err)
	}
	// b.test is not resolved at all (never forwarded), and its address is refused.
	if rc, _ := e.resolve(t, gw, "b.test"); rc != mdns.RcodeNameError {
		t.Fatalf("b.test rcode %d, want NXDOMAIN", rc)
	}
	if e.dns.Queries("b.test") != 0 {
		t.Fatal("b.test was forwarded upstream")
	}
	if _, err := e.roundTrip(t, netip.AddrPortFrom(pubB, port), "x"); err == nil {
		t.Fatal("b.test's address reachable")
	}
	// DNS to any address on port 53 is intercepted: 8.8.8.8 answers from the shim.
	if rc, ips := e.resolve(t, netip.MustParseAddrPort("8.8.8.8:53"), "a.test"); rc != mdns.RcodeSuccess || len(ips) != 1 {
		t.Fatalf("8.8.8.8: rcode %d %v", rc, ips)
	}
	if slices.ContainsFunc(e.dialed(), func(s string) bool { return strings.Contains(s, ":53") }) {
		t.Fatalf("a DNS flow was dialled out: %v", e.dialed())
	}
	// Rebinding: first public (pinned), then loopback -> NXDOMAIN.
	if rc, _ := e.resolve(t, gw, "rebind.test"); rc != mdns.RcodeSuccess {
		t.Fatalf("rebind.test first answer rcode %d", rc)
	}
	if rc, _ := e.resolve(t, gw, "rebind.test"); rc != mdns.RcodeNameError {
		t.Fatalf("rebind.test second answer rcode %d, want NXDOMAIN", rc)
	}
	if _, err := e.roundTrip(t, netip.MustParseAddrPort("127.0.0.1:"+strconv.Itoa(int(port))), "x"); err == nil {
		t.Fatal("loopback reachable")
	}
	if n := accepted(); n != 1 {
		t.Fatalf("listener accepted %d, want 1 (a.test only)", n)
	}
}

func TestMetadataByName(t *testing.T) {
	e := newEnv(t, netconf.Spec{}, nil, nil)
	if rc, _ := e.resolve(t, netip.AddrPortFrom(netconf.GatewayIP, 53), "meta.test"); rc != mdns.RcodeNameError {
		t.Fatalf("meta.test rcode %d, want NXDOMAIN", rc)
	}
}

func TestDialGuest(t *testing.T) {
	e := newEnv(t, netconf.Spec{}, nil, nil)
	ln, err := e.guest.ListenTCP(8000)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.WriteString(c, "hello from guest")
			c.Close()
		}
	}()
	c, err := e.eng.DialGuest(t.Context(), 8000)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if b, _ := io.ReadAll(c); string(b) != "hello from guest" {
		t.Fatalf("got %q", b)
	}
}

func TestRateLimit(t *testing.T) {
	port, _ := echoServer(t)
	e := newEnv(t, netconf.Spec{RateBytes: 256 << 10}, nil, nil)
	msg := strings.Repeat("x", 768<<10)
	start := time.Now()
	got, err := e.roundTrip(t, netip.AddrPortFrom(pubA, port), msg)
	if err != nil || len(got) != len(msg)+4 {
		t.Fatalf("got %d bytes, %v", len(got), err)
	}
	// 768 KiB each way at 256 KiB/s with a 256 KiB burst: at least 2 s up.
	if d := time.Since(start); d < 1500*time.Millisecond {
		t.Fatalf("768 KiB at 256 KiB/s took only %v", d)
	}
}
