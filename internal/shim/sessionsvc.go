package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// execService serves ExecService (proto/airlock/shim/v2) on the shim
// socket over the shim's session table: start and attach, output, stdin
// and signals travel on one stream per client.
type execService struct {
	t   *sessions
	log *slog.Logger
}

var _ shimv2connect.ExecServiceHandler = execService{}

func (v execService) lookup(id string) (*session, error) {
	if !guest.ValidExecID(id) {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such exec"))
	}
	return v.t.Get(id)
}

// startFor maps a v2 spec to the guest's start message.
func startFor(sp *shimv2.ExecSpec) (*agentv1.ExecStart, error) {
	if sp == nil {
		return nil, invalid(errors.New("start has no spec"))
	}
	start := &agentv1.ExecStart{
		Argv: sp.GetArgv(), Env: sp.GetEnv(), Cwd: sp.GetCwd(), User: sp.GetUser(), Stdin: sp.GetStdin(),
		TimeoutMs: sp.GetTimeoutMs(), MaxOutputBytes: sp.GetMaxOutputBytes(), PidsLimit: sp.GetPidsLimit(),
	}
	if sp.GetTty() {
		rows, cols := sp.GetRows(), sp.GetCols()
		if rows == 0 && cols == 0 {
			rows, cols = 24, 80
		}
		if err := (guest.TermSize{Rows: rows, Cols: cols}).Validate(); err != nil {
			return nil, invalid(err)
		}
		start.Tty, start.Stdin = &agentv1.TerminalSize{Rows: rows, Cols: cols}, true
	}
	return start, nil
}

func (v execService) Exec(ctx context.Context, cs *connect.BidiStream[shimv2.ExecClientMessage, shimv2.ExecServerMessage]) error {
	first, err := cs.Receive()
	if err != nil {
		return invalid(fmt.Errorf("read the first exec message: %w", err))
	}
	var (
		s         *session
		starter   *attacher // the starting stream's: it holds the output back
		fromStart = true
		output    = true
	)
	switch m := first.GetMsg().(type) {
	case *shimv2.ExecClientMessage_Start:
		start, err := startFor(m.Start.GetSpec())
		if err != nil {
			return err
		}
		a := m.Start.GetActor()
		if s, starter, err = v.t.Start(ctx, start, a.GetTenant(), a.GetKeyId(), m.Start.GetKillOnDetach()); err != nil {
			return err
		}
	case *shimv2.ExecClientMessage_Attach:
		if s, err = v.lookup(m.Attach.GetExecId()); err != nil {
			return err
		}
		fromStart, output = m.Attach.GetFromStart(), !m.Attach.GetNoOutput()
	default:
		return invalid(errors.New("the first exec message must be start or attach"))
	}
	// A pause that parks the execs ends this stream (see Parkable).
	v.t.streams.Add(1)
	defer v.t.streams.Add(-1)
	if err := cs.Send(&shimv2.ExecServerMessage{Event: &shimv2.ExecServerMessage_Started{Started: s.info()}}); err != nil {
		if starter != nil {
			s.detach(v.t, starter)
		}
		return err
	}
	if !output {
		// A control stream: apply each message; the first failure ends the
		// stream, the client's clean end is the OK.
		for {
			msg, err := cs.Receive()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := v.apply(s, msg); err != nil {
				return err
			}
		}
	}
	// Client -> exec. Not waited for: it blocks in cs.Receive until the
	// client sends or this handler returns (which ends the request), and it
	// touches nothing that outlives the handler but the session.
	go func() {
		for {
			msg, err := cs.Receive()
			if err != nil {
				return
			}
			if err := v.apply(s, msg); err != nil {
				v.log.Debug("exec stream input dropped", "exec_id", s.id, "err", err)
			}
		}
	}()
	send := func(ev *agentv1.ExecResponse) error {
		out := wireEvent(ev)
		if out == nil {
			return nil
		}
		return cs.Send(out)
	}
	if starter != nil {
		return s.Follow(ctx, v.t, starter, send)
	}
	return s.Attach(ctx, v.t, fromStart, send)
}

// apply hands one client message after the first to the exec.
func (v execService) apply(s *session, msg *shimv2.ExecClientMessage) error {
	switch m := msg.GetMsg().(type) {
	case *shimv2.ExecClientMessage_Stdin:
		return s.Input(m.Stdin, false)
	case *shimv2.ExecClientMessage_CloseStdin:
		return s.Input(nil, m.CloseStdin)
	case *shimv2.ExecClientMessage_Signal:
		return s.Signal(m.Signal)
	case *shimv2.ExecClientMessage_Resize:
		return s.Resize(m.Resize.GetRows(), m.Resize.GetCols())
	case *shimv2.ExecClientMessage_Start, *shimv2.ExecClientMessage_Attach:
		return invalid(errors.New("start or attach after the first exec message"))
	default:
		return invalid(errors.New("unknown exec message"))
	}
}

// wireEvent maps a retained agent event to the v2 stream (nil: not sent).
func wireEvent(ev *agentv1.ExecResponse) *shimv2.ExecServerMessage {
	switch e := ev.GetEvent().(type) {
	case *agentv1.ExecResponse_Stdout:
		return &shimv2.ExecServerMessage{Event: &shimv2.ExecServerMessage_Stdout{Stdout: e.Stdout}}
	case *agentv1.ExecResponse_Stderr:
		return &shimv2.ExecServerMessage{Event: &shimv2.ExecServerMessage_Stderr{Stderr: e.Stderr}}
	case *agentv1.ExecResponse_Exited:
		return &shimv2.ExecServerMessage{Event: &shimv2.ExecServerMessage_Exited{Exited: wireExit(e.Exited)}}
	case *agentv1.ExecResponse_Parked:
		return &shimv2.ExecServerMessage{Event: &shimv2.ExecServerMessage_Paused{Paused: &shimv2.ExecPaused{}}}
	}
	return nil
}

func wireExit(ex *agentv1.ExecExited) *shimv2.ExecExit {
	if ex == nil {
		return nil
	}
	return &shimv2.ExecExit{
		ExitCode: ex.GetExitCode(), Signal: ex.GetSignal(), TimedOut: ex.GetTimedOut(),
		OutputTruncated: ex.GetOutputTruncated(), DurationMs: ex.GetDurationMs(), OomKilled: ex.GetOomKilled(),
	}
}

func (v execService) List(context.Context, *connect.Request[shimv2.ListExecsRequest]) (*connect.Response[shimv2.ListExecsResponse], error) {
	return connect.NewResponse(&shimv2.ListExecsResponse{Execs: v.t.List()}), nil
}

func (v execService) Get(_ context.Context, req *connect.Request[shimv2.GetExecRequest]) (*connect.Response[shimv2.ExecInfo], error) {
	s, err := v.lookup(req.Msg.GetExecId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(s.info()), nil
}

// maxInputMessage caps one ExecService client message (stdin data).
const maxInputMessage = 8 << 20
