package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/process"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

// processService is envd's process.Process over airlock's exec sessions:
// a process is an exec the sandbox's shim owns (it outlives the stream
// that started it), named to E2B by its guest pid.
type processService struct {
	processconnect.UnimplementedProcessHandler
	h *handler
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// defaultKeepalive is how often an idle process stream carries a
// keepalive event when the client asks for none (envd's default).
const defaultKeepalive = 90 * time.Second

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t, _ := targetOf(ctx)
	m := req.Msg
	switch {
	case m.GetTag() != "":
		return connect.NewError(connect.CodeUnimplemented, errors.New("airlock does not keep process tags; select processes by pid"))
	case m.GetProcess().GetCmd() == "":
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	user, err := rpcUser(req.Header())
	if err != nil {
		return rpcError(err)
	}
	cfg := m.GetProcess()
	spec := guest.ExecSpec{
		Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:  cfg.GetEnvs(),
		User: user,
		// envd gives a process stdin unless asked not to.
		Stdin: m.Stdin == nil || m.GetStdin(),
	}
	if cfg.Cwd != nil {
		if spec.Cwd, err = guestPath(cfg.GetCwd(), user); err != nil {
			return rpcError(err)
		}
	} else if user == "" {
		spec.Cwd = home("") // envd starts in the user's home; the agent would use / for root
	}
	if m.Pty != nil {
		// A terminal: envd's PTY sessions (sandbox.pty).
		size := m.GetPty().GetSize()
		spec.TTY = &guest.TermSize{Rows: size.GetRows(), Cols: size.GetCols()}
		if spec.TTY.Rows == 0 && spec.TTY.Cols == 0 {
			spec.TTY.Rows, spec.TTY.Cols = 24, 80
		}
		spec.Stdin = true
	}
	// envd ends the process when the stream's Connect-Timeout-Ms passes.
	if dl, ok := ctx.Deadline(); ok {
		spec.Timeout = max(time.Until(dl), time.Millisecond)
	}
	if err := spec.Validate(); err != nil {
		return rpcError(err)
	}
	st, err := p.h.cfg.Execs.Exec(ctx, t.c, t.id, spec, false)
	if err != nil {
		return rpcError(err)
	}
	defer st.Close()
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	return pump(ctx, st, spec.TTY != nil, keepaliveOf(req.Header()), send)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t, _ := targetOf(ctx)
	info, err := p.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	st, err := p.h.cfg.Execs.AttachExec(ctx, t.c, t.id, info.ID, false)
	if err != nil {
		return rpcError(err)
	}
	defer st.Close()
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	return pump(ctx, st, info.TTY, keepaliveOf(req.Header()), send)
}

func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t, _ := targetOf(ctx)
	execs, err := p.h.cfg.Execs.ListExecs(ctx, t.c, t.id)
	if err != nil {
		return nil, rpcError(err)
	}
	out := &process.ListResponse{}
	for _, e := range execs {
		if e.State != guest.ExecStateRunning || len(e.Argv) == 0 {
			continue
		}
		out.Processes = append(out.Processes, &process.ProcessInfo{
			Config: &process.ProcessConfig{Cmd: e.Argv[0], Args: slices.Clone(e.Argv[1:])},
			Pid:    uint32(e.PID),
		})
	}
	return connect.NewResponse(out), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	data := req.Msg.GetInput().GetStdin()
	if req.Msg.GetInput().GetPty() != nil {
		data = req.Msg.GetInput().GetPty() // typed into the terminal
	}
	err := p.control(ctx, req.Msg.GetProcess(), func(st guest.ExecStream) error { return st.Stdin(data) })
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	sig := int(req.Msg.GetSignal())
	if sig != int(syscall.SIGKILL) && sig != int(syscall.SIGTERM) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %s: want SIGNAL_SIGTERM or SIGNAL_SIGKILL", req.Msg.GetSignal()))
	}
	if err := p.control(ctx, req.Msg.GetProcess(), func(st guest.ExecStream) error { return st.Signal(sig) }); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	if err := p.control(ctx, req.Msg.GetProcess(), guest.ExecStream.CloseStdin); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	size := req.Msg.GetPty().GetSize()
	if size == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil // nothing to change
	}
	ts := guest.TermSize{Rows: size.GetRows(), Cols: size.GetCols()}
	if err := ts.Validate(); err != nil {
		return nil, rpcError(err)
	}
	if err := p.control(ctx, req.Msg.GetProcess(), func(st guest.ExecStream) error { return st.Resize(ts) }); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// find returns the running exec sel names (by guest pid: airlock keeps no
// tags), or a not_found error as envd gives for an unknown process.
func (p *processService) find(ctx context.Context, sel *process.ProcessSelector) (guest.ExecInfo, error) {
	t, _ := targetOf(ctx)
	if sel.GetTag() != "" {
		return guest.ExecInfo{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("no process has tag %q: airlock keeps no tags; select by pid", sel.GetTag()))
	}
	pid := int(sel.GetPid())
	execs, err := p.h.cfg.Execs.ListExecs(ctx, t.c, t.id)
	if err != nil {
		return guest.ExecInfo{}, rpcError(err)
	}
	for _, e := range execs {
		if e.State == guest.ExecStateRunning && e.PID == pid && pid != 0 {
			return e, nil
		}
	}
	return guest.ExecInfo{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
}

// control runs fn on a control stream of the process sel names and waits
// for the shim's verdict.
func (p *processService) control(ctx context.Context, sel *process.ProcessSelector, fn func(guest.ExecStream) error) error {
	t, _ := targetOf(ctx)
	info, err := p.find(ctx, sel)
	if err != nil {
		return err
	}
	st, err := p.h.cfg.Execs.ExecControl(ctx, t.c, t.id, info.ID)
	if err != nil {
		return rpcError(err)
	}
	defer st.Close()
	if err := fn(st); err != nil {
		return rpcError(err)
	}
	if err := st.Finish(); err != nil {
		return rpcError(err)
	}
	return nil
}

// keepaliveOf is the keepalive interval a stream's client asked for
// (Keepalive-Ping-Interval, seconds).
func keepaliveOf(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 && n <= 3600 {
		return time.Duration(n) * time.Second
	}
	return defaultKeepalive
}

// pump sends an exec's stream as envd's process events: start (the pid),
// data in order and flushed as it comes (a terminal's as pty data),
// keepalives while idle, then one end.
func pump(ctx context.Context, st guest.ExecStream, tty bool, keepalive time.Duration, send func(*process.ProcessEvent) error) error {
	pid := uint32(st.Info().PID)
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	type recv struct {
		ev  guest.ExecEvent
		err error
	}
	evs := make(chan recv)
	go func() {
		for {
			ev, err := st.Recv()
			select {
			case evs <- recv{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil || ev.Kind == guest.ExecExited {
				return
			}
		}
	}()
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		var r recv
		select {
		case <-ctx.Done():
			return rpcError(ctx.Err())
		case <-tick.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		case r = <-evs:
		}
		if r.err != nil {
			if errors.Is(r.err, io.EOF) {
				return connect.NewError(connect.CodeUnavailable, errors.New("the process's stream ended without its exit"))
			}
			return rpcError(r.err)
		}
		tick.Reset(keepalive)
		var ev *process.ProcessEvent
		switch r.ev.Kind {
		case guest.ExecStdout:
			data := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: r.ev.Data}}
			if tty {
				data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: r.ev.Data}
			}
			ev = &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}}
		case guest.ExecStderr:
			ev = &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: r.ev.Data}}}}
		case guest.ExecExited:
			return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(r.ev.Exit)}})
		default:
			continue
		}
		if err := send(ev); err != nil {
			return err
		}
	}
}

// endEvent is an exit as envd reports it: the exit code (-1 and exited
// false when a signal ended the process), Go's ProcessState wording as the
// status, and an error (the status) unless the process exited 0.
func endEvent(x *guest.ExitStatus) *process.ProcessEvent_EndEvent {
	if x == nil {
		x = &guest.ExitStatus{Code: -1}
	}
	e := &process.ProcessEvent_EndEvent{ExitCode: int32(x.Code), Exited: x.Signal == 0 && x.Code >= 0}
	switch {
	case x.Signal != 0:
		e.ExitCode = -1
		e.Status = "signal: " + syscall.Signal(x.Signal).String()
	default:
		e.Status = "exit status " + strconv.Itoa(x.Code)
	}
	if e.ExitCode != 0 {
		msg := e.Status
		switch {
		case x.OOMKilled:
			msg += " (out of memory)"
		case x.TimedOut:
			msg += " (the command's timeout passed)"
		}
		e.Error = &msg
	}
	return e
}
