package monitortest

import (
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/protobuf/proto"
	pb "gvisor.dev/gvisor/pkg/sentry/seccheck/points/points_go_proto"
	"gvisor.dev/gvisor/pkg/sentry/seccheck/sinks/remote/wire"
)

// Sentry is the sending end of a sink connection.
type Sentry struct {
	c *net.UnixConn
	// Dropped is the drop count the next message's header carries (the
	// Sentry's count of points it could not write; it wraps).
	Dropped uint32
}

// Dial connects to the sink at path and does the handshake.
func Dial(path string) (*Sentry, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	out, _ := proto.Marshal(&pb.Handshake{Version: wire.CurrentVersion})
	if _, err := c.Write(out); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	var hs pb.Handshake
	if err := proto.Unmarshal(buf[:n], &hs); err != nil || hs.GetVersion() < 1 {
		c.Close()
		return nil, errors.Join(errors.New("bad handshake"), err)
	}
	_ = c.SetReadDeadline(time.Time{})
	return &Sentry{c: c}, nil
}

// Close closes the connection (the sandbox ended).
func (s *Sentry) Close() error { return s.c.Close() }

// Write writes raw bytes as one message.
func (s *Sentry) Write(b []byte) error {
	_, err := s.c.Write(b)
	return err
}

func (s *Sentry) send(t pb.MessageType, m proto.Message) error {
	out, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	h := wire.Header{HeaderSize: wire.HeaderStructSize, MessageType: uint16(t), DroppedCount: s.Dropped}
	b := make([]byte, wire.HeaderStructSize, wire.HeaderStructSize+len(out))
	h.MarshalUnsafe(b)
	return s.Write(append(b, out...))
}

// Start sends container/start, as the Sentry does when the sandbox's
// init is created.
func (s *Sentry) Start() error {
	return s.send(pb.MessageType_MESSAGE_CONTAINER_START, &pb.Start{Id: "airlock-test", Cwd: "/", Args: []string{"/.airlock-agent"}})
}

// Exec describes a sentry/execve point.
type Exec struct {
	PID, PPID int32
	UID, EUID uint32
	Path, Cwd string
	Argv, Env []string
	TimeNs    int64
}

// Exec sends a sentry/execve point.
func (s *Sentry) Exec(e Exec) error {
	return s.send(pb.MessageType_MESSAGE_SENTRY_EXEC, &pb.ExecveInfo{
		ContextData: &pb.ContextData{TimeNs: e.TimeNs, ThreadGroupId: e.PID, ParentThreadGroupId: e.PPID, Cwd: e.Cwd,
			Credentials: &pb.Credentials{RealUid: e.UID, EffectiveUid: e.EUID}},
		BinaryPath: e.Path, Argv: e.Argv, Env: e.Env,
	})
}

// Exit sends sentry/exit_notify_parent with a wait status (code<<8, or
// the signal number).
func (s *Sentry) Exit(pid, waitStatus int32) error {
	return s.send(pb.MessageType_MESSAGE_SENTRY_EXIT_NOTIFY_PARENT, &pb.ExitNotifyParentInfo{
		ContextData: &pb.ContextData{TimeNs: time.Now().UnixNano(), ThreadGroupId: pid}, ExitStatus: waitStatus,
	})
}

// Clone sends sentry/clone, a point the sink does not ask for.
func (s *Sentry) Clone(pid int32) error {
	return s.send(pb.MessageType_MESSAGE_SENTRY_CLONE, &pb.CloneInfo{ContextData: &pb.ContextData{ThreadGroupId: pid}})
}
