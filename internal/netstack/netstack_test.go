package netstack

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// socketPair returns both ends of a unix stream socketpair, as QEMU's
// "-netdev stream,addr.type=fd" would use.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// env is a Stack wired to an in-process gVisor "guest" stack over a socketpair.
type env struct {
	s     *Stack
	guest *stack.Stack
	// wire counts the bytes the guest wrote to and read from the link,
	// length words included.
	wire *countingConn
}

// countingConn counts the bytes read from and written to a conn.
type countingConn struct {
	net.Conn
	read, written atomic.Uint64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(uint64(n))
	return n, err
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := newGuestStack(t)
	hostEnd, guestConn := socketPair(t)
	guestEnd := &countingConn{Conn: guestConn}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.ServeLink(ctx, hostEnd); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("ServeLink: %v", err)
		}
	})
	wg.Go(func() { _ = runLink(ctx, g.ep, guestEnd, 1500, nil, &counters{}) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		s.Close()
		g.ns.Close()
		g.ns.Wait()
	})
	return &env{s: s, guest: g.ns, wire: guestEnd}
}

type guestStack struct {
	ns *stack.Stack
	ep *channel.Endpoint
}

func newGuestStack(t *testing.T) guestStack {
	t.Helper()
	ns := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep := channel.New(256, 1500, tcpip.LinkAddress(defaultGuestMAC))
	if err := ns.CreateNIC(1, ethernet.New(ep)); err != nil {
		t.Fatal(err)
	}
	addr := tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpAddr(defaultGuestIP), PrefixLen: 24},
	}
	if err := ns.AddProtocolAddress(1, addr, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	ns.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: tcpAddr(defaultGatewayIP), NIC: 1}})
	return guestStack{ns: ns, ep: ep}
}

func (e *env) dialTCP(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, e.guest, tcpip.FullAddress{NIC: 1, Addr: tcpAddr(dst.Addr()), Port: dst.Port()}, ipv4.ProtocolNumber)
}

// hook records calls and maps every allowed destination to target.
type hook struct {
	calls  atomic.Int64
	allow  func(network string, dst netip.AddrPort) bool
	target string
}

func (h *hook) dial(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error) {
	h.calls.Add(1)
	if h.allow != nil && !h.allow(network, dst) {
		return nil, errors.New("denied by test policy")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, h.target)
}

var (
	publicDst = netip.MustParseAddrPort("203.0.113.7:80")
	deniedDst = netip.MustParseAddrPort("198.51.100.9:443")
)

// listener is a 127.0.0.1 TCP server that answers "got:" + everything it
// read, after the client half-closes, then closes.
func listener(t *testing.T) (net.Listener, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			wg.Go(func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				_, _ = c.Write(append([]byte("got:"), b...))
			})
		}
	})
	return ln, &accepted
}

func TestTCPRoundTripHalfClose(t *testing.T) {
	ln, accepted := listener(t)
	h := &hook{target: ln.Addr().String()}
	var gotDst atomic.Value
	h.allow = func(network string, dst netip.AddrPort) bool { gotDst.Store(network + " " + dst.String()); return true }
	e := newEnv(t, Config{Dial: h.dial})

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := e.dialTCP(ctx, publicDst)
	if err != nil {
		t.Fatalf("guest dial: %v", err)
	}
	defer c.Close()
	payload := bytes.Repeat([]byte("x"), 200<<10) // several windows' worth
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil { // half-close: server sees EOF, then answers
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if want := append([]byte("got:"), payload...); !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d", len(got), len(want))
	}
	if accepted.Load() != 1 {
		t.Fatalf("listener accepted %d, want 1", accepted.Load())
	}
	if d := gotDst.Load(); d != "tcp "+publicDst.String() {
		t.Fatalf("hook saw %v", d)
	}
	st := e.s.Stats()
	if st.DialsAllowed != 1 || st.DialsDenied != 0 {
		t.Fatalf("stats %+v", st)
	}
	waitFor(t, func() bool { return e.s.Stats().ActiveConns == 0 }, "conn released")
}

// TestLinkByteCounts checks BytesIn and BytesOut against the bytes that
// crossed the link: exactly what the guest wrote and read, less one length
// word per frame; and at least the payload, with at most a full set of
// Ethernet, IPv4 and TCP headers (options included) on each frame.
func TestLinkByteCounts(t *testing.T) {
	ln, _ := listener(t)
	e := newEnv(t, Config{Dial: (&hook{target: ln.Addr().String()}).dial})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := e.dialTCP(ctx, publicDst)
	if err != nil {
		t.Fatalf("guest dial: %v", err)
	}
	const sent = 100 << 10
	if _, err := c.Write(bytes.Repeat([]byte("x"), sent)); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != len("got:")+sent {
		t.Fatalf("read %d bytes (%v), want %d", len(got), err, len("got:")+sent)
	}
	c.Close()

	// Once the link is quiet, every frame the guest wrote was counted in,
	// and every frame counted out reached the guest.
	var st Stats
	waitFor(t, func() bool {
		st = e.s.Stats()
		return st.ActiveConns == 0 && st.FramesFiltered == 0 && st.FramesDropped == 0 &&
			st.BytesIn+4*st.FramesIn == e.wire.written.Load() &&
			st.BytesOut+4*st.FramesOut == e.wire.read.Load()
	}, "link counters to match the bytes the guest wrote and read")
	t.Logf("in: %d bytes in %d frames; out: %d bytes in %d frames", st.BytesIn, st.FramesIn, st.BytesOut, st.FramesOut)
	// The smallest frame is an ARP one, the largest overhead a TCP segment
	// with full IPv4 and TCP options.
	const (
		minFrame   = ethHeaderLen + header.ARPSize
		maxHeaders = ethHeaderLen + header.IPv4MaximumHeaderSize + header.TCPHeaderMaximumSize
	)
	for _, d := range []struct {
		name          string
		bytes, frames uint64
		payload       uint64
	}{
		{"in", st.BytesIn, st.FramesIn, sent},
		{"out", st.BytesOut, st.FramesOut, uint64(len(got))},
	} {
		if d.frames == 0 || d.bytes < d.payload+d.frames*minFrame || d.bytes > d.payload+d.frames*maxHeaders {
			t.Errorf("%s: %d bytes in %d frames for %d bytes of payload, want %d..%d", d.name, d.bytes, d.frames, d.payload,
				d.payload+d.frames*minFrame, d.payload+d.frames*maxHeaders)
		}
	}
}

func TestTCPRefusedBeforeHandshake(t *testing.T) {
	ln, accepted := listener(t)
	h := &hook{target: ln.Addr().String(), allow: func(_ string, dst netip.AddrPort) bool { return dst != deniedDst }}
	e := newEnv(t, Config{Dial: h.dial})

	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := e.dialTCP(ctx, deniedDst)
	if err == nil {
		c.Close()
		t.Fatal("guest dial to denied destination succeeded")
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("refusal took %v, want < 1s", el)
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Fatalf("err = %v, want connection refused", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("listener saw %d connections for a denied dial", n)
	}
	st := e.s.Stats()
	if st.DialsDenied != 1 || st.DialsAllowed != 0 || st.ActiveConns != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestUDPEcho(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], a)
		}
	}()
	var nets sync.Map
	h := &hook{target: pc.LocalAddr().String(), allow: func(n string, _ netip.AddrPort) bool { nets.Store(n, true); return true }}
	e := newEnv(t, Config{Dial: h.dial, UDPIdle: 300 * time.Millisecond})

	dst := netip.MustParseAddrPort("203.0.113.53:53")
	c, err := gonet.DialUDP(e.guest, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpAddr(dst.Addr()), Port: dst.Port()}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for i := range 3 {
		msg := []byte{'p', 'i', 'n', 'g', byte('0' + i)}
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], msg) {
			t.Fatalf("echo %q, want %q", buf[:n], msg)
		}
	}
	if _, ok := nets.Load("udp"); !ok || h.calls.Load() != 1 {
		t.Fatalf("hook calls %d, want 1 udp dial for one flow", h.calls.Load())
	}
	waitFor(t, func() bool { return e.s.Stats().ActiveConns == 0 }, "idle flow closed")
}

func TestInflightDialCap(t *testing.T) {
	ln, accepted := listener(t)
	release := make(chan struct{})
	var calls atomic.Int64
	dial := func(ctx context.Context, network string, _ netip.AddrPort) (net.Conn, error) {
		calls.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		var d net.Dialer
		return d.DialContext(ctx, network, ln.Addr().String())
	}
	const limit = 2
	e := newEnv(t, Config{Dial: dial, MaxInflightDials: limit})

	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, limit+1)
	for range limit + 1 {
		wg.Go(func() {
			c, err := e.dialTCP(ctx, publicDst)
			if err == nil {
				c.Close()
			}
			errs <- err
		})
	}
	waitFor(t, func() bool { return calls.Load() == limit }, "dials in flight")
	time.Sleep(200 * time.Millisecond)
	if n := calls.Load(); n != limit {
		t.Fatalf("%d dials in flight, cap is %d", n, limit)
	}
	if e.s.Stats().InflightDrops == 0 {
		t.Fatal("no SYN counted as dropped at the cap")
	}
	// The N+1th SYN was dropped, not refused: once the cap frees, the guest's
	// retransmission gets it through.
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
	}
	waitFor(t, func() bool { return accepted.Load() == limit+1 }, "all connections reach the listener")
}

func TestConnCap(t *testing.T) {
	ln, _ := listener(t)
	h := &hook{target: ln.Addr().String()}
	var mu sync.Mutex
	var busy []string
	e := newEnv(t, Config{Dial: h.dial, MaxConns: 1, Busy: func(proto string, dst netip.AddrPort, limit string) {
		mu.Lock()
		defer mu.Unlock()
		busy = append(busy, proto+" "+dst.String()+" "+limit)
	}})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c1, err := e.dialTCP(ctx, publicDst)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if c2, err := e.dialTCP(ctx, publicDst); err == nil {
		c2.Close()
		t.Fatal("second connection over MaxConns=1 succeeded")
	}
	if st := e.s.Stats(); st.DialsBusy != 1 || h.calls.Load() != 1 {
		t.Fatalf("stats %+v, hook calls %d", st, h.calls.Load())
	}
	// The refusal is reported to Busy (the audit trail's net.busy).
	mu.Lock()
	defer mu.Unlock()
	if want := "tcp " + publicDst.String() + " " + LimitConns; len(busy) != 1 || busy[0] != want {
		t.Errorf("Busy calls %q, want [%q]", busy, want)
	}
}

// frame writes one length-prefixed frame with an arbitrary length word.
func frame(w io.Writer, n uint32, body []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], n)
	_, err := w.Write(append(hdr[:], body...))
	return err
}

// arpRequest is a well-formed ARP who-has for the gateway from the guest.
func arpRequest() []byte {
	b := make([]byte, header.EthernetMinimumSize+header.ARPSize)
	eth := header.Ethernet(b)
	eth.Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(defaultGuestMAC), DstAddr: header.EthernetBroadcastAddress, Type: header.ARPProtocolNumber})
	a := header.ARP(b[header.EthernetMinimumSize:])
	a.SetIPv4OverEthernet()
	a.SetOp(header.ARPRequest)
	copy(a.HardwareAddressSender(), defaultGuestMAC)
	gip, gw := defaultGuestIP.As4(), defaultGatewayIP.As4()
	copy(a.ProtocolAddressSender(), gip[:])
	copy(a.ProtocolAddressTarget(), gw[:])
	return b
}

func TestHostileFrames(t *testing.T) {
	s, err := New(Config{Dial: (&hook{}).dial})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	host, peer := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- s.ServeLink(t.Context(), host) }()

	// Drain whatever the stack sends back, and note an ARP reply.
	gotARPReply := make(chan struct{}, 1)
	go func() {
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(peer, hdr[:]); err != nil {
				return
			}
			b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(peer, b); err != nil {
				return
			}
			if len(b) >= 42 && header.Ethernet(b).Type() == header.ARPProtocolNumber && header.ARP(b[14:]).Op() == header.ARPReply {
				select {
				case gotARPReply <- struct{}{}:
				default:
				}
			}
		}
	}()

	rng := rand.New(rand.NewPCG(1, 2))
	var wantDropped uint64
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Zero and short lengths.
	must(frame(peer, 0, nil))
	must(frame(peer, 5, []byte("short")))
	wantDropped += 2
	// Over-MTU but within the stream limit: skipped, stream stays in sync.
	must(frame(peer, 9000, make([]byte, 9000)))
	wantDropped++
	// Random garbage of plausible sizes, some dressed as IPv4 from the guest
	// so they reach gVisor's parsers.
	gip := defaultGuestIP.As4()
	for i := range 2000 {
		b := make([]byte, 14+rng.IntN(1500))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if i%2 == 0 && len(b) >= 34 {
			binary.BigEndian.PutUint16(b[12:], uint16(header.IPv4ProtocolNumber))
			b[14] = 0x45
			b[23] = []byte{6, 17}[i%4/2]
			copy(b[26:30], gip[:])
		}
		must(frame(peer, uint32(len(b)), b))
	}
	// A valid ARP request still gets answered after all that.
	must(frame(peer, uint32(len(arpRequest())), arpRequest()))
	select {
	case <-gotARPReply:
	case <-time.After(3 * time.Second):
		t.Fatal("no ARP reply after hostile frames: stream desynchronised or stack wedged")
	}
	st := s.Stats()
	if st.FramesDropped != wantDropped {
		t.Fatalf("FramesDropped = %d, want %d (%+v)", st.FramesDropped, wantDropped, st)
	}
	if st.FramesFiltered == 0 || st.FramesIn == 0 {
		t.Fatalf("stats %+v", st)
	}
	// A length no QEMU sends: counted, and the link ends with ErrFrameLength
	// without allocating for it.
	must(frame(peer, 0xFFFFFFFF, nil))
	select {
	case err := <-done:
		if !errors.Is(err, ErrFrameLength) {
			t.Fatalf("ServeLink = %v, want ErrFrameLength", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("ServeLink did not return on a huge length")
	}
	if got := s.Stats().FramesDropped; got != wantDropped+1 {
		t.Fatalf("FramesDropped = %d, want %d", got, wantDropped+1)
	}
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without Dial succeeded")
	}
	if _, err := New(Config{Dial: (&hook{}).dial, MTU: 100}); err == nil {
		t.Fatal("New with MTU 100 succeeded")
	}
	s, err := New(Config{Dial: (&hook{}).dial})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.Close() // idempotent
	if err := s.ServeLink(t.Context(), &bytes.Buffer{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("ServeLink after Close = %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// handoff is an upstream conn that handles the guest side itself.
type handoff struct {
	net.Conn
	got chan []byte
}

func (h *handoff) HandleGuest(guest net.Conn) {
	b, _ := io.ReadAll(guest)
	_, _ = guest.Write([]byte("handled"))
	h.got <- b
}

func TestGuestHandlerTakesOver(t *testing.T) {
	up, _ := net.Pipe()
	h := &handoff{Conn: up, got: make(chan []byte, 1)}
	e := newEnv(t, Config{Dial: func(context.Context, string, netip.AddrPort) (net.Conn, error) { return h, nil }})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := e.dialTCP(ctx, publicDst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("to handler"))
	_ = c.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, _ := io.ReadAll(c)
	if string(reply) != "handled" || string(<-h.got) != "to handler" {
		t.Fatalf("reply %q", reply)
	}
	waitFor(t, func() bool { return e.s.Stats().ActiveConns == 0 }, "conn released")
}

func TestDialGuest(t *testing.T) {
	e := newEnv(t, Config{Dial: (&hook{}).dial})
	ln, err := gonet.ListenTCP(e.guest, tcpip.FullAddress{NIC: 1, Addr: tcpAddr(defaultGuestIP), Port: 8000}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("from " + c.RemoteAddr().String()))
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := e.s.DialGuest(ctx, 8000)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "from "+defaultGatewayIP.String()+":") {
		t.Fatalf("guest saw %q", b)
	}
	if e.s.Stats().ActiveConns != 1 {
		t.Fatalf("active %d, want 1 before close", e.s.Stats().ActiveConns)
	}
	c.Close()
	if e.s.Stats().ActiveConns != 0 {
		t.Fatal("slot not released")
	}
	if _, err := e.s.DialGuest(ctx, 8001); err == nil {
		t.Fatal("dial to a closed guest port succeeded")
	}
}
