package netstack

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// maxDatagram is the largest UDP payload relayed either way.
const maxDatagram = 64 << 10

// handleUDP runs synchronously in the inbound path for the first datagram of
// each guest flow (4-tuple). It must not block: it registers an endpoint for
// the flow (which queues the datagram and its followers) and dials on a
// goroutine. It always reports the datagram handled, so the stack never sends
// ICMP for it.
func (s *Stack) handleUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	dst := netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort)
	if !s.reserveConn() {
		s.stats.dialsBusy.Add(1)
		s.cfg.Busy("udp", dst, LimitConns)
		return true
	}
	select {
	case s.udpSem <- struct{}{}:
	default:
		s.releaseConn()
		s.stats.dialsBusy.Add(1)
		s.cfg.Busy("udp", dst, LimitDials)
		return true
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		<-s.udpSem
		s.releaseConn()
		s.cfg.Logger.Debug("udp endpoint", "dst", dst, "err", terr.String())
		return true
	}
	guest := gonet.NewUDPConn(&wq, ep)
	if !s.track() {
		<-s.udpSem
		s.releaseConn()
		_ = guest.Close()
		return true
	}
	go func() {
		defer s.wg.Done()
		defer s.releaseConn()
		dctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
		up, err := s.cfg.Dial(dctx, "udp", dst)
		cancel()
		<-s.udpSem
		if err != nil {
			s.stats.dialsDenied.Add(1)
			s.cfg.Logger.Debug("udp refused", "dst", dst, "err", err)
			_ = guest.Close()
			return
		}
		s.stats.dialsAllowed.Add(1)
		if !s.addConns(guest, up) {
			return
		}
		defer s.removeConns(guest, up)
		relayUDP(guest, up, s.cfg.UDPIdle)
	}()
	return true
}

// relayUDP copies datagrams both ways until either side fails or no datagram
// has moved for idle. It closes both conns.
func relayUDP(guest *gonet.UDPConn, up net.Conn, idle time.Duration) {
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = guest.SetDeadline(time.Unix(1, 0))
			_ = up.SetDeadline(time.Unix(1, 0))
			_ = guest.Close()
			_ = up.Close()
		})
	}
	timer := time.AfterFunc(idle, stop)
	defer timer.Stop()
	pipe := func(dst, src net.Conn) {
		defer stop()
		buf := make([]byte, maxDatagram)
		for {
			n, err := src.Read(buf)
			if err != nil {
				return
			}
			timer.Reset(idle)
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { pipe(up, guest) })
	wg.Go(func() { pipe(guest, up) })
	wg.Wait()
}
