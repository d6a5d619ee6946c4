package sandbox

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The guest-port protocol of a shim's ports.sock (Layout.PortsSock): the
// client writes the guest TCP port as 2 bytes big-endian; the shim dials
// the guest from the gateway and answers one line, "ok\n" or
// "error: <reason>\n"; after "ok" the socket carries the TCP stream.
const portsDialTimeout = 10 * time.Second

// DialPort opens a TCP stream to port of c's running sandbox's guest,
// through its shim (the API's preview route uses it).
func (m *Manager) DialPort(ctx context.Context, c Caller, id string, port uint16) (net.Conn, error) {
	if port == 0 {
		return nil, fmt.Errorf("%w: port must be 1-65535", errdefs.ErrInvalid)
	}
	if _, _, err := m.running(ctx, c, id); err != nil {
		return nil, err
	}
	return DialGuestPort(ctx, m.L.PortsSock(id), port)
}

// DialGuestPort speaks the ports.sock protocol on sock.
func DialGuestPort(ctx context.Context, sock string, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, portsDialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox network is not reachable: %v", errdefs.ErrUnavailable, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	if _, err := c.Write(b[:]); err != nil {
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
