package shim

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

// Host-side limits applied by the relay whatever the guest does.
const (
	// DefaultMaxOutputBytes caps stdout+stderr forwarded for one exec.
	DefaultMaxOutputBytes = 64 << 20
	// maxPathLen is the longest guest path the host will send.
	maxPathLen = 4096
)

// timeoutGrace is how long past an exec's timeout the host waits for the
// agent to report it before it gives up on the agent (a var for tests).
var timeoutGrace = 5 * time.Second

// relay serves the agent services on the shim socket by forwarding to the
// guest through the host-side agent client, which caps message sizes. The
// relay adds the limits a hostile agent could otherwise ignore.
type relay struct {
	agentv1connect.UnimplementedAgentServiceHandler
	agentv1connect.UnimplementedFileServiceHandler

	agent *agentapi.Client
	env   []string // the sandbox's default environment
	// shutdown stops the whole sandbox; it is what AgentService.Shutdown
	// means on the shim socket.
	shutdown func(ctx context.Context) error
}

// ValidateGuestPath checks a path the host is about to send to the guest.
func ValidateGuestPath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case len(p) > maxPathLen:
		return fmt.Errorf("path is longer than %d bytes", maxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is not absolute", p)
	case path.Clean(p) != p:
		return fmt.Errorf("path %q is not clean (want %q)", p, path.Clean(p))
	}
	return nil
}

func invalid(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }

func (r *relay) Info(ctx context.Context, req *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return r.agent.Agent.Info(ctx, req)
}

func (r *relay) Shutdown(ctx context.Context, _ *connect.Request[agentv1.ShutdownRequest]) (*connect.Response[agentv1.ShutdownResponse], error) {
	if err := r.shutdown(ctx); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&agentv1.ShutdownResponse{}), nil
}

func relayErr(step string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		// Guest errors are data: keep the code, bound the message.
		msg := ce.Message()
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		return connect.NewError(ce.Code(), errors.New(msg))
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %w", step, err))
}

func (r *relay) Stat(ctx context.Context, req *connect.Request[agentv1.StatRequest]) (*connect.Response[agentv1.StatResponse], error) {
	if err := ValidateGuestPath(req.Msg.GetPath()); err != nil {
		return nil, invalid(err)
	}
	resp, err := r.agent.Files.Stat(ctx, req)
	if err != nil {
		return nil, relayErr("stat", err)
	}
	return resp, nil
}

func (r *relay) List(ctx context.Context, req *connect.Request[agentv1.ListRequest]) (*connect.Response[agentv1.ListResponse], error) {
	if err := ValidateGuestPath(req.Msg.GetPath()); err != nil {
		return nil, invalid(err)
	}
	resp, err := r.agent.Files.List(ctx, req)
	if err != nil {
		return nil, relayErr("list", err)
	}
	return resp, nil
}

func (r *relay) Mkdir(ctx context.Context, req *connect.Request[agentv1.MkdirRequest]) (*connect.Response[agentv1.MkdirResponse], error) {
	if err := ValidateGuestPath(req.Msg.GetPath()); err != nil {
		return nil, invalid(err)
	}
	resp, err := r.agent.Files.Mkdir(ctx, req)
	if err != nil {
		return nil, relayErr("mkdir", err)
	}
	return resp, nil
}

func (r *relay) Remove(ctx context.Context, req *connect.Request[agentv1.RemoveRequest]) (*connect.Response[agentv1.RemoveResponse], error) {
	if err := ValidateGuestPath(req.Msg.GetPath()); err != nil {
		return nil, invalid(err)
	}
	resp, err := r.agent.Files.Remove(ctx, req)
	if err != nil {
		return nil, relayErr("remove", err)
	}
	return resp, nil
}

func (r *relay) Read(ctx context.Context, req *connect.Request[agentv1.ReadRequest], out *connect.ServerStream[agentv1.ReadResponse]) error {
	if err := ValidateGuestPath(req.Msg.GetPath()); err != nil {
		return invalid(err)
	}
	in, err := r.agent.Files.Read(ctx, req)
	if err != nil {
		return relayErr("read", err)
	}
	defer in.Close()
	for in.Receive() {
		if err := out.Send(in.Msg()); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return relayErr("read", err)
	}
	return nil
}

func (r *relay) Write(ctx context.Context, in *connect.ClientStream[agentv1.WriteRequest]) (*connect.Response[agentv1.WriteResponse], error) {
	if !in.Receive() {
		return nil, invalid(fmt.Errorf("read write header: %w", in.Err()))
	}
	h := in.Msg().GetHeader()
	if h == nil {
		return nil, invalid(errors.New("first write message must be the header"))
	}
	if err := ValidateGuestPath(h.GetPath()); err != nil {
		return nil, invalid(err)
	}
	out := r.agent.Files.Write(ctx)
	if err := out.Send(in.Msg()); err != nil {
		_, rerr := out.CloseAndReceive()
		return nil, relayErr("write", errors.Join(err, rerr))
	}
	for in.Receive() {
		if in.Msg().GetData() == nil {
			continue
		}
		if err := out.Send(in.Msg()); err != nil {
			break // the real error comes from CloseAndReceive
		}
	}
	if err := in.Err(); err != nil {
		// The client went away mid-upload: abandon so the guest keeps the
		// old file.
		return nil, relayErr("write", err)
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return nil, relayErr("write", err)
	}
	return resp, nil
}
