package netstack

import "sync/atomic"

// The caps a Config.Busy call names.
const (
	LimitConns = "max_conns"       // Config.MaxConns
	LimitDials = "dials_in_flight" // Config.MaxInflightDials
)

// Stats is a snapshot of a Stack's counters.
type Stats struct {
	// DialsAllowed counts Dial calls that returned a conn.
	DialsAllowed uint64
	// DialsDenied counts Dial calls that returned an error (policy refusal,
	// upstream failure or timeout alike).
	DialsDenied uint64
	// DialsBusy counts flows refused or dropped before Dial because
	// MaxConns (TCP, UDP) or MaxInflightDials (UDP) was reached.
	DialsBusy uint64
	// InflightDrops counts TCP SYNs dropped because MaxInflightDials dials
	// were in flight; the guest retransmits them.
	InflightDrops uint64
	// FramesIn and FramesOut count frames passed to and from the stack:
	// FramesIn those from the guest that entered it, FramesOut those it
	// wrote to the guest.
	FramesIn, FramesOut uint64
	// BytesIn and BytesOut are the sizes of the frames FramesIn and
	// FramesOut count: whole Ethernet frames (14-byte header and IP packet,
	// no FCS), without the stream's 4-byte length word. Payload carried
	// over TCP or UDP is therefore counted with its headers: at least 54
	// bytes more per TCP frame (Ethernet, IPv4, TCP without options), 42
	// per UDP datagram, plus the frames that carry no payload (ARP,
	// handshakes, ACKs).
	BytesIn, BytesOut uint64
	// FramesDropped counts malformed frames from the link: zero, short or
	// over-MTU lengths, and a desynchronising length.
	FramesDropped uint64
	// FramesFiltered counts well-formed frames that do not enter the
	// stack: non-IPv4/ARP, ICMP and other IP protocols, spoofed sources
	// (echo requests handed to Config.Ping among them).
	FramesFiltered uint64
	// PingReplies counts echo replies sent to the guest (Config.Ping).
	PingReplies uint64
	// ActiveConns is TCP connections plus UDP flows, dialling or established.
	ActiveConns int64
}

type counters struct {
	dialsAllowed, dialsDenied, dialsBusy atomic.Uint64
	framesIn, framesOut                  atomic.Uint64
	bytesIn, bytesOut                    atomic.Uint64
	framesDropped, framesFiltered        atomic.Uint64
	pingReplies                          atomic.Uint64
}

// Stats returns a snapshot of the counters. Safe for concurrent use.
func (s *Stack) Stats() Stats {
	return Stats{
		DialsAllowed:   s.stats.dialsAllowed.Load(),
		DialsDenied:    s.stats.dialsDenied.Load(),
		DialsBusy:      s.stats.dialsBusy.Load(),
		InflightDrops:  s.ns.Stats().TCP.ForwardMaxInFlightDrop.Value(),
		FramesIn:       s.stats.framesIn.Load(),
		FramesOut:      s.stats.framesOut.Load(),
		BytesIn:        s.stats.bytesIn.Load(),
		BytesOut:       s.stats.bytesOut.Load(),
		FramesDropped:  s.stats.framesDropped.Load(),
		FramesFiltered: s.stats.framesFiltered.Load(),
		PingReplies:    s.stats.pingReplies.Load(),
		ActiveConns:    s.active.Load(),
	}
}
