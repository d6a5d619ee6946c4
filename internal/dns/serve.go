package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

// StreamIdleTimeout bounds the wait for the next query on a stream
// connection, and each response write.
const StreamIdleTimeout = 10 * time.Second

// ServeDNS answers one raw query received over UDP and returns the raw
// response, truncated (TC) to the guest's EDNS0 size clamped to [512, 1232]
// bytes, or nil when nothing must be sent. A message too short or broken to
// parse gets FORMERR when its header can be read, else nil.
func (r *Resolver) ServeDNS(ctx context.Context, req []byte) []byte {
	return r.serve(ctx, req, false)
}

func (r *Resolver) serve(ctx context.Context, req []byte, stream bool) []byte {
	m := new(mdns.Msg)
	if err := m.Unpack(req); err != nil {
		return r.formErr(req)
	}
	resp := r.Handle(ctx, m)
	if resp == nil {
		return nil
	}
	size := mdns.MaxMsgSize
	if !stream {
		size = minUDPSize
		if opt := m.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), minUDPSize), maxUDPSize)
		}
	}
	resp.Truncate(size)
	out, err := resp.Pack()
	if err != nil {
		fail := reply(m, mdns.RcodeServerFailure, &Event{}, "", "")
		if out, err = fail.Pack(); err != nil {
			return nil
		}
	}
	return out
}

// formErr answers an unparseable message with a bare FORMERR header, or
// returns nil if it has no header or claims to be a response.
func (r *Resolver) formErr(req []byte) []byte {
	ev := Event{Time: r.cfg.Clock(), Rcode: "DROP", RuleID: "query:malformed", Reason: "message does not parse"}
	var out []byte
	if len(req) >= 12 && req[2]&0x80 == 0 && r.limiter.AllowN(r.cfg.Clock(), 1) {
		out = make([]byte, 12)
		copy(out, req[:2])
		out[2] = 0x80 | req[2]&0x79 // QR, opcode and RD echoed
		out[3] = 0x80 | mdns.RcodeFormatError
		ev.Rcode = "FORMERR"
	}
	if r.cfg.Audit != nil {
		r.cfg.Audit(ev)
	}
	return out
}

// ServePacket serves datagrams read from pc until ctx is done or pc fails,
// then waits for the queries it started. At most 2*MaxInflight queries are
// handled at once; datagrams beyond that are dropped. The caller owns pc.
func (r *Resolver) ServePacket(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { _ = pc.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, 2*r.cfg.MaxInflight)
	buf := make([]byte, mdns.MaxMsgSize)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			r.cfg.Logger.DebugContext(ctx, "dns query dropped: too many in flight")
			continue
		}
		pkt := append([]byte(nil), buf[:n]...)
		wg.Go(func() {
			defer func() { <-sem }()
			if out := r.ServeDNS(ctx, pkt); out != nil {
				_, _ = pc.WriteTo(out, addr)
			}
		})
	}
}

// ServeStream serves queries framed with a two-byte length (RFC 1035 4.2.2)
// on c, one at a time, until c ends, ctx is done, StreamIdleTimeout passes
// without a query, or a frame is malformed; all of these return nil, as the
// guest ends streams at will. It closes c.
func (r *Resolver) ServeStream(ctx context.Context, c net.Conn) error {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	for {
		if c.SetReadDeadline(time.Now().Add(StreamIdleTimeout)) != nil {
			return nil // closed
		}
		var l [2]byte
		if _, err := readFull(c, l[:]); err != nil {
			return nil
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if n < 12 {
			return nil
		}
		msg := make([]byte, n)
		if _, err := readFull(c, msg); err != nil {
			return nil
		}
		out := r.serve(ctx, msg, true)
		if out == nil {
			continue
		}
		if c.SetWriteDeadline(time.Now().Add(StreamIdleTimeout)) != nil {
			return nil
		}
		if err := writeFrame(c, out); err != nil {
			return nil
		}
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
