package netstack

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// maxStreamFrame is the largest length QEMU's stream backend ever sends
// (NET_BUFSIZE less the length word); anything larger means the stream is
// desynchronised.
const maxStreamFrame = 68 << 10

// ErrFrameLength is returned by ServeLink when a length prefix is larger than
// any frame QEMU sends: the stream cannot be resynchronised.
var ErrFrameLength = errors.New("netstack: frame length beyond stream limit")

// ServeLink runs the frame loop over rw, a "-netdev stream" socket: each frame
// is a 4-byte big-endian length and a raw Ethernet frame. It blocks until ctx
// is cancelled (returning ctx.Err()), Close is called or the peer closes the
// stream (returning nil), or rw fails or desynchronises (returning that error).
// Only one ServeLink may run at a time; another returns ErrLinkBusy. When ctx
// ends or the Stack closes, ServeLink unblocks rw by setting a past deadline
// if rw has SetDeadline, or else by closing it if it is an io.Closer.
// Otherwise the caller owns rw and closes it after ServeLink returns.
func (s *Stack) ServeLink(ctx context.Context, rw io.ReadWriter) error {
	if !s.track() {
		return ErrClosed
	}
	defer s.wg.Done()
	if !s.serving.CompareAndSwap(false, true) {
		return ErrLinkBusy
	}
	defer s.serving.Store(false)

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	err := runLink(lctx, s.link, rw, s.cfg.MTU, s.guestFilter, &s.stats)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case s.ctx.Err() != nil, errors.Is(err, io.EOF):
		return nil
	}
	return err
}

// guestFilter reports whether a frame from the guest may enter the stack:
// ARP, or IPv4 TCP/UDP from the guest's own address. An ICMP echo request
// from that address goes to the Ping hook instead, when there is one.
func (s *Stack) guestFilter(frame []byte) bool {
	switch header.Ethernet(frame).Type() {
	case header.ARPProtocolNumber:
		return true
	case header.IPv4ProtocolNumber:
	default:
		return false
	}
	ip := header.IPv4(frame[ethHeaderLen:])
	if !ip.IsValid(len(ip)) {
		return false
	}
	if ip.SourceAddress() != tcpAddr(s.cfg.GuestIP) {
		return false
	}
	switch ip.Protocol() {
	case uint8(header.TCPProtocolNumber), uint8(header.UDPProtocolNumber):
		return true
	case uint8(header.ICMPv4ProtocolNumber):
		if s.cfg.Ping != nil {
			s.handleEcho(ip) // answered (or not) outside gVisor
		}
	}
	return false
}

// runLink pumps frames between rw and ep until ctx ends or either direction
// fails. filter, if not nil, vets each inbound frame. Counters go to c.
func runLink(ctx context.Context, ep *channel.Endpoint, rw io.ReadWriter, mtu int, filter func([]byte) bool, c *counters) error {
	stop := context.AfterFunc(ctx, func() {
		if d, ok := rw.(interface{ SetDeadline(time.Time) error }); ok {
			_ = d.SetDeadline(time.Unix(1, 0))
		} else if cl, ok := rw.(io.Closer); ok {
			_ = cl.Close()
		}
	})
	defer stop()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg         sync.WaitGroup
		rerr, werr error
	)
	wg.Go(func() {
		defer cancel()
		rerr = readFrames(rw, ep, mtu, filter, c)
	})
	wg.Go(func() {
		defer cancel()
		werr = writeFrames(ctx, rw, ep, c)
	})
	wg.Wait()
	if rerr != nil && !isDeadline(rerr) {
		return rerr
	}
	if werr != nil && !isDeadline(werr) {
		return werr
	}
	return nil
}

func isDeadline(err error) bool {
	var ne net.Error
	return errors.Is(err, net.ErrClosed) || (errors.As(err, &ne) && ne.Timeout())
}

// readFrames reads length-prefixed frames from r into one reused buffer and
// injects them into ep. It returns io.EOF at a clean EOF between frames.
func readFrames(r io.Reader, ep *channel.Endpoint, mtu int, filter func([]byte) bool, c *counters) error {
	br := bufio.NewReaderSize(r, 64<<10)
	buf := make([]byte, mtu+ethHeaderLen)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxStreamFrame {
			c.framesDropped.Add(1)
			return ErrFrameLength
		}
		if n < ethHeaderLen || n > uint32(len(buf)) {
			c.framesDropped.Add(1)
			if _, err := br.Discard(int(n)); err != nil {
				return eofUnexpected(err)
			}
			continue
		}
		frame := buf[:n]
		if _, err := io.ReadFull(br, frame); err != nil {
			return eofUnexpected(err)
		}
		if filter != nil && !filter(frame) {
			c.framesFiltered.Add(1)
			continue
		}
		// MakeWithData copies, so buf can be reused.
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
		ep.InjectInbound(0, pkt)
		pkt.DecRef()
		c.framesIn.Add(1)
		c.bytesIn.Add(uint64(n))
	}
}

func eofUnexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// writeFrames writes frames queued by the stack to w, flushing whenever the
// queue is empty.
func writeFrames(ctx context.Context, w io.Writer, ep *channel.Endpoint, c *counters) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	var hdr [4]byte
	for {
		pkt := ep.ReadContext(ctx)
		if pkt == nil {
			return nil // ctx ended
		}
		size := pkt.Size()
		binary.BigEndian.PutUint32(hdr[:], uint32(size))
		_, err := bw.Write(hdr[:])
		for _, b := range pkt.AsSlices() {
			if err != nil {
				break
			}
			_, err = bw.Write(b)
		}
		pkt.DecRef()
		if err == nil && ep.NumQueued() == 0 {
			err = bw.Flush()
		}
		if err != nil {
			return err
		}
		c.framesOut.Add(1)
		c.bytesOut.Add(uint64(size))
	}
}
