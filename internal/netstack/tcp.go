package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// handleTCP runs, on a goroutine gVisor starts, for each guest SYN the
// forwarder admits (at most MaxInflightDials at once). It dials upstream
// first and only then completes the guest's handshake; any failure answers the
// SYN with RST.
func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	if !s.track() {
		r.Complete(true)
		return
	}
	defer s.wg.Done()

	id := r.ID()
	dst := netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort)
	log := s.cfg.Logger
	if !s.reserveConn() {
		s.stats.dialsBusy.Add(1)
		s.cfg.Busy("tcp", dst, LimitConns)
		log.Debug("tcp refused: connection cap", "dst", dst)
		r.Complete(true)
		return
	}
	handedOff := false
	defer func() {
		if !handedOff {
			s.releaseConn()
		}
	}()

	dctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	up, err := s.cfg.Dial(dctx, "tcp", dst)
	cancel()
	if err != nil {
		s.stats.dialsDenied.Add(1)
		log.Debug("tcp refused", "dst", dst, "err", err)
		r.Complete(true)
		return
	}
	s.stats.dialsAllowed.Add(1)

	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		// The guest gave up or the handshake failed; tcpip errors stop here.
		log.Debug("tcp guest handshake", "dst", dst, "err", terr.String())
		_ = up.Close()
		r.Complete(true)
		return
	}
	r.Complete(false)
	guest := gonet.NewTCPConn(&wq, ep)
	if !s.addConns(guest, up) {
		return
	}
	handedOff = true
	defer s.releaseConn()
	defer s.removeConns(guest, up)
	if h, ok := up.(GuestHandler); ok {
		defer up.Close()
		defer guest.Close()
		h.HandleGuest(guest)
		return
	}
	proxyTCP(guest, up)
}

// GuestHandler is implemented by a conn that [Config.Dial] returns when the
// caller wants to handle the guest's side of a TCP flow itself (inspect the
// first bytes, intercept TLS, shape traffic) instead of the stack's plain
// two-way copy. HandleGuest is called once the guest's handshake is
// complete, with the guest conn (which implements CloseWrite); when it
// returns, the stack closes both conns. It must return when either conn is
// closed (Stack.Close closes both).
type GuestHandler interface {
	HandleGuest(guest net.Conn)
}

// DialGuest opens a TCP connection from the gateway to port on the guest
// (published ports). The guest sees a connection from the gateway address.
func (s *Stack) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	if !s.reserveConn() {
		s.stats.dialsBusy.Add(1)
		return nil, errors.New("connection limit reached")
	}
	c, err := gonet.DialContextTCP(ctx, s.ns, tcpip.FullAddress{NIC: nicID, Addr: tcpAddr(s.cfg.GuestIP), Port: port}, ipv4.ProtocolNumber)
	if err != nil {
		s.releaseConn()
		return nil, fmt.Errorf("dial guest port %d: %w", port, err)
	}
	if !s.addConns(c) {
		s.releaseConn()
		return nil, ErrClosed
	}
	return &guestConn{TCPConn: c, s: s}, nil
}

// guestConn releases its connection slot and registration once closed.
type guestConn struct {
	*gonet.TCPConn
	s    *Stack
	once sync.Once
}

func (c *guestConn) Close() error {
	err := c.TCPConn.Close()
	c.once.Do(func() {
		c.s.removeConns(c.TCPConn)
		c.s.releaseConn()
	})
	return err
}

type closeWriter interface{ CloseWrite() error }

// proxyTCP copies both ways, passing each side's EOF on as a half-close. An
// error in either direction aborts both. It closes both conns.
func proxyTCP(guest *gonet.TCPConn, up net.Conn) {
	var once sync.Once
	abort := func() {
		once.Do(func() {
			_ = guest.Close()
			_ = up.Close()
		})
	}
	defer abort()
	pipe := func(dst, src net.Conn) {
		if _, err := io.Copy(dst, src); err != nil && !errors.Is(err, io.EOF) {
			abort()
			return
		}
		if cw, ok := dst.(closeWriter); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		abort()
	}
	var wg sync.WaitGroup
	wg.Go(func() { pipe(up, guest) })
	wg.Go(func() { pipe(guest, up) })
	wg.Wait()
}
