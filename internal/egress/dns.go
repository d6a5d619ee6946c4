package egress

import (
	"context"
	"net"
	"time"

	"github.com/airlock-sandbox/airlock/internal/secrets"
)

// dnsStream hands a guest's TCP connection to port 53 to the DNS server.
type dnsStream struct {
	nopConn
	e *Engine
}

// HandleGuest implements netstack.GuestHandler.
func (d *dnsStream) HandleGuest(guest net.Conn) {
	if d.e.sec.Load().scan != nil {
		guest = &scannedStream{Conn: guest, e: d.e}
	}
	_ = d.e.res.ServeStream(d.e.ctx, guest)
}

// scannedStream drops a DNS-over-TCP connection whose bytes carry a
// placeholder (exfiltration through a query name).
type scannedStream struct {
	net.Conn
	e *Engine
}

func (s *scannedStream) Read(p []byte) (int, error) {
	n, err := s.Conn.Read(p)
	if n > 0 && s.e.dnsLeak(p[:n]) {
		return 0, net.ErrClosed
	}
	return n, err
}

// dnsLeak reports (and audits) a DNS message carrying a placeholder.
func (e *Engine) dnsLeak(b []byte) bool {
	set := e.sec.Load()
	if set.scan == nil {
		return false
	}
	ph, ok := set.scan.Find(b)
	if !ok {
		return false
	}
	e.auditSecret(secrets.Event{Action: "net.secret.block", Host: "dns", Secrets: set.names(ph),
		Reason: "a DNS query carried a secret placeholder; dropped"})
	return true
}

// dnsPacket is a UDP flow to port 53: each datagram the guest writes is a
// query answered by the DNS server; answers are read back in order of
// completion. At most dnsPacketInflight queries per flow run at once.
type dnsPacket struct {
	nopConn
	e       *Engine
	replies chan []byte
	sem     chan struct{}
	ctx     context.Context // cancelled by Close
	cancel  context.CancelFunc
}

const dnsPacketInflight = 8

func newDNSPacket(e *Engine) *dnsPacket {
	ctx, cancel := context.WithCancel(e.ctx)
	return &dnsPacket{e: e, replies: make(chan []byte, dnsPacketInflight), sem: make(chan struct{}, dnsPacketInflight), ctx: ctx, cancel: cancel}
}

func (d *dnsPacket) Write(b []byte) (int, error) {
	if d.e.dnsLeak(b) {
		return len(b), nil
	}
	select {
	case d.sem <- struct{}{}:
	default:
		return len(b), nil // too many in flight on this flow: dropped, the guest retries
	}
	q := append([]byte(nil), b...)
	go func() {
		defer func() { <-d.sem }()
		out := d.e.res.ServeDNS(d.ctx, q)
		if out == nil {
			return
		}
		select {
		case d.replies <- out:
		case <-d.ctx.Done():
		}
	}()
	return len(b), nil
}

func (d *dnsPacket) Read(b []byte) (int, error) {
	select {
	case r := <-d.replies:
		return copy(b, r), nil
	case <-d.ctx.Done():
		return 0, net.ErrClosed
	}
}

func (d *dnsPacket) Close() error {
	d.cancel()
	return nil
}

// nopConn is a net.Conn that does nothing; embedded by in-process ends.
type nopConn struct{}

func (nopConn) Read([]byte) (int, error)         { return 0, net.ErrClosed }
func (nopConn) Write(b []byte) (int, error)      { return len(b), nil }
func (nopConn) Close() error                     { return nil }
func (nopConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (nopConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (nopConn) SetDeadline(time.Time) error      { return nil }
func (nopConn) SetReadDeadline(time.Time) error  { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }
