package sandbox

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The guest-port protocol of a shim's ports.sock (Layout.PortsSock): the
// client writes the guest TCP port as 2 bytes big-endian or, to name the
// peer the connection is for (the audit trail's net.inbound), 2 zero
// bytes, the port, one length byte and that many bytes of the peer's IP
// address; the shim dials the guest from the gateway and answers one line,
// "ok\n" or "error: <reason>\n"; after "ok" the socket carries the TCP
// stream. A shim older than the peer form reads its zero bytes as port 0
// and answers that nothing accepts connections on guest port 0:
// DialGuestPort then dials again without the peer.
const portsDialTimeout = 10 * time.Second

// oldShimPort0 is how a shim without the peer form answers it.
const oldShimPort0 = "nothing accepts connections on guest port 0 "

// DialPort opens a TCP stream to port of c's running sandbox's guest,
// through its shim (the API's preview route uses it). c.Peer, if set, is
// recorded as the connection's peer.
func (m *Manager) DialPort(ctx context.Context, c Caller, id string, port uint16) (net.Conn, error) {
	if port == 0 {
		return nil, fmt.Errorf("%w: port must be 1-65535", errdefs.ErrInvalid)
	}
	if _, _, err := m.running(ctx, c, id); err != nil {
		return nil, err
	}
	return DialGuestPortFrom(ctx, m.L.PortsSock(id), port, c.Peer)
}

// DialGuestPort speaks the ports.sock protocol on sock.
func DialGuestPort(ctx context.Context, sock string, port uint16) (net.Conn, error) {
	return DialGuestPortFrom(ctx, sock, port, "")
}

// DialGuestPortFrom speaks the ports.sock protocol on sock, naming peer
// (an IP address; anything else is left out) as the client.
func DialGuestPortFrom(ctx context.Context, sock string, port uint16, peer string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, portsDialTimeout)
	defer cancel()
	var hdr []byte
	if a, err := netip.ParseAddr(peer); err == nil && port != 0 {
		p := a.Unmap().String()
		hdr = binary.BigEndian.AppendUint16([]byte{0, 0}, port)
		hdr = append(append(hdr, byte(len(p))), p...)
	}
	if hdr != nil {
		c, err := dialPorts(ctx, sock, port, hdr)
		if err == nil || !strings.Contains(err.Error(), oldShimPort0) {
			return c, err
		}
	}
	return dialPorts(ctx, sock, port, binary.BigEndian.AppendUint16(nil, port))
}

// dialPorts sends hdr on a new connection to sock and reads the answer.
func dialPorts(ctx context.Context, sock string, port uint16, hdr []byte) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox network is not reachable: %v", errdefs.ErrUnavailable, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write(hdr); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: sandbox network: %v", errdefs.ErrUnavailable, err)
	}
	br := bufio.NewReaderSize(c, 512)
	line, err := br.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: sandbox network closed the connection", errdefs.ErrUnavailable)
	}
	line = strings.TrimSpace(line)
	if line != "ok" {
		c.Close()
		return nil, fmt.Errorf("%w: guest port %d: %s", errdefs.ErrUnavailable, port, strings.TrimPrefix(line, "error: "))
	}
	_ = c.SetDeadline(time.Time{})
	return &bufConn{Conn: c, r: br}, nil
}

// bufConn reads through a bufio.Reader that may hold bytes already read.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
