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

// relay serves the guest's ExecService on the shim socket by forwarding to
// the guest through the host-side agent client, which caps message sizes.
// The relay adds the limits a hostile agent could otherwise ignore.
type relay struct {
	agent *agentapi.Client
	env   []string // the sandbox's default environment
}

var _ agentv1connect.ExecServiceHandler = (*relay)(nil)

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

// Exec relays one exec stream, enforcing the output cap and the timeout on
// the host side (guardedExec). The exec ends with the client's stream.
func (r *relay) Exec(ctx context.Context, cs *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse]) error {
	first, err := cs.Receive()
	if err != nil {
		return invalid(fmt.Errorf("read exec start: %w", err))
	}
	g, err := openExec(ctx, r.agent, first.GetStart(), r.env)
	if err != nil {
		return err
	}
	defer g.Close()

	// Client -> guest: stdin, close, signals. Not waited for: it blocks in
	// cs.Receive until the client sends or this handler returns (which ends
	// the request), and it touches nothing that outlives the handler.
	go func() {
		for {
			msg, err := cs.Receive()
			if err != nil {
				_ = g.CloseRequest()
				return
			}
			if err := g.Send(msg); err != nil {
				return
			}
		}
	}()

	// Guest -> client.
	for {
		ev, err := g.Next()
		if err != nil {
			return err
		}
		if err := cs.Send(ev); err != nil {
			return err
		}
		if ev.GetExited() != nil {
			return nil
		}
	}
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
