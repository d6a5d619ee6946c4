package dns

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// upstream is a test resolver on 127.0.0.1 serving fixed zones.
type upstream struct {
	addr    string
	queries atomic.Int32
	zone    map[string][]mdns.RR // fqdn, lower case
	hold    chan struct{}        // "slow.test." waits on it
	started chan struct{}
}

var zone = []string{
	"example.com. 3600 IN A 93.184.216.34",
	"example.com. 3600 IN AAAA 2606:2800:220:1:248:1893:25c8:1946",
	"example.com. 3600 IN MX 10 mail.example.com.",
	"example.com. 60 IN TXT \"hello\"",
	"www.example.com. 100 IN CNAME cdn.example.net.",
	"cdn.example.net. 50 IN A 151.101.1.7",
	"cdn.example.net. 50 IN A 151.101.65.8",
	"loop.test. 60 IN A 127.0.0.1",
	"ten.test. 60 IN A 10.0.0.1",
	"meta.test. 60 IN A 169.254.169.254",
	"mapped.test. 60 IN AAAA ::ffff:127.0.0.1",
	"mixed.test. 60 IN A 93.184.216.34",
	"mixed.test. 60 IN A 192.168.1.1",
	"evil.test. 60 IN CNAME inside.test.",
	"inside.test. 60 IN A 10.1.2.3",
	"lit.test. 60 IN CNAME 127.0.0.1.",
	"tometa.test. 60 IN CNAME metadata.google.internal.",
	"stray.test. 60 IN A 93.184.216.34",
	"other.test. 60 IN A 127.0.0.1", // stray record with another owner, injected below
	"forged.test. 60 IN A 1.1.1.9",
	"wrongq.test. 60 IN A 1.1.1.9",
	"big.test. 60 IN TXT \"" + string(make([]byte, 0)) + "\"",
}

func startUpstream(t testing.TB) *upstream {
	t.Helper()
	u := &upstream{zone: map[string][]mdns.RR{}, hold: make(chan struct{}), started: make(chan struct{}, 16)}
	for _, s := range zone {
		rr, err := mdns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		n := mdns.CanonicalName(rr.Header().Name)
		u.zone[n] = append(u.zone[n], rr)
	}
	for range 40 {
		rr, _ := mdns.NewRR("big.test. 60 IN TXT \"0123456789012345678901234567890123456789012345678901234567890123456789\"")
		u.zone["big.test."] = append(u.zone["big.test."], rr)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &mdns.Server{PacketConn: pc, Handler: u}
	ready := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(ready) }
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ActivateAndServe() }()
	<-ready
	t.Cleanup(func() {
		close(u.hold)
		_ = srv.Shutdown()
		<-done
	})
	return u
}

func (u *upstream) ServeDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	u.queries.Add(1)
	q := req.Question[0]
	name := mdns.CanonicalName(q.Name)
	m := new(mdns.Msg)
	m.SetReply(req)
	switch name {
	case "slow.test.":
		u.started <- struct{}{}
		<-u.hold
	case "stray.test.":
		m.Answer = append(m.Answer, u.zone["other.test."]...)
	case "forged.test.", "wrongq.test.":
		f := m.Copy()
		f.Id++
		if name == "wrongq.test." {
			f.Id--
			f.Question[0].Name = "example.com."
		}
		b, _ := f.Pack()
		_, _ = w.Write(b) // a forged or mismatched answer first
		if name == "wrongq.test." {
			return
		}
	}
	for _, rr := range u.zone[name] {
		if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == mdns.TypeCNAME {
			m.Answer = append(m.Answer, rr)
			if c, ok := rr.(*mdns.CNAME); ok {
				for _, rr2 := range u.zone[mdns.CanonicalName(c.Target)] {
					if rr2.Header().Rrtype == q.Qtype {
						m.Answer = append(m.Answer, rr2)
					}
				}
			}
		}
	}
	if len(u.zone[name]) == 0 && name != "slow.test." {
		m.Rcode = mdns.RcodeNameError
	}
	_ = w.WriteMsg(m)
}

type fixture struct {
	r      *Resolver
	up     *upstream
	pins   *policy.PinSet
	now    time.Time
	mu     sync.Mutex
	events []Event
}

func newFixture(t testing.TB, mode string, allow []string, tweak func(*Config)) *fixture {
	t.Helper()
	p, err := policy.ParsePolicy(mode, allow)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{up: startUpstream(t), pins: policy.NewPinSet(0, 0, 0), now: time.Unix(1_700_000_000, 0)}
	cfg := Config{
		Policy:   p,
		Pins:     f.pins,
		Upstream: []string{f.up.addr},
		Clock:    func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now },
		Timeout:  time.Second,
		Audit:    func(e Event) { f.mu.Lock(); f.events = append(f.events, e); f.mu.Unlock() },
	}
	if tweak != nil {
		tweak(&cfg)
	}
	f.r, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) lastEvent() Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.events[len(f.events)-1]
}

func (f *fixture) ask(t *testing.T, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	return f.askMsg(t, m)
}

// askMsg goes through the wire form, as the adapters do.
func (f *fixture) askMsg(t *testing.T, m *mdns.Msg) *mdns.Msg {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	out := f.r.ServeDNS(t.Context(), b)
	if out == nil {
		return nil
	}
	resp := new(mdns.Msg)
	if err := resp.Unpack(out); err != nil {
		t.Fatalf("unpack response: %v", err)
	}
	if resp.Id != m.Id || !resp.Response {
		t.Fatalf("response header %+v does not answer query %d", resp.MsgHdr, m.Id)
	}
	return resp
}

func addrs(m *mdns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := addrOf(rr); ok {
			out = append(out, a)
		}
	}
	return out
}

func TestAllowedResolvesAndPins(t *testing.T) {
	f := newFixture(t, "deny", []string{"example.com:443"}, nil)
	resp := f.ask(t, "Example.COM.", mdns.TypeA)
	if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("got %v", resp)
	}
	if resp.Answer[0].Header().Ttl != 300 {
		t.Errorf("ttl %d, want capped to 300", resp.Answer[0].Header().Ttl)
	}
	if resp.Answer[0].Header().Name != "Example.COM." {
		t.Errorf("owner %q, want the guest's spelling", resp.Answer[0].Header().Name)
	}
	ip := netip.MustParseAddr("93.184.216.34")
	if got := f.pins.Lookup(ip, f.now); !slices.Equal(got, []string{"example.com"}) {
		t.Errorf("pins %v", got)
	}
	if got := f.pins.Lookup(ip, f.now.Add(301*time.Second)); len(got) != 0 {
		t.Errorf("pin outlived the guest TTL: %v", got)
	}
	if e := f.lastEvent(); e.RuleID != "allow[0]" || !e.Forwarded || e.Rcode != "NOERROR" || len(e.Answers) != 1 {
		t.Errorf("event %+v", e)
	}
	// Other forwarded types pass through, without pinning.
	if resp := f.ask(t, "example.com.", mdns.TypeMX); resp.Rcode != 0 || len(resp.Answer) != 1 || len(resp.Extra) != 0 {
		t.Errorf("MX: %v", resp)
	}
	if resp := f.ask(t, "example.com.", mdns.TypeTXT); resp.Rcode != 0 || len(resp.Answer) != 1 || resp.Answer[0].Header().Ttl != 60 {
		t.Errorf("TXT: %v", resp)
	}
	if resp := f.ask(t, "example.com.", mdns.TypeAAAA); resp.Rcode != 0 || len(addrs(resp)) != 1 {
		t.Errorf("AAAA: %v", resp)
	}
}

func TestDenyModeNeverForwards(t *testing.T) {
	f := newFixture(t, "deny", []string{"example.com"}, nil)
	for _, n := range []string{"other.test.", "www.example.com.", "metadata.google.internal.", "sub.example.com.", "."} {
		resp := f.ask(t, n, mdns.TypeA)
		if resp.Rcode != mdns.RcodeNameError {
			t.Errorf("%s: rcode %s, want NXDOMAIN", n, mdns.RcodeToString[resp.Rcode])
		}
		if e := f.lastEvent(); e.Forwarded || e.RuleID == "" {
			t.Errorf("%s: event %+v", n, e)
		}
	}
	if n := f.up.queries.Load(); n != 0 {
		t.Fatalf("%d upstream queries, want 0", n)
	}
	if e := f.lastEvent(); e.Name != "." {
		t.Errorf("event name %q", e.Name)
	}
}

func TestModeNoneAndMetadata(t *testing.T) {
	for _, mode := range []string{"none", "public"} {
		f := newFixture(t, mode, nil, nil)
		for _, n := range []string{"metadata.google.internal.", "METADATA.", "instance-data.ec2.internal."} {
			if resp := f.ask(t, n, mdns.TypeA); resp.Rcode != mdns.RcodeNameError {
				t.Errorf("%s %s: %v", mode, n, resp)
			}
		}
		if mode == "none" {
			if resp := f.ask(t, "example.com.", mdns.TypeA); resp.Rcode != mdns.RcodeNameError {
				t.Errorf("none: %v", resp)
			}
		}
		if n := f.up.queries.Load(); n != 0 {
			t.Errorf("%s: %d upstream queries", mode, n)
		}
	}
}

func TestIPLiteralsNeverForwarded(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	for _, n := range []string{"2852039166.", "0x7f.1.", "127.0.0.1.", "127.1.", "0251.0376.0251.0376.", "0xA9FEA9FE.", "foo.0x10.", "1.2.3.4."} {
		for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA, mdns.TypeTXT} {
			if resp := f.ask(t, n, qt); resp.Rcode != mdns.RcodeNameError {
				t.Errorf("%s: rcode %s", n, mdns.RcodeToString[resp.Rcode])
			}
		}
	}
	if n := f.up.queries.Load(); n != 0 {
		t.Fatalf("%d upstream queries, want 0", n)
	}
}

func TestReverseNames(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	for _, n := range []string{"1.0.0.127.in-addr.arpa.", "1.0.0.10.in-addr.arpa.", "254.169.254.169.in-addr.arpa.", "10.in-addr.arpa.", "in-addr.arpa.",
		"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa.", "8.b.d.0.1.0.0.2.ip6.arpa."} {
		if resp := f.ask(t, n, mdns.TypePTR); resp.Rcode != mdns.RcodeNameError {
			t.Errorf("%s: rcode %s", n, mdns.RcodeToString[resp.Rcode])
		}
	}
	if n := f.up.queries.Load(); n != 0 {
		t.Fatalf("%d upstream queries, want 0", n)
	}
	f.ask(t, "34.216.184.93.in-addr.arpa.", mdns.TypePTR)
	if n := f.up.queries.Load(); n != 1 {
		t.Fatalf("public reverse name: %d upstream queries, want 1", n)
	}
}

func TestRebinding(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	cases := []struct {
		name  string
		qtype uint16
		rule  string
	}{
		{"loop.test.", mdns.TypeA, "floor:loopback"},
		{"ten.test.", mdns.TypeA, "floor:private"},
		{"meta.test.", mdns.TypeA, "floor:metadata"},
		{"mapped.test.", mdns.TypeAAAA, "floor:loopback"},
		{"mixed.test.", mdns.TypeA, "floor:private"},
		{"evil.test.", mdns.TypeA, "floor:private"},
		{"lit.test.", mdns.TypeA, "name:literal"},
		{"tometa.test.", mdns.TypeA, "name:metadata"},
		{"stray.test.", mdns.TypeA, "floor:loopback"},
	}
	for _, c := range cases {
		resp := f.ask(t, c.name, c.qtype)
		if resp.Rcode != mdns.RcodeNameError || len(resp.Answer) != 0 {
			t.Errorf("%s: %v", c.name, resp)
			continue
		}
		if e := f.lastEvent(); e.RuleID != c.rule || !e.Forwarded || len(e.Answers) != 0 {
			t.Errorf("%s: event %+v, want rule %s", c.name, e, c.rule)
		}
	}
	if n := f.pins.Len(); n != 0 {
		t.Fatalf("%d pins after rebinding answers", n)
	}
}

func TestRebindingOpenedByIPRule(t *testing.T) {
	f := newFixture(t, "deny", []string{"ten.test", "10.0.0.1"}, nil)
	if resp := f.ask(t, "ten.test.", mdns.TypeA); resp.Rcode != 0 || len(resp.Answer) != 1 {
		t.Fatalf("got %v", resp)
	}
}

func TestCNAMEChainPinned(t *testing.T) {
	f := newFixture(t, "deny", []string{"www.example.com"}, nil)
	resp := f.ask(t, "www.example.com.", mdns.TypeA)
	if resp.Rcode != 0 || len(resp.Answer) != 3 {
		t.Fatalf("got %v %+v", resp, f.lastEvent())
	}
	ip := netip.MustParseAddr("151.101.65.8")
	// cdn.example.net is not allowed by itself under mode deny: not pinned.
	if got := f.pins.Lookup(ip, f.now); !slices.Equal(got, []string{"www.example.com"}) {
		t.Errorf("pins %v", got)
	}
	if got := f.pins.Lookup(ip, f.now.Add(51*time.Second)); len(got) != 0 {
		t.Errorf("pin TTL is not the chain's smallest: %v", got)
	}
	g := newFixture(t, "public", nil, nil)
	g.ask(t, "www.example.com.", mdns.TypeA)
	if got := g.pins.Lookup(ip, g.now); !slices.Equal(got, []string{"cdn.example.net", "www.example.com"}) {
		t.Errorf("public pins %v", got)
	}
}

func TestRefusedAndFormErr(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	for _, qt := range []uint16{mdns.TypeANY, mdns.TypeAXFR, mdns.TypeIXFR, mdns.TypeDNSKEY} {
		if resp := f.ask(t, "example.com.", qt); resp.Rcode != mdns.RcodeRefused {
			t.Errorf("%s: %v", mdns.TypeToString[qt], resp)
		}
	}
	if resp := f.ask(t, "example.com.", mdns.TypeHTTPS); resp.Rcode != 0 || len(resp.Answer) != 0 {
		t.Errorf("HTTPS: %v", resp)
	}
	m := new(mdns.Msg)
	m.SetQuestion("example.com.", mdns.TypeA)
	m.Question = append(m.Question, mdns.Question{Name: "loop.test.", Qtype: mdns.TypeA, Qclass: mdns.ClassINET})
	if resp := f.askMsg(t, m); resp.Rcode != mdns.RcodeFormatError {
		t.Errorf("two questions: %v", resp)
	}
	m.Question = nil
	if resp := f.askMsg(t, m); resp.Rcode != mdns.RcodeFormatError {
		t.Errorf("no question: %v", resp)
	}
	m.SetQuestion("example.com.", mdns.TypeA)
	m.Question[0].Qclass = mdns.ClassCHAOS
	if resp := f.askMsg(t, m); resp.Rcode != mdns.RcodeRefused {
		t.Errorf("class CH: %v", resp)
	}
	m.SetQuestion("example.com.", mdns.TypeA)
	m.Opcode = mdns.OpcodeUpdate
	if resp := f.askMsg(t, m); resp.Rcode != mdns.RcodeNotImplemented {
		t.Errorf("update: %v", resp)
	}
	m.SetQuestion("example.com.", mdns.TypeA)
	m.Response = true
	if resp := f.askMsg(t, m); resp != nil {
		t.Errorf("a response from the guest was answered: %v", resp)
	}
	if n := f.up.queries.Load(); n != 0 {
		t.Fatalf("%d upstream queries, want 0", n)
	}
	if out := f.r.ServeDNS(t.Context(), []byte{1, 2, 1, 0, 0, 1}); out != nil {
		t.Errorf("short packet answered")
	}
	if out := f.r.ServeDNS(t.Context(), []byte{1, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7}); len(out) != 12 || out[3]&0xf != mdns.RcodeFormatError {
		t.Errorf("broken packet: %x", out)
	}
}

func TestUDPTruncation(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	resp := f.ask(t, "big.test.", mdns.TypeTXT)
	if !resp.Truncated {
		t.Errorf("big answer not truncated over UDP (%d records)", len(resp.Answer))
	}
}

func TestForgedUpstreamAnswerDropped(t *testing.T) {
	f := newFixture(t, "public", nil, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	resp := f.ask(t, "forged.test.", mdns.TypeA)
	if resp.Rcode != 0 || len(resp.Answer) != 1 {
		t.Fatalf("forged.test: %v %+v", resp, f.lastEvent())
	}
	if resp := f.ask(t, "wrongq.test.", mdns.TypeA); resp.Rcode != mdns.RcodeServerFailure {
		t.Fatalf("mismatched question accepted: %v", resp)
	}
	if got := f.pins.Lookup(netip.MustParseAddr("93.184.216.34"), f.now); len(got) != 0 {
		t.Errorf("pinned from a mismatched answer: %v", got)
	}
}

func TestRateLimit(t *testing.T) {
	f := newFixture(t, "deny", []string{"example.com"}, func(c *Config) { c.QueryRate = 5 })
	for i := range 5 {
		if resp := f.ask(t, "denied.test.", mdns.TypeA); resp.Rcode != mdns.RcodeNameError {
			t.Fatalf("query %d: %v", i, resp)
		}
	}
	if resp := f.ask(t, "example.com.", mdns.TypeA); resp.Rcode != mdns.RcodeRefused {
		t.Fatalf("over the limit: %v", resp)
	}
	if e := f.lastEvent(); e.RuleID != "rate:limit" || e.Forwarded {
		t.Errorf("event %+v", e)
	}
	f.mu.Lock()
	f.now = f.now.Add(time.Second)
	f.mu.Unlock()
	if resp := f.ask(t, "example.com.", mdns.TypeA); resp.Rcode != 0 {
		t.Fatalf("after refill: %v", resp)
	}
}

func TestInflightLimit(t *testing.T) {
	f := newFixture(t, "public", nil, func(c *Config) { c.MaxInflight = 1; c.Timeout = 300 * time.Millisecond })
	done := make(chan *mdns.Msg, 1)
	go func() {
		m := new(mdns.Msg)
		m.SetQuestion("slow.test.", mdns.TypeA)
		done <- f.r.Handle(t.Context(), m)
	}()
	<-f.up.started
	if resp := f.ask(t, "example.com.", mdns.TypeA); resp.Rcode != mdns.RcodeServerFailure {
		t.Fatalf("over the inflight cap: %v", resp)
	}
	if e := f.lastEvent(); e.RuleID != "inflight:limit" {
		t.Errorf("event %+v", e)
	}
	if resp := <-done; resp.Rcode != mdns.RcodeServerFailure {
		t.Errorf("slow query: %v", resp)
	}
}

func TestServeStream(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	guest, host := net.Pipe()
	errc := make(chan error, 1)
	go func() { errc <- f.r.ServeStream(t.Context(), host) }()
	for _, n := range []string{"example.com.", "big.test."} {
		m := new(mdns.Msg)
		m.SetQuestion(n, mdns.TypeA)
		if n == "big.test." {
			m.Question[0].Qtype = mdns.TypeTXT
		}
		b, _ := m.Pack()
		if err := writeFrame(guest, b); err != nil {
			t.Fatal(err)
		}
		out, err := readFrame(guest)
		if err != nil {
			t.Fatal(err)
		}
		resp := new(mdns.Msg)
		if err := resp.Unpack(out); err != nil || resp.Id != m.Id || resp.Truncated || len(resp.Answer) == 0 {
			t.Fatalf("%s: %v %v %+v", n, resp, err, f.lastEvent())
		}
	}
	_ = guest.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestServePacket(t *testing.T) {
	f := newFixture(t, "public", nil, nil)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx, cancel := contextWithCancel(t)
	errc := make(chan error, 1)
	go func() { errc <- f.r.ServePacket(ctx, pc) }()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(mdns.Msg)
	m.SetQuestion("example.com.", mdns.TypeA)
	b, _ := m.Pack()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	resp := new(mdns.Msg)
	if err := resp.Unpack(buf[:n]); err != nil || resp.Id != m.Id || len(resp.Answer) != 1 {
		t.Fatalf("%v %v", resp, err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestConfigValidate(t *testing.T) {
	pins := policy.NewPinSet(0, 0, 0)
	for _, c := range []Config{
		{Upstream: []string{"127.0.0.1:53"}},
		{Pins: pins},
		{Pins: pins, Upstream: []string{"dns.google:53"}},
		{Pins: pins, Upstream: []string{"127.0.0.1:53"}, QueryRate: -1},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
