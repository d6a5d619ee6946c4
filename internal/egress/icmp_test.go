package egress

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// fakePing answers every echo it is asked to send and records where.
type fakePing struct {
	mu   sync.Mutex
	dsts []string
}

func (f *fakePing) ping(_ context.Context, dst netip.Addr, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dsts = append(f.dsts, dst.String()+" "+string(data))
	return nil
}

func (f *fakePing) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dsts)
}

// pingOnce pings dst from the guest and reports whether a reply came.
func pingOnce(t *testing.T, e *env, dst netip.Addr, seq uint16, wait time.Duration) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	err := e.guest.Ping(ctx, dst, 0x77, seq, []byte("airlock"))
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping %s: %v", dst, err)
	}
	return err == nil
}

// TestPingFollowsThePolicy: an echo to an address an allow rule without a
// port opens is sent from the host and answered; one to an address only a
// port-scoped rule names, and one into the floor, are denied, never sent,
// and recorded.
func TestPingFollowsThePolicy(t *testing.T) {
	fp := &fakePing{}
	e := newEnv(t, netconf.Spec{Mode: "deny", Allow: []string{pubA.String(), pubB.String() + ":443", "10.0.0.0/8"}}, nil,
		func(c *Config) { c.Ping = fp.ping })
	if !pingOnce(t, e, pubA, 1, 10*time.Second) {
		t.Fatal("no reply from an allowed address")
	}
	for _, dst := range []string{pubB.String(), pubC.String(), "127.0.0.1", "169.254.169.254"} {
		if pingOnce(t, e, netip.MustParseAddr(dst), 2, 300*time.Millisecond) {
			t.Errorf("a reply from %s, which the policy denies", dst)
		}
	}
	if sent := fp.sent(); len(sent) != 1 || sent[0] != pubA.String()+" airlock" {
		t.Fatalf("the host sent echoes to %q, want only %s", sent, pubA)
	}
	testutil.WaitFor(t, 10*time.Second, func() bool { return len(e.actions()) >= 5 })
	got := e.actions()
	want := []string{
		"net.allow " + pubA.String() + " allow[0]",
		"net.deny " + pubB.String() + " mode:deny",
		"net.deny " + pubC.String() + " mode:deny",
		"net.deny 127.0.0.1 floor:loopback",
		"net.deny 169.254.169.254 floor:metadata",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("audit %q, want %q", got, want)
	}
	e.mu.Lock()
	proto := e.events[0].Detail["proto"]
	e.mu.Unlock()
	if proto != "icmp" {
		t.Fatalf("proto %v", proto)
	}
	if st := e.eng.Stats(); st.PingReplies != 1 {
		t.Fatalf("PingReplies %d", st.PingReplies)
	}
}

// TestPingRateLimited: echo requests take tokens from the UDP packet rate
// limit; past it they are not sent and are counted in one net.limit event.
func TestPingRateLimited(t *testing.T) {
	fp := &fakePing{}
	now := time.Unix(1_000_000, 0)
	e := newEnv(t, netconf.Spec{Mode: "public", UDPRate: 2}, nil, func(c *Config) {
		c.Ping = fp.ping
		c.Clock = func() time.Time { return now } // no refill
		c.LimitWindow = time.Millisecond
	})
	replies := 0
	for seq := range uint16(4) {
		if pingOnce(t, e, pubA, seq, map[bool]time.Duration{true: 10 * time.Second, false: 300 * time.Millisecond}[seq < 2]) {
			replies++
		}
	}
	if replies != 2 || len(fp.sent()) != 2 {
		t.Fatalf("%d replies, %d sent; want the 2 the limit allows", replies, len(fp.sent()))
	}
	if _, dgrams := e.eng.lim.counts(); dgrams != 2 {
		t.Fatalf("datagrams limited %d, want 2", dgrams)
	}
}

// TestSystemPingLoopback: the host's ping reaches 127.0.0.1 and gets the
// reply with the same payload (host tier: a raw ICMP socket needs root
// where ping sockets are off).
func TestSystemPingLoopback(t *testing.T) {
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := SystemPing(ctx, netip.MustParseAddr("127.0.0.1"), []byte("airlock ping")); err != nil {
		t.Fatal(err)
	}
}

// TestPingSweepLimited: a ping to a destination not reached this minute
// counts against the distinct-destinations limit like a new flow: a sweep
// across addresses stops at it.
func TestPingSweepLimited(t *testing.T) {
	fp := &fakePing{}
	now := time.Unix(1_000_000, 0)
	e := newEnv(t, netconf.Spec{Mode: "public", DestsPerMin: 1}, nil, func(c *Config) {
		c.Ping = fp.ping
		c.Clock = func() time.Time { return now }
	})
	if !pingOnce(t, e, pubA, 1, 10*time.Second) || !pingOnce(t, e, pubA, 2, 10*time.Second) {
		t.Fatal("no reply from the first destination")
	}
	if pingOnce(t, e, pubB, 3, 300*time.Millisecond) {
		t.Fatal("a reply from a second destination past dests_per_min 1")
	}
	if sent := fp.sent(); len(sent) != 2 {
		t.Fatalf("the host sent %q, want two echoes to %s", sent, pubA)
	}
	if flows, _ := e.eng.lim.counts(); flows != 1 {
		t.Fatalf("flows limited %d, want 1", flows)
	}
}
