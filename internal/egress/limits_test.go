package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// fakeNow is a clock the limiter tests move by hand.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (l *eventLog) add(e Event) { l.mu.Lock(); l.evs = append(l.evs, e); l.mu.Unlock() }
func (l *eventLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.evs...)
}

func newTestLimiter(t *testing.T, spec netconf.Spec, window time.Duration) (*limiter, *fakeNow, *eventLog) {
	t.Helper()
	spec, err := spec.Normalize(nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := &fakeNow{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	log := &eventLog{}
	l := newLimiter(spec, clk.now, window, log.add)
	t.Cleanup(l.close)
	return l, clk, log
}

func dstN(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{93, 184, byte(i >> 8), byte(i)}), uint16(1000+i))
}

func TestLimiterConnRate(t *testing.T) {
	t.Parallel()
	l, clk, _ := newTestLimiter(t, netconf.Spec{ConnRate: 10, DestsPerMin: -1}, time.Hour)
	dst := dstN(1)
	burst := 10 * netconf.ConnBurstFactor
	for i := range burst {
		if r := l.flow("tcp", dst); r != "" {
			t.Fatalf("flow %d of the burst refused by %s", i, r)
		}
	}
	if r := l.flow("tcp", dst); r != LimitConnRate {
		t.Fatalf("flow past the burst: %q, want %s", r, LimitConnRate)
	}
	clk.add(time.Second)
	for i := range 10 {
		if r := l.flow("udp", dst); r != "" {
			t.Fatalf("flow %d after a second refused by %s", i, r)
		}
	}
	if r := l.flow("tcp", dst); r != LimitConnRate {
		t.Fatalf("11th flow in the second: %q", r)
	}
	if f, d := l.counts(); f != 2 || d != 0 {
		t.Fatalf("counts %d %d, want 2 0", f, d)
	}
}

func TestLimiterDistinctDestinations(t *testing.T) {
	t.Parallel()
	l, clk, _ := newTestLimiter(t, netconf.Spec{ConnRate: -1, DestsPerMin: 5}, time.Hour)
	for i := range 5 {
		if r := l.flow("tcp", dstN(i)); r != "" {
			t.Fatalf("destination %d refused by %s", i, r)
		}
	}
	if r := l.flow("tcp", dstN(5)); r != LimitDests {
		t.Fatalf("6th destination: %q, want %s", r, LimitDests)
	}
	// A destination already reached this minute stays reachable.
	for range 100 {
		if r := l.flow("tcp", dstN(3)); r != "" {
			t.Fatalf("known destination refused by %s", r)
		}
	}
	// Another port of a known address is another destination.
	if r := l.flow("tcp", netip.AddrPortFrom(dstN(0).Addr(), 1)); r != LimitDests {
		t.Fatalf("known address, new port: %q", r)
	}
	clk.add(time.Minute)
	if r := l.flow("tcp", dstN(5)); r != "" {
		t.Fatalf("a new minute: refused by %s", r)
	}
}

func TestLimiterUDPRate(t *testing.T) {
	t.Parallel()
	l, clk, _ := newTestLimiter(t, netconf.Spec{UDPRate: 100}, time.Hour)
	ok := 0
	for range 1000 {
		if l.datagram(dstN(1)) {
			ok++
		}
	}
	if ok != 100 {
		t.Fatalf("%d datagrams passed at once, want the 100 of the bucket", ok)
	}
	clk.add(100 * time.Millisecond)
	if !l.datagram(dstN(1)) {
		t.Fatal("a datagram 100 ms later (10 tokens) dropped")
	}
	if _, d := l.counts(); d != 900 {
		t.Fatalf("dropped %d, want 900", d)
	}
}

func TestLimiterNoLimits(t *testing.T) {
	t.Parallel()
	l, _, log := newTestLimiter(t, netconf.Spec{ConnRate: -1, DestsPerMin: -1, UDPRate: -1}, time.Hour)
	for i := range 20000 {
		if r := l.flow("tcp", dstN(i)); r != "" {
			t.Fatalf("flow %d refused by %s with no limits", i, r)
		}
		if !l.datagram(dstN(i)) {
			t.Fatalf("datagram %d dropped with no limits", i)
		}
	}
	l.close()
	if evs := log.all(); len(evs) != 0 {
		t.Fatalf("events with no limits: %v", evs)
	}
}

// A burst of refusals is one event per limit and window, with the count and
// a few sample destinations, not one per attempt.
func TestLimiterAggregates(t *testing.T) {
	t.Parallel()
	l, clk, log := newTestLimiter(t, netconf.Spec{ConnRate: 1, DestsPerMin: 3, UDPRate: 1}, time.Hour)
	for i := range 5000 {
		l.flow("tcp", dstN(i%7))
		l.flow("tcp", dstN(i))
		l.datagram(dstN(i))
		clk.add(time.Millisecond)
	}
	if evs := log.all(); len(evs) != 0 {
		t.Fatalf("events before the window ended: %v", evs)
	}
	l.close()
	evs := log.all()
	if len(evs) != 3 {
		t.Fatalf("%d events for one burst, want one per limit and window", len(evs))
	}
	var total uint64
	seen := map[string]bool{}
	for _, e := range evs {
		if e.Action != "net.limit" || e.Detail["aggregated"] != true {
			t.Fatalf("event %+v", e)
		}
		rule := e.Detail["rule"].(string)
		seen[rule] = true
		if rule != LimitUDPRate {
			total += e.Detail["count"].(uint64)
		}
		if s := e.Detail["samples"].([]string); len(s) == 0 || len(s) > limitSamples {
			t.Fatalf("%s: samples %v", rule, s)
		}
		if r := e.Detail["reason"].(string); !strings.Contains(r, "per ") {
			t.Fatalf("%s: reason %q does not name the limit", rule, r)
		}
	}
	for _, r := range []string{LimitConnRate, LimitDests, LimitUDPRate} {
		if !seen[r] {
			t.Fatalf("no %s event in %v", r, evs)
		}
	}
	if f, _ := l.counts(); total != f {
		t.Fatalf("events count %d refused flows, the limiter %d", total, f)
	}
}

// The window's end emits the folded events without waiting for close.
func TestLimiterWindowTimer(t *testing.T) {
	t.Parallel()
	l, _, log := newTestLimiter(t, netconf.Spec{ConnRate: 1}, 20*time.Millisecond)
	for range 10 {
		l.flow("tcp", dstN(1))
	}
	testutil.WaitFor(t, 5*time.Second, func() bool { return len(log.all()) == 1 })
	if e := log.all()[0]; e.Detail["count"] != uint64(10-netconf.ConnBurstFactor) {
		t.Fatalf("event %+v", e)
	}
	// The next refusal starts a new window.
	l.flow("tcp", dstN(1))
	testutil.WaitFor(t, 5*time.Second, func() bool { return len(log.all()) == 2 })
}

// The engine: a scan of many ports of an allowed host is throttled at the
// limit, its refusals are RSTs and one event; mail ports are closed in
// mode public; a UDP flood is capped.
func TestEngineThrottlesAScan(t *testing.T) {
	port, accepted := echoServer(t)
	e := newEnv(t, netconf.Spec{DestsPerMin: 20}, nil, func(c *Config) { c.LimitWindow = time.Hour })
	// Many ports of pubA: only the port the echo server listens on answers,
	// the rest are refused upstream or by the limit.
	refusedFast := 0
	for i := range 200 {
		p := uint16(20000 + i)
		if i == 0 {
			p = port
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		start := time.Now()
		c, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(pubA, p))
		cancel()
		if err == nil {
			c.Close()
		} else if time.Since(start) < time.Second {
			refusedFast++
		}
	}
	if refusedFast < 180 {
		t.Fatalf("%d of 199 closed or throttled ports refused at once", refusedFast)
	}
	if n := len(e.dialed()); n != 20 {
		t.Fatalf("dialed %d destinations, want the limit, 20", n)
	}
	if accepted() != 1 {
		t.Fatalf("echo server accepted %d", accepted())
	}
	if u := e.eng.Usage(); u.FlowsLimited != 180 {
		t.Fatalf("usage %+v, want 180 flows limited", u)
	}
	if err := e.eng.Close(); err != nil {
		t.Fatal(err)
	}
	var limits []Event
	e.mu.Lock()
	for _, ev := range e.events {
		if ev.Action == "net.limit" {
			limits = append(limits, ev)
		}
	}
	e.mu.Unlock()
	if len(limits) != 1 || limits[0].Detail["rule"] != LimitDests || limits[0].Detail["count"] != uint64(180) {
		t.Fatalf("net.limit events %v, want one for 180 refusals", limits)
	}
}

func TestEngineMailPortsClosed(t *testing.T) {
	e := newEnv(t, netconf.Spec{}, nil, nil)
	for _, p := range []uint16{25, 465, 587} {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := e.guest.DialTCP(ctx, netip.AddrPortFrom(pubA, p))
		cancel()
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("port %d: %v, want connection refused", p, err)
		}
	}
	if d := e.dialed(); len(d) != 0 {
		t.Fatalf("dialed %v", d)
	}
	for _, p := range []string{"25", "465", "587"} {
		want := "net.deny " + pubA.String() + ":" + p + " mail:closed"
		found := false
		for _, a := range e.actions() {
			found = found || a == want
		}
		if !found {
			t.Fatalf("no %q in %v", want, e.actions())
		}
	}
}

func TestEngineMailPortByRule(t *testing.T) {
	e := newEnv(t, netconf.Spec{Mode: "public", Allow: []string{pubA.String() + ":587"}}, nil, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	// The rule names 587: the engine dials it (nothing listens on it here,
	// so it fails upstream, which is the point: it was not refused before).
	_, _ = e.guest.DialTCP(ctx, netip.AddrPortFrom(pubA, 587))
	if d := e.dialed(); len(d) != 1 || d[0] != fmt.Sprintf("tcp %s:587", pubA) {
		t.Fatalf("dialed %v, want %s:587", d, pubA)
	}
}

func TestEngineUDPRate(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	var mu sync.Mutex
	got := 0
	go func() {
		b := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(b); err != nil {
				return
			}
			mu.Lock()
			got++
			mu.Unlock()
		}
	}()
	e := newEnv(t, netconf.Spec{UDPRate: 10}, nil, func(c *Config) { c.LimitWindow = time.Hour })
	c, err := e.guest.DialUDP(netip.AddrPortFrom(pubA, uint16(pc.LocalAddr().(*net.UDPAddr).Port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 500 {
		if _, err := c.Write([]byte("flood")); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, func() bool {
		u := e.eng.Usage()
		mu.Lock()
		defer mu.Unlock()
		return u.DatagramsLimited+uint64(got) == 500
	})
	mu.Lock()
	n := got
	mu.Unlock()
	// 10 in the bucket, plus 10 per second the flood took.
	if n < 10 || n > 60 {
		t.Fatalf("%d of 500 datagrams reached the upstream at 10 per second", n)
	}
	if u := e.eng.Usage(); u.EgressBytes != uint64(5*n) {
		t.Fatalf("egress bytes %d, want %d", u.EgressBytes, 5*n)
	}
}
