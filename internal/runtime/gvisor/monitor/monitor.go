package monitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

const (
	// MaxMessage bounds one message (header and point). A point is
	// written in one datagram, which the sending socket's buffer bounds
	// (net.core.wmem_default, 208 KiB here): an exec whose argv and
	// environment are larger is dropped by the Sentry and counted.
	MaxMessage = 256 << 10
	// maxTracked bounds the processes whose exit is awaited.
	maxTracked = 8192
	// handshakeTimeout bounds the wait for runsc's handshake.
	handshakeTimeout = 30 * time.Second
	// maxPathLen is the longest socket path (sockaddr_un).
	maxPathLen = 107
	// agentPID is the guest agent's pid: the sandbox's init.
	agentPID = 1
)

// InitConfig returns runsc's pod init configuration (--pod-init-config)
// for a session whose remote sink connects to endpoint.
func InitConfig(endpoint string) ([]byte, error) {
	if len(endpoint) > maxPathLen {
		return nil, fmt.Errorf("monitor socket path is %d bytes, longer than %d", len(endpoint), maxPathLen)
	}
	type point struct {
		Name           string   `json:"name"`
		OptionalFields []string `json:"optional_fields,omitempty"`
		ContextFields  []string `json:"context_fields,omitempty"`
	}
	type sink struct {
		Name   string         `json:"name"`
		Config map[string]any `json:"config"`
	}
	type session struct {
		Name   string  `json:"name"`
		Points []point `json:"points"`
		Sinks  []sink  `json:"sinks"`
	}
	c := struct {
		TraceSession session `json:"trace_session"`
	}{session{
		Name: "Default", // the only session runsc supports
		Points: []point{
			{Name: "container/start"},
			{Name: "sentry/execve", ContextFields: []string{"time", "group_id", "parent_thread_group_id", "credentials", "cwd"}},
			{Name: "sentry/exit_notify_parent", ContextFields: []string{"time", "group_id"}},
		},
		// A full socket makes the Sentry retry a few times (backing off
		// from 25 µs to at most 1 ms: a few ms of the exec'ing task's time)
		// before it drops the point and counts it.
		Sinks: []sink{{Name: "remote", Config: map[string]any{"endpoint": endpoint, "retries": 8, "backoff": "25us", "backoff_max": "1ms"}}},
	}}
	return json.Marshal(c)
}

// Listener is the sink's socket until runsc has connected.
type Listener struct {
	ln   *net.UnixListener
	path string
}

// Listen makes the sink's socket at path (mode 0600). The caller puts it
// in a directory only root can enter.
func Listen(path string) (*Listener, error) {
	if len(path) > maxPathLen {
		return nil, fmt.Errorf("monitor socket path is %d bytes, longer than %d", len(path), maxPathLen)
	}
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("monitor socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("monitor socket: %w", err)
	}
	return &Listener{ln: ln, path: path}, nil
}

// Close closes the listener and removes its file. Idempotent.
func (l *Listener) Close() error {
	err := l.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Accept waits for the connection of a process whose pid peer accepts,
// answers its handshake and closes the listener; connections from other
// processes are refused. ctx bounds the wait (Close ends it too).
func (l *Listener) Accept(ctx context.Context, peer func(pid int) bool) (*Conn, error) {
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { _ = l.ln.SetDeadline(time.Now()) })
	defer stop()
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("monitor: wait for runsc: %w", context.Cause(ctx))
			}
			return nil, fmt.Errorf("monitor: accept: %w", err)
		}
		pid, err := peerPID(c)
		if err != nil || !peer(pid) {
			c.Close()
			continue
		}
		if err := handshake(c); err != nil {
			c.Close()
			return nil, err
		}
		return newConn(c), nil
	}
}

func peerPID(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return int(cred.Pid), nil
}

// handshake reads runsc's version and answers with ours (gVisor's
// common.proto: each side sends a Handshake; the sink checks the
// remote's version).
func handshake(c *net.UnixConn) error {
	_ = c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	buf := make([]byte, 1024)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil {
		return fmt.Errorf("monitor: read handshake: %w", err)
	}
	var hs pb.Handshake
	if flags&syscall.MSG_TRUNC != 0 {
		return errors.New("monitor: handshake too long")
	}
	if err := proto.Unmarshal(buf[:n], &hs); err != nil {
		return fmt.Errorf("monitor: handshake: %w", err)
	}
	if hs.GetVersion() < wire.CurrentVersion {
		return fmt.Errorf("monitor: runsc speaks version %d, this end %d", hs.GetVersion(), wire.CurrentVersion)
	}
	out, err := proto.Marshal(&pb.Handshake{Version: wire.CurrentVersion})
	if err != nil {
		return err
	}
	if _, err := c.Write(out); err != nil {
		return fmt.Errorf("monitor: answer handshake: %w", err)
	}
	return nil
}

// Conn is the Sentry's connection once the handshake is done. Next and
// WaitStarted are for one goroutine; Close may be called from any.
type Conn struct {
	c       *net.UnixConn
	buf     []byte
	tracked map[int32]string // pid -> path of its reported exec
	// started is set once container/start has been read.
	started bool
	// dropped is the Sentry's last drop count (it wraps at 2^32).
	dropped uint32
	// lost is what the next event carries.
	lost uint64
}

var _ runtime.ProcStream = (*Conn)(nil)

func newConn(c *net.UnixConn) *Conn {
	return &Conn{c: c, buf: make([]byte, MaxMessage), tracked: map[int32]string{}}
}

// Close closes the connection. Idempotent.
func (c *Conn) Close() error {
	err := c.c.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// WaitStarted reads until the session's container/start point, by
// deadline: the session is live. Events before it (there are none: the
// sandbox's init has not run yet) would be lost.
func (c *Conn) WaitStarted(deadline time.Time) error {
	_ = c.c.SetReadDeadline(deadline)
	defer func() { _ = c.c.SetReadDeadline(time.Time{}) }()
	for !c.started {
		if _, ok, err := c.read(); err != nil {
			return fmt.Errorf("monitor: the trace session did not start: %w", err)
		} else if ok {
			c.lost++
		}
	}
	return nil
}

// Next implements runtime.ProcStream.
func (c *Conn) Next() (runtime.ProcEvent, uint64, error) {
	for {
		e, ok, err := c.read()
		if err != nil {
			return runtime.ProcEvent{}, 0, err
		}
		if ok {
			lost := c.lost
			c.lost = 0
			return e, lost, nil
		}
	}
}

// read reads one message; ok is false when it is not an event.
func (c *Conn) read() (runtime.ProcEvent, bool, error) {
	n, _, flags, _, err := c.c.ReadMsgUnix(c.buf, nil)
	switch {
	case err != nil:
		return runtime.ProcEvent{}, false, err
	case n == 0:
		return runtime.ProcEvent{}, false, io.EOF // the peer closed
	case flags&syscall.MSG_TRUNC != 0:
		c.lost++
		return runtime.ProcEvent{}, false, nil
	}
	m, err := decode(c.buf[:n])
	if err != nil {
		c.lost++
		return runtime.ProcEvent{}, false, nil
	}
	// The header counts every drop since the sink started; it wraps.
	c.lost += uint64(m.dropped - c.dropped)
	c.dropped = m.dropped
	return c.event(m)
}

// event turns a decoded point into an event, tracking execs for their
// exits.
func (c *Conn) event(m message) (runtime.ProcEvent, bool, error) {
	switch p := m.point.(type) {
	case *pb.Start:
		c.started = true
	case *pb.ExecveInfo:
		e := execEvent(p)
		pid := int32(e.PID)
		if _, ok := c.tracked[pid]; ok || len(c.tracked) < maxTracked {
			c.tracked[pid] = e.Path
		}
		return e, true, nil
	case *pb.ExitNotifyParentInfo:
		pid := p.GetContextData().GetThreadGroupId()
		path, ok := c.tracked[pid]
		if !ok {
			return runtime.ProcEvent{}, false, nil // not seen exec'ing
		}
		delete(c.tracked, pid)
		e := runtime.ProcEvent{Exit: true, Time: eventTime(p.GetContextData()), PID: uint32(pid), Path: path}
		// A wait status: the signal in the low 7 bits, else the code.
		if st := p.GetExitStatus(); st&0x7f != 0 {
			e.Signal = st & 0x7f
		} else {
			e.ExitCode = (st >> 8) & 0xff
		}
		return e, true, nil
	}
	return runtime.ProcEvent{}, false, nil
}

func execEvent(p *pb.ExecveInfo) runtime.ProcEvent {
	cd := p.GetContextData()
	cr := cd.GetCredentials()
	return runtime.ProcEvent{
		Time: eventTime(cd),
		PID:  uint32(cd.GetThreadGroupId()), PPID: uint32(cd.GetParentThreadGroupId()),
		UID: cr.GetRealUid(), EUID: cr.GetEffectiveUid(),
		Path: p.GetBinaryPath(), Cwd: cd.GetCwd(), Argv: p.GetArgv(),
		Agent: cd.GetParentThreadGroupId() == agentPID,
	}
}

func eventTime(cd *pb.ContextData) time.Time {
	if ns := cd.GetTimeNs(); ns > 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// message is one decoded message of the sink's.
type message struct {
	dropped uint32
	point   proto.Message // nil for a type this end does not read
}

// decode parses a message: gVisor's wire.Header, then the point's
// protobuf. The environment of an exec is not kept.
func decode(b []byte) (message, error) {
	if len(b) < wire.HeaderStructSize {
		return message{}, errors.New("short header")
	}
	var h wire.Header
	h.UnmarshalUnsafe(b[:wire.HeaderStructSize])
	if int(h.HeaderSize) < wire.HeaderStructSize || int(h.HeaderSize) > len(b) {
		return message{}, fmt.Errorf("header size %d", h.HeaderSize)
	}
	m := message{dropped: h.DroppedCount}
	switch pb.MessageType(h.MessageType) {
	case pb.MessageType_MESSAGE_CONTAINER_START:
		m.point = &pb.Start{}
	case pb.MessageType_MESSAGE_SENTRY_EXEC:
		m.point = &pb.ExecveInfo{}
	case pb.MessageType_MESSAGE_SENTRY_EXIT_NOTIFY_PARENT:
		m.point = &pb.ExitNotifyParentInfo{}
	default:
		return m, nil
	}
	if err := proto.Unmarshal(b[h.HeaderSize:], m.point); err != nil {
		return message{}, err
	}
	if e, ok := m.point.(*pb.ExecveInfo); ok {
		e.Env = nil
	}
	return m, nil
}
