package netstack

import (
	"context"
	"encoding/binary"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// PingFunc is the echo hook: it decides whether the guest may ping dst and,
// if so, sends one ICMP echo request carrying data from the host and
// waits for the reply. A nil error means a reply came: the stack then
// answers the guest's request with an echo reply from dst. Any error
// means no answer (the guest's ping times out). ctx carries
// [Config.PingTimeout] and is cancelled by [Stack.Close]. It is called
// concurrently, at most [Config.MaxInflightDials] times at once; requests
// beyond that are dropped and reported to [Config.Busy].
type PingFunc func(ctx context.Context, dst netip.Addr, data []byte) error

// maxEchoData caps the payload of an echo request passed to Ping (ping's
// default is 56 bytes; larger requests are dropped).
const maxEchoData = 1472

// echoRequest parses ip, an IPv4 packet from the guest, as an ICMP echo
// request: unfragmented, without options, with a valid ICMP checksum.
func echoRequest(ip header.IPv4) (id, seq uint16, data []byte, ok bool) {
	if ip.HeaderLength() != header.IPv4MinimumSize || ip.More() || ip.FragmentOffset() != 0 {
		return 0, 0, nil, false
	}
	icmp := header.ICMPv4(ip.Payload())
	if len(icmp) < header.ICMPv4MinimumSize || len(icmp)-header.ICMPv4MinimumSize > maxEchoData ||
		icmp.Type() != header.ICMPv4Echo || icmp.Code() != 0 || checksum.Checksum(icmp, 0) != 0xffff {
		return 0, 0, nil, false
	}
	return icmp.Ident(), icmp.Sequence(), icmp.Payload(), true
}

// handleEcho hands a guest's echo request to Ping, off the frame loop, and
// queues the reply when Ping reports one. ip is the request's IPv4 packet
// (still in the frame loop's buffer: copied here).
func (s *Stack) handleEcho(ip header.IPv4) {
	id, seq, data, ok := echoRequest(ip)
	if !ok {
		return
	}
	dst := netip.AddrFrom4(ip.DestinationAddress().As4())
	select {
	case s.pingSem <- struct{}{}:
	default:
		s.stats.dialsBusy.Add(1)
		s.cfg.Busy("icmp", netip.AddrPortFrom(dst, 0), LimitDials)
		return
	}
	if !s.track() {
		<-s.pingSem
		return
	}
	data = append([]byte(nil), data...)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.pingSem }()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.PingTimeout)
		defer cancel()
		if err := s.cfg.Ping(ctx, dst, data); err != nil {
			return
		}
		s.stats.pingReplies.Add(1)
		frame := echoReplyFrame(s.cfg, dst, id, seq, data)
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
		var l stack.PacketBufferList
		l.PushBack(pkt)
		_, _ = s.link.WritePackets(l) // a full queue drops it, as gVisor does
		pkt.DecRef()
	}()
}

// echoReplyFrame is the Ethernet frame of an echo reply from src to the
// guest.
func echoReplyFrame(c Config, src netip.Addr, id, seq uint16, data []byte) []byte {
	frame := make([]byte, ethHeaderLen+header.IPv4MinimumSize+header.ICMPv4MinimumSize+len(data))
	header.Ethernet(frame).Encode(&header.EthernetFields{
		SrcAddr: macAddr(c.GatewayMAC), DstAddr: macAddr(c.GuestMAC), Type: header.IPv4ProtocolNumber,
	})
	ip := header.IPv4(frame[ethHeaderLen:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(frame) - ethHeaderLen),
		ID:          seq,
		TTL:         64,
		Protocol:    uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:     tcpip.AddrFrom4(src.As4()),
		DstAddr:     tcpAddr(c.GuestIP),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(ip[header.IPv4MinimumSize:])
	icmp.SetType(header.ICMPv4EchoReply)
	binary.BigEndian.PutUint16(icmp[4:], id)
	binary.BigEndian.PutUint16(icmp[6:], seq)
	copy(icmp[header.ICMPv4MinimumSize:], data)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	return frame
}

// defaultPingTimeout bounds one Ping call.
const defaultPingTimeout = 5 * time.Second
