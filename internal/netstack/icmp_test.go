package netstack_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netstack"
	"github.com/airlock-sandbox/airlock/internal/netstack/guesttest"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// pingEnv is a Stack with ping hook p served to a guesttest guest.
func pingEnv(t *testing.T, p netstack.PingFunc, busy func(string, netip.AddrPort, string)) (*netstack.Stack, *guesttest.Guest) {
	t.Helper()
	s, err := netstack.New(netstack.Config{
		Dial: func(context.Context, string, netip.AddrPort) (net.Conn, error) { return nil, errors.New("no") },
		Ping: p, Busy: busy, MaxInflightDials: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	host, guest := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.ServeLink(ctx, host) })
	g, err := guesttest.Start(guest)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		g.Close()
		s.Close()
		wg.Wait()
	})
	return s, g
}

// TestPingEcho: an echo request goes to the hook with its payload and
// destination; a nil answer is an echo reply from that destination with
// the guest's id, sequence and data; an error is silence.
func TestPingEcho(t *testing.T) {
	allowed := netip.MustParseAddr("203.0.113.7")
	var mu sync.Mutex
	var seen []string
	s, g := pingEnv(t, func(_ context.Context, dst netip.Addr, data []byte) error {
		mu.Lock()
		seen = append(seen, dst.String()+" "+string(data))
		mu.Unlock()
		if dst != allowed {
			return errors.New("denied")
		}
		return nil
	}, nil)
	for seq := range uint16(3) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := g.Ping(ctx, allowed, 0x4242, seq, []byte("airlock ping payload"))
		cancel()
		if err != nil {
			t.Fatalf("ping %d: %v", seq, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := g.Ping(ctx, netip.MustParseAddr("10.0.0.1"), 1, 1, []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping to a denied address: %v, want no answer", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 4 || seen[0] != "203.0.113.7 airlock ping payload" || seen[3] != "10.0.0.1 x" {
		t.Fatalf("hook saw %q", seen)
	}
	if st := s.Stats(); st.PingReplies != 3 {
		t.Fatalf("PingReplies %d, want 3", st.PingReplies)
	}
}

// TestPingInflightCap: echo requests beyond MaxInflightDials are dropped
// and reported busy; without a hook they are dropped like other ICMP.
func TestPingInflightCap(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var busy []string
	s, g := pingEnv(t, func(ctx context.Context, _ netip.Addr, _ []byte) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return errors.New("held")
	}, func(proto string, dst netip.AddrPort, limit string) {
		mu.Lock()
		busy = append(busy, proto+" "+dst.Addr().String()+" "+limit)
		mu.Unlock()
	})
	defer close(release)
	dst := netip.MustParseAddr("203.0.113.9")
	for seq := range uint16(3) {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		_ = g.Ping(ctx, dst, 7, seq, []byte("p"))
		cancel()
	}
	testutil.WaitFor(t, 10*time.Second, func() bool { return s.Stats().DialsBusy >= 1 })
	mu.Lock()
	defer mu.Unlock()
	if len(busy) != 1 || busy[0] != "icmp 203.0.113.9 "+netstack.LimitDials {
		t.Fatalf("busy %q, want the third request refused", busy)
	}
}

// TestPingWithoutHook: with no Ping hook, echo requests get no answer.
func TestPingWithoutHook(t *testing.T) {
	s, g := pingEnv(t, nil, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := g.Ping(ctx, netip.MustParseAddr("203.0.113.7"), 1, 1, []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping without a hook: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, func() bool { return s.Stats().FramesFiltered > 0 })
	if st := s.Stats(); st.FramesFiltered == 0 || st.PingReplies != 0 {
		t.Fatalf("stats %+v", st)
	}
}
