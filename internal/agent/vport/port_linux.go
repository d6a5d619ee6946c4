package vport

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// maxWrite is the most one write(2) is given: virtio_console moves at most
// 32 KiB per call anyway.
const maxWrite = 32 << 10

// Port is an open virtio-serial port (or, in tests, any blocking stream fd).
type Port struct {
	fd int
	// wake is an eventfd that Close of a session signals, so that a read
	// waiting in poll(2) for the host returns.
	wake int

	// rmu serializes reads of fd and guards pending.
	rmu     sync.Mutex
	pending []byte // read by a session that was closed meanwhile

	// wmu serializes writes of fd.
	wmu sync.Mutex
}

// Open opens path O_RDWR in blocking mode.
func Open(path string) (*Port, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, &net.OpError{Op: "open", Net: "virtio", Err: err}
	}
	p, err := New(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return p, nil
}

// New wraps a blocking fd. On success the Port owns it.
func New(fd int) (*Port, error) {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, &net.OpError{Op: "eventfd", Net: "virtio", Err: err}
	}
	return &Port{fd: fd, wake: wake}, nil
}

// Close closes the port. Sessions must be over.
func (p *Port) Close() error {
	unix.Close(p.wake)
	return unix.Close(p.fd)
}

// Conn starts a new session on the port. Close on the returned conn ends the
// session without closing the port.
func (p *Port) Conn() net.Conn { return &conn{p: p} }

type conn struct {
	p      *Port
	closed atomic.Bool
}

func (c *conn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	p := c.p
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	if len(p.pending) > 0 {
		n := copy(b, p.pending)
		p.pending = p.pending[n:]
		return n, nil
	}
	if err := c.waitReadable(); err != nil {
		return 0, err
	}
	for {
		n, err := unix.Read(p.fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if c.closed.Load() {
			// The session was closed while this read was in progress: these
			// bytes belong to whatever session comes next.
			if n > 0 {
				p.pending = append(p.pending, b[:n]...)
			}
			return 0, net.ErrClosed
		}
		if err != nil {
			return 0, &net.OpError{Op: "read", Net: "virtio", Err: err}
		}
		if n == 0 {
			return 0, io.EOF // no host connected (any more)
		}
		return n, nil
	}
}

// waitReadable waits in poll(2) until the port has data or no host (then
// read(2) returns at once), or the session is closed. The port reports
// POLLHUP while no host is connected, which ends a read with EOF, so this
// never spins.
func (c *conn) waitReadable() error {
	p := c.p
	for {
		if c.closed.Load() {
			return net.ErrClosed
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}, {Fd: int32(p.wake), Events: unix.POLLIN}}
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return &net.OpError{Op: "poll", Net: "virtio", Err: err}
		}
		if fds[1].Revents != 0 {
			var buf [8]byte
			_, _ = unix.Read(p.wake, buf[:]) // reset; meant for this or an older session
			continue
		}
		if fds[0].Revents != 0 {
			return nil
		}
	}
}

func (c *conn) Write(b []byte) (int, error) {
	p := c.p
	p.wmu.Lock()
	defer p.wmu.Unlock()
	done := 0
	for done < len(b) {
		if c.closed.Load() {
			return done, net.ErrClosed
		}
		chunk := b[done:min(len(b), done+maxWrite)]
		n, err := unix.Write(p.fd, chunk)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return done, &net.OpError{Op: "write", Net: "virtio", Err: err}
		}
		done += n
	}
	return done, nil
}

// Close ends the session: a pending Read returns. A Write blocked in the
// kernel (no host connected) stays blocked until a host connects; the next
// session's writes wait for it, and it writes at most one chunk.
func (c *conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(c.p.wake, one[:])
	return nil
}

func (c *conn) LocalAddr() net.Addr              { return addr{} }
func (c *conn) RemoteAddr() net.Addr             { return addr{} }
func (c *conn) SetDeadline(time.Time) error      { return nil }
func (c *conn) SetReadDeadline(time.Time) error  { return nil }
func (c *conn) SetWriteDeadline(time.Time) error { return nil }

type addr struct{}

func (addr) Network() string { return "virtio" }
func (addr) String() string  { return "virtio-serial" }
