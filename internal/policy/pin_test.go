package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestPinSet(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	ip := netip.MustParseAddr("93.184.216.34")
	s := NewPinSet(30*time.Second, time.Hour, 4)
	s.Add("Example.COM.", []netip.Addr{ip, netip.MustParseAddr("2606:2800::1")}, 0, t0) // clamped up to 30 s
	s.Add("cdn.example.org", []netip.Addr{netip.MustParseAddr("::ffff:93.184.216.34")}, 48*time.Hour, t0)
	s.Add("bad..name", []netip.Addr{ip}, time.Minute, t0)

	if got := s.Lookup(ip, t0.Add(10*time.Second)); !slices.Equal(got, []string{"cdn.example.org", "example.com"}) {
		t.Errorf("Lookup = %q", got)
	}
	if got := s.Lookup(ip, t0.Add(31*time.Second)); !slices.Equal(got, []string{"cdn.example.org"}) {
		t.Errorf("after min TTL: %q", got)
	}
	if got := s.Lookup(ip, t0.Add(time.Hour+time.Second)); len(got) != 0 {
		t.Errorf("after max TTL: %q", got)
	}
	// Refresh keeps the later expiry.
	s.Add("a.example", []netip.Addr{ip}, time.Hour, t0)
	s.Add("a.example", []netip.Addr{ip}, time.Second, t0)
	if got := s.Lookup(ip, t0.Add(time.Minute)); !slices.Equal(got, []string{"a.example"}) {
		t.Errorf("refresh: %q", got)
	}
	// Bounded: the oldest pairs go first.
	s = NewPinSet(0, 0, 3)
	for i := range 10 {
		s.Add(fmt.Sprintf("n%d.example", i), []netip.Addr{ip}, time.Minute, t0)
	}
	if s.Len() != 3 {
		t.Fatalf("Len = %d", s.Len())
	}
	if got := s.Lookup(ip, t0); !slices.Equal(got, []string{"n7.example", "n8.example", "n9.example"}) {
		t.Errorf("bounded: %q", got)
	}
}

func TestPinSetDecide(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	p := mustPolicy(t, "deny", "example.com:443")
	s := NewPinSet(0, 0, 0)
	ip := netip.MustParseAddr("93.184.216.34")
	if d := DNSAnswerAllowed(p, "example.com", ip); d.Allow {
		s.Add("example.com", []netip.Addr{d.Addr}, 5*time.Minute, t0)
	}
	req := func(now time.Time) Request {
		return Request{Proto: "tcp", Dst: netip.AddrPortFrom(ip, 443), Names: s.Lookup(ip, now), SNI: "example.com"}
	}
	if d := Decide(p, req(t0.Add(time.Minute))); !d.Allow || d.RuleID != "allow[0]" {
		t.Errorf("pinned: %+v", d)
	}
	if d := Decide(p, req(t0.Add(6*time.Minute))); d.Allow {
		t.Errorf("expired pin still allowed: %+v", d)
	}
}
