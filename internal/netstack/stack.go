package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

const (
	nicID = 1
	// outQueueLen bounds frames queued for the guest; gVisor drops beyond it.
	outQueueLen = 1024
)

// Stack is one sandbox's user-space network. Create it with New, feed it a
// link with ServeLink, and end it with Close. Its methods are safe for
// concurrent use.
type Stack struct {
	cfg    Config
	ns     *stack.Stack
	link   *channel.Endpoint
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	udpSem  chan struct{} // UDP dials in flight
	pingSem chan struct{} // Ping calls in flight
	serving atomic.Bool   // a ServeLink is running
	active  atomic.Int64  // TCP conns + UDP flows, dialling or established
	stats   counters

	mu     sync.Mutex
	closed bool
	conns  map[io.Closer]struct{} // guest and upstream conns, closed by Close
	wg     sync.WaitGroup         // every goroutine the stack started or adopted
}

// ErrClosed is returned by ServeLink on a closed Stack.
var ErrClosed = errors.New("netstack closed")

// ErrLinkBusy is returned by ServeLink while another ServeLink runs.
var ErrLinkBusy = errors.New("netstack link already served")

// New builds a Stack from cfg (see Config for defaults). It starts no
// goroutines until ServeLink or guest traffic. The caller must Close it.
func New(cfg Config) (*Stack, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("netstack config: %w", err)
	}
	cfg = cfg.withDefaults()

	ns := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	link := channel.New(outQueueLen, uint32(cfg.MTU), macAddr(cfg.GatewayMAC))
	ok := false
	defer func() {
		if !ok {
			ns.Close()
			ns.Wait()
		}
	}()
	if err := ns.CreateNIC(nicID, ethernet.New(link)); err != nil {
		return nil, fmt.Errorf("create nic: %s", err)
	}
	if err := ns.SetPromiscuousMode(nicID, true); err != nil {
		return nil, fmt.Errorf("promiscuous mode: %s", err)
	}
	if err := ns.SetSpoofing(nicID, true); err != nil {
		return nil, fmt.Errorf("spoofing: %s", err)
	}
	gw := tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpAddr(cfg.GatewayIP), PrefixLen: 24},
	}
	if err := ns.AddProtocolAddress(nicID, gw, stack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("add gateway address: %s", err)
	}
	if err := ns.AddStaticNeighbor(nicID, ipv4.ProtocolNumber, tcpAddr(cfg.GuestIP), macAddr(cfg.GuestMAC)); err != nil {
		return nil, fmt.Errorf("add guest neighbour: %s", err)
	}
	ns.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})

	ctx, cancel := context.WithCancel(context.Background())
	s := &Stack{
		cfg:     cfg,
		ns:      ns,
		link:    link,
		ctx:     ctx,
		cancel:  cancel,
		udpSem:  make(chan struct{}, cfg.MaxInflightDials),
		pingSem: make(chan struct{}, cfg.MaxInflightDials),
		conns:   make(map[io.Closer]struct{}),
	}
	tcpFwd := tcp.NewForwarder(ns, 0, cfg.MaxInflightDials, s.handleTCP)
	ns.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(ns, s.handleUDP)
	ns.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	ok = true
	return s, nil
}

// Close stops the stack: it cancels dials in flight, closes every proxied
// connection on both sides, stops ServeLink and waits for all of the stack's
// goroutines. It is idempotent and always returns nil.
func (s *Stack) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()

	s.cancel()
	for c := range conns {
		_ = c.Close()
	}
	s.link.Close()
	s.ns.Close()
	s.wg.Wait()
	s.ns.Wait()
	return nil
}

// track registers a goroutine that the stack owns; it reports false (and
// registers nothing) once Close has begun.
func (s *Stack) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// addConns registers conns for Close; it reports false, having closed them,
// if the stack is already closed.
func (s *Stack) addConns(cs ...io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		s.conns[c] = struct{}{}
	}
	return true
}

func (s *Stack) removeConns(cs ...io.Closer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		delete(s.conns, c)
	}
}

// reserveConn takes one of the MaxConns slots.
func (s *Stack) reserveConn() bool {
	if s.active.Add(1) > int64(s.cfg.MaxConns) {
		s.active.Add(-1)
		return false
	}
	return true
}

func (s *Stack) releaseConn() { s.active.Add(-1) }

// tcpAddr converts a netip IPv4 address to tcpip form.
func tcpAddr(a netip.Addr) tcpip.Address { return tcpip.AddrFrom4(a.As4()) }

// netipAddr converts a tcpip address to netip form (invalid if neither 4 nor
// 16 bytes).
func netipAddr(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}

func macAddr(m []byte) tcpip.LinkAddress { return tcpip.LinkAddress(m) }
