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
