// Package guesttest is a simulated guest for tests of the sandbox network:
// a second gVisor stack, configured like a real guest (10.0.2.15/24, default
// route via 10.0.2.2), speaking QEMU's "-netdev stream" framing on a conn.
// Packages other than internal/netstack use it to drive a netstack.Stack
// without booting a VM and without importing gVisor themselves.
package guesttest

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// Addresses of the simulated guest (the netstack defaults).
var (
	GuestIP   = netip.MustParseAddr("10.0.2.15")
	GatewayIP = netip.MustParseAddr("10.0.2.2")
	guestMAC  = tcpip.LinkAddress([]byte{0x52, 0x54, 0x00, 0x12, 0x34, 0x56})
)

// Guest is a running simulated guest.
type Guest struct {
	ns      *stack.Stack
	ep      *channel.Endpoint
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	link    net.Conn
	wmu     sync.Mutex  // serialises frames written to link
	replies chan []byte // ICMP echo replies to the guest (IPv4 packets)
}

// Start runs a guest whose NIC is link (the guest end of a socketpair whose
// other end the netstack serves). Close stops it.
func Start(link net.Conn) (*Guest, error) {
	ns := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep := channel.New(512, 1500, guestMAC)
	if err := ns.CreateNIC(1, ethernet.New(ep)); err != nil {
		return nil, fmt.Errorf("create nic: %s", err)
	}
	addr := tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(GuestIP.As4()), PrefixLen: 24},
	}
	if err := ns.AddProtocolAddress(1, addr, stack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("add address: %s", err)
	}
	ns.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(GatewayIP.As4()), NIC: 1}})
	ctx, cancel := context.WithCancel(context.Background())
	g := &Guest{ns: ns, ep: ep, cancel: cancel, link: link, replies: make(chan []byte, 16)}
	g.wg.Go(func() {
		defer cancel()
		br := bufio.NewReaderSize(link, 64<<10)
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return
			}
			frame := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(br, frame); err != nil {
				return
			}
			if ip, ok := echoReply(frame); ok {
				select {
				case g.replies <- ip:
				default:
				}
				continue
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
			ep.InjectInbound(0, pkt)
			pkt.DecRef()
		}
	})
	g.wg.Go(func() {
		defer link.Close()
		for {
			pkt := ep.ReadContext(ctx)
			if pkt == nil {
				return
			}
			b := pkt.ToView().AsSlice()
			out := make([]byte, 4+len(b))
			binary.BigEndian.PutUint32(out, uint32(len(b)))
			copy(out[4:], b)
			pkt.DecRef()
			if err := g.write(out); err != nil {
				return
			}
		}
	})
	context.AfterFunc(ctx, func() { _ = link.Close() })
	return g, nil
}

// Close stops the guest.
func (g *Guest) Close() {
	g.cancel()
	g.wg.Wait()
	g.ep.Close()
	g.ns.Close()
	g.ns.Wait()
}

// DialTCP connects from the guest to dst.
func (g *Guest) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, g.ns, full(dst), ipv4.ProtocolNumber)
}

// DialUDP opens a connected UDP socket from the guest to dst.
func (g *Guest) DialUDP(dst netip.AddrPort) (net.Conn, error) {
	fa := full(dst)
	return gonet.DialUDP(g.ns, nil, &fa, ipv4.ProtocolNumber)
}

// ListenTCP listens on the guest's port.
func (g *Guest) ListenTCP(port uint16) (net.Listener, error) {
	return gonet.ListenTCP(g.ns, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(GuestIP.As4()), Port: port}, ipv4.ProtocolNumber)
}

func full(dst netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(dst.Addr().Unmap().As4()), Port: dst.Port()}
}

func (g *Guest) write(b []byte) error {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	_, err := g.link.Write(b)
	return err
}

// gatewayMAC is the netstack's default MAC (the guest's next hop).
var gatewayMAC = tcpip.LinkAddress([]byte{0x52, 0x55, 0x0a, 0x00, 0x02, 0x02})

// Ping sends one ICMP echo request (id, seq, data) from the guest to dst
// and waits for the matching echo reply until ctx ends (its error then).
// The simulated guest's stack has no ICMP of its own: the request is a
// frame written to the link, and echo replies are taken off the link
// before the stack sees them. One Ping at a time.
func (g *Guest) Ping(ctx context.Context, dst netip.Addr, id, seq uint16, data []byte) error {
	frame := make([]byte, header.EthernetMinimumSize+header.IPv4MinimumSize+header.ICMPv4MinimumSize+len(data))
	header.Ethernet(frame).Encode(&header.EthernetFields{SrcAddr: guestMAC, DstAddr: gatewayMAC, Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(ip)), ID: seq, TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(GuestIP.As4()), DstAddr: tcpip.AddrFrom4(dst.Unmap().As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(ip[header.IPv4MinimumSize:])
	icmp.SetType(header.ICMPv4Echo)
	icmp.SetIdent(id)
	icmp.SetSequence(seq)
	copy(icmp[header.ICMPv4MinimumSize:], data)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	out := make([]byte, 4+len(frame))
	binary.BigEndian.PutUint32(out, uint32(len(frame)))
	copy(out[4:], frame)
	if err := g.write(out); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-g.replies:
			rip := header.IPv4(r)
			ricmp := header.ICMPv4(rip.Payload())
			if netip.AddrFrom4(rip.SourceAddress().As4()) == dst.Unmap() && ricmp.Ident() == id && ricmp.Sequence() == seq &&
				string(ricmp.Payload()) == string(data) && checksum.Checksum(ricmp, 0) == 0xffff && rip.IsChecksumValid() {
				return nil
			}
		}
	}
}

// echoReply reports whether frame is an IPv4 ICMP echo reply to the
// guest, and returns its IPv4 packet.
func echoReply(frame []byte) (header.IPv4, bool) {
	if len(frame) < header.EthernetMinimumSize+header.IPv4MinimumSize || header.Ethernet(frame).Type() != header.IPv4ProtocolNumber {
		return nil, false
	}
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) || ip.Protocol() != uint8(header.ICMPv4ProtocolNumber) {
		return nil, false
	}
	icmp := header.ICMPv4(ip.Payload())
	if len(icmp) < header.ICMPv4MinimumSize || icmp.Type() != header.ICMPv4EchoReply {
		return nil, false
	}
	return ip, true
}
