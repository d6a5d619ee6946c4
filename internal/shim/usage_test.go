package shim

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/netstack/guesttest"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// nicRuntime is the fake runtime with a NIC: each instance's link is one
// end of a pipe. The other end of sandbox id's goes to links, for a
// simulated guest (guesttest) to serve; that of any other instance (the
// template's boot) is left alone.
type nicRuntime struct {
	runtime.Runtime
	id    string
	links chan net.Conn
}

func (r *nicRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	in, err := r.Runtime.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &nicInstance{Instance: in.(*fake.Instance), r: r}, nil
}

type nicInstance struct {
	*fake.Instance
	r *nicRuntime
}

var _ runtime.Networker = (*nicInstance)(nil)

func (in *nicInstance) NetConn(context.Context) (net.Conn, error) {
	host, g := net.Pipe()
	if in.ID() == in.r.id {
		in.r.links <- g
	}
	return host, nil
}

// withNIC runs the harness's sandbox on nicRuntime under network mode
// mode, with the test dial map sending 93.184.215.10 to 127.0.0.1; the
// guest end of its link comes on the returned channel.
func withNIC(mode string, links chan net.Conn) func(*store.Sandbox, *Config) {
	return func(sb *store.Sandbox, cfg *Config) {
		sb.Network.Mode = mode
		cfg.Runtime = &nicRuntime{Runtime: cfg.Runtime, id: sb.ID, links: links}
		cfg.TestDialMap = "93.184.215.10=127.0.0.1"
	}
}

// TestUsageNetwork: Usage carries the counters of the guest's link through
// the shim and the manager: a body fetched by the guest is counted as
// received, its request as transmitted, with the dial and the connection.
func TestUsageNetwork(t *testing.T) {
	t.Parallel()
	const body = 64 << 10
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.ReadFull(c, make([]byte, 4))
		_, _ = c.Write(bytes.Repeat([]byte("b"), body))
	}()
	links := make(chan net.Conn, 1)
	h := newHarness(t, time.Hour, withNIC("", links))
	g, err := guesttest.Start(<-links)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	ctx := t.Context()
	m := h.manager()
	before, err := m.SampleUsage(ctx, h.id)
	if err != nil || before.Network == nil || before.MemTotal == 0 {
		t.Fatalf("usage before: %+v (network %+v), %v", before, before.Network, err)
	}
	dst := netip.AddrPortFrom(netip.MustParseAddr("93.184.215.10"), uint16(ln.Addr().(*net.TCPAddr).Port))
	c, err := g.DialTCP(ctx, dst)
	if err != nil {
		t.Fatalf("guest dial: %v", err)
	}
	if _, err := c.Write([]byte("GET!")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != body {
		t.Fatalf("guest read %d bytes (%v), want %d", len(got), err, body)
	}
	// Open: the connection counts.
	u, err := m.SampleUsage(ctx, h.id)
	if err != nil || u.Network == nil || u.Network.DialsAllowed != before.Network.DialsAllowed+1 {
		t.Fatalf("usage: %+v, %v", u.Network, err)
	}
	c.Close()
	<-served
	var n *guest.NetworkUsage
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		u, err := m.SampleUsage(ctx, h.id)
		if err != nil {
			t.Fatal(err)
		}
		n = u.Network
		return n != nil && n.Connections == 0
	}) {
		t.Fatalf("connection still counted: %+v", n)
	}
	b := before.Network
	if n.ReceiveBytes-b.ReceiveBytes < body || n.TransmitBytes-b.TransmitBytes < 4 ||
		n.ReceiveFrames <= b.ReceiveFrames || n.TransmitFrames <= b.TransmitFrames || n.DialsDenied != 0 || n.DialsBusy != 0 {
		t.Fatalf("network %+v after %+v: want at least %d bytes received and 4 sent", n, b, body)
	}
	// The guest received the body with its headers, not the other way round.
	if n.ReceiveBytes <= n.TransmitBytes {
		t.Fatalf("receive %d <= transmit %d for a download", n.ReceiveBytes, n.TransmitBytes)
	}
	h.stop(t)
}

// TestUsageNoNetwork: a sandbox without a network (the fake runtime's, which
// has no NIC; mode none on one that has) reports no network counters, and
// the guest's figures as before.
func TestUsageNoNetwork(t *testing.T) {
	t.Parallel()
	for name, opt := range map[string]func(*store.Sandbox, *Config){
		"no NIC":    nil,
		"mode none": withNIC("none", make(chan net.Conn, 1)),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var opts []func(*store.Sandbox, *Config)
			if opt != nil {
				opts = append(opts, opt)
			}
			h := newHarness(t, time.Hour, opts...)
			u, err := h.manager().SampleUsage(t.Context(), h.id)
			if err != nil || u.Network != nil || u.MemTotal == 0 || u.CPUs == 0 {
				t.Fatalf("usage: %+v (network %+v), %v", u, u.Network, err)
			}
			h.stop(t)
		})
	}
}
