package agentapi

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

type infoAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	big bool
}

func (a infoAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	r := &agentv1.InfoResponse{ProtocolVersion: ProtocolVersion, KernelRelease: "test"}
	if a.big {
		r.AgentVersion = string(make([]byte, DefaultMaxMessageBytes+1))
	}
	return connect.NewResponse(r), nil
}

func serveGuest(t *testing.T, guest net.Conn, prefix string, a infoAgent) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if prefix != "" {
			_, _ = io.WriteString(guest, prefix)
		}
		_ = Serve(context.Background(), guest, NewHandler(a, agentv1connect.UnimplementedExecServiceHandler{}, agentv1connect.UnimplementedFileServiceHandler{}))
	}()
	t.Cleanup(func() { guest.Close(); <-done })
}

func TestDialOverPipe(t *testing.T) {
	for _, prefix := range []string{"", "garbage from an old session\x00\x01"} {
		host, guest := net.Pipe()
		serveGuest(t, guest, prefix, infoAgent{})
		c, err := Dial(t.Context(), host, Options{})
		if err != nil {
			t.Fatalf("prefix %q: dial: %v", prefix, err)
		}
		if c.Info.GetKernelRelease() != "test" || c.Info.GetProtocolVersion() != ProtocolVersion {
			t.Fatalf("info = %v", c.Info)
		}
		if err := c.Require(ProtocolVersion+1, "future"); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("Require(future) = %v, want ErrUnsupported", err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDialRejectsOversizedMessage(t *testing.T) {
	host, guest := net.Pipe()
	serveGuest(t, guest, "", infoAgent{big: true})
	c, err := Dial(t.Context(), host, Options{})
	if err == nil {
		c.Close()
		t.Fatal("dial accepted an oversized Info reply")
	}
	host.Close()
}

func TestDialNoBanner(t *testing.T) {
	host, guest := net.Pipe()
	go func() {
		buf := make([]byte, 4096)
		for i := 0; i < MaxPreBanner/len(buf)+2; i++ {
			if _, err := guest.Write(buf); err != nil {
				return
			}
		}
	}()
	_, err := Dial(t.Context(), host, Options{})
	if !errors.Is(err, ErrNoBanner) {
		t.Fatalf("err = %v, want ErrNoBanner", err)
	}
	host.Close()
	guest.Close()
}

func TestDialTimeout(t *testing.T) {
	host, guest := net.Pipe()
	defer guest.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, host, Options{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	host.Close()
}

// namedAgent answers Info with its own kernel release and protocol.
type namedAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	name    string
	version uint32
}

func (a namedAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{ProtocolVersion: a.version, KernelRelease: a.name}), nil
}

// serveNamed serves a on guest until guest closes; done is closed then.
func serveNamed(t *testing.T, guest net.Conn, a namedAgent) (done chan struct{}) {
	t.Helper()
	done = make(chan struct{})
	go func() {
		defer close(done)
		_ = Serve(context.Background(), guest, NewHandler(a, agentv1connect.UnimplementedExecServiceHandler{}, agentv1connect.UnimplementedFileServiceHandler{}))
	}()
	t.Cleanup(func() { guest.Close(); <-done })
	return done
}

func TestRedialMovesTheSessionToTheNewChannel(t *testing.T) {
	host1, guest1 := net.Pipe()
	first := serveNamed(t, guest1, namedAgent{name: "first", version: ProtocolVersion})
	c, err := Dial(t.Context(), host1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	agent := c.Agent // as a shim's services hold it
	if r, err := agent.Info(t.Context(), connect.NewRequest(&agentv1.InfoRequest{})); err != nil || r.Msg.GetKernelRelease() != "first" {
		t.Fatalf("before: %v %v", r, err)
	}

	// An agent that speaks an older protocol is refused; the new conn
	// stays open for the caller.
	hostOld, guestOld := net.Pipe()
	serveNamed(t, guestOld, namedAgent{name: "old", version: ProtocolVersion - 1})
	if err := c.Redial(t.Context(), hostOld); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("redial to an older agent: %v", err)
	}
	hostOld.Close()

	host2, guest2 := net.Pipe()
	serveNamed(t, guest2, namedAgent{name: "second", version: ProtocolVersion})
	if err := c.Redial(t.Context(), host2); err != nil {
		t.Fatal(err)
	}
	r, err := agent.Info(t.Context(), connect.NewRequest(&agentv1.InfoRequest{}))
	if err != nil || r.Msg.GetKernelRelease() != "second" {
		t.Fatalf("after redial: %v %v", r, err)
	}
	if !c.Alive() {
		t.Fatal("not alive on the new channel")
	}
	// The old channel was closed: the first agent's server ended.
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the first channel is still served")
	}
	if c.Info.GetKernelRelease() != "first" {
		t.Fatalf("Info changed: %v", c.Info)
	}
}
