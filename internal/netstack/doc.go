// Package netstack is the sandbox's user-space network: a gVisor TCP/IP stack
// that terminates every guest flow and re-originates it from the host through
// an egress hook. It is the only package in airlock that imports
// gvisor.dev/gvisor; no tcpip type crosses its API.
//
// The guest's virtio-net device is fed by QEMU's "-netdev stream" backend.
// [Stack.ServeLink] speaks that framing (a 4-byte big-endian length, then a raw
// Ethernet frame without FCS) over any io.ReadWriter.
//
// # Forwarding
//
// The stack owns the gateway address (default 10.0.2.2) and runs its NIC in
// promiscuous and spoofing mode, so a packet to any destination reaches it.
//
//   - TCP: on a guest SYN the stack calls [Config.Dial] first, under a timeout.
//     An error answers the SYN with RST, so the guest sees "connection refused"
//     at once and no handshake ever completes. On success the stack completes
//     the handshake and proxies both directions, passing half-closes through.
//     This is the order tailscale's forwardTCP uses: a guest never gets an
//     established connection to a destination the host could not or would not
//     reach.
//   - UDP: the first datagram of a flow (the guest's 4-tuple) creates an
//     endpoint and dials per flow with network "udp". Datagrams are relayed
//     until the flow has been idle for [Config.UDPIdle]. A refused flow is
//     dropped silently (no ICMP); its next datagram tries the hook again.
//   - ICMP echo requests (IPv4, unfragmented, no options, valid checksum,
//     at most 1472 bytes of data) go to [Config.Ping], when set, off the
//     frame loop and never into gVisor: the hook decides and pings from the
//     host; only when it reports a reply does the stack write an echo reply
//     from the destination to the guest (same id, sequence and data).
//     Requests beyond [Config.MaxInflightDials] in flight are dropped and
//     reported to [Config.Busy]. The stack itself answers no ICMP, not even
//     for the gateway.
//   - Everything else is dropped before it reaches gVisor and counted in
//     [Stats.FramesFiltered]: other ICMP (and echo requests without a
//     hook), IPv6, IPv4 options/protocols other than TCP and UDP, any
//     Ethernet type other than IPv4 and ARP, and IPv4 packets whose source is
//     not [Config.GuestIP] (anti-spoofing). ARP is answered for the gateway.
//
// The hook sees the destination the guest addressed, including the gateway
// itself; it alone decides (policy.Decide belongs there, not here).
//
// # Limits
//
//   - Dials in flight: TCP SYNs beyond [Config.MaxInflightDials] are dropped
//     by gVisor's forwarder, not refused; the guest's SYN retransmission (1 s,
//     then backing off) queues them until a slot frees. Dropped SYNs are counted
//     in [Stats.InflightDrops]. UDP flows beyond the same cap drop their
//     datagram and count in [Stats.DialsBusy].
//   - Connections: TCP connections plus UDP flows, dialling or established, are
//     capped at [Config.MaxConns]. A TCP SYN over the cap gets RST; a UDP
//     datagram over it is dropped. Both count in [Stats.DialsBusy].
//   - Frames: inbound frames are read into one MTU-sized buffer. A zero,
//     short or over-MTU length is skipped and counted in
//     [Stats.FramesDropped]. A length that QEMU itself would never send
//     (over 68 KiB) means the stream is desynchronised: it is counted and
//     ServeLink returns [ErrFrameLength]. Outbound frames wait in a bounded
//     queue; when it is full gVisor drops them.
//
// # Counters
//
// [Stack.Stats] counts dials, flows and frames. [Stats.BytesIn] and
// [Stats.BytesOut] are the bytes of the frames that crossed the link into the
// stack and out to the guest (whole Ethernet frames, not the stream's length
// words): what the guest sent and received, headers included. They are
// counted in the frame loop with one atomic add per frame.
//
// Not yet: ICMP other than echo (no unreachable messages: a refused flow is
// an RST or silence), IPv6, DHCP (the guest is configured statically), TCP
// keepalive or idle timeouts on proxied TCP, and an injected clock.
package netstack
