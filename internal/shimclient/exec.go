package shimclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// stdinChunk is the most stdin data one stream message carries.
const stdinChunk = 1 << 20

// StartOptions are the start's parts that are not the command.
type StartOptions struct {
	// Tenant and KeyID are recorded with exec.start and exec.exit.
	Tenant, KeyID string
	// KillOnDetach kills the exec when its last attacher goes away before
	// it exits.
	KillOnDetach bool
}

// AttachOptions say how to join a known exec.
type AttachOptions struct {
	// FromStart replays the output the shim retained first.
	FromStart bool
	// Control opens a stream without output: only stdin, close-stdin and
	// signals, whose verdict Finish returns.
	Control bool
}

// execs is the ExecService client on c's pooled connection (cheap: it
// holds no connection of its own).
func (c *Client) execs() shimv2connect.ExecServiceClient {
	return shimv2connect.NewExecServiceClient(c.hc, baseURL, clientOptions()...)
}

// Exec starts spec in the sandbox and returns its stream once the guest
// reported the pid (Info). The exec is the shim's: it outlives ctx, the
// stream and this process unless o.KillOnDetach. Closing the stream (or
// ending ctx) detaches. Errors: ErrInvalid for a spec the shim refuses,
// ErrResourceExhausted when too many execs run, ErrUnavailable when the
// shim cannot be reached.
func (c *Client) Exec(ctx context.Context, spec guest.ExecSpec, o StartOptions) (guest.ExecStream, error) {
	ws := &shimv2.ExecSpec{
		Argv: spec.Argv, Env: spec.EnvList(), Cwd: spec.Cwd, User: spec.User, Stdin: spec.Stdin,
		TimeoutMs: uint32(spec.Timeout / time.Millisecond), PidsLimit: spec.PidsLimit, MaxOutputBytes: spec.MaxOutputBytes,
	}
	if t := spec.TTY; t != nil {
		ws.Tty, ws.Rows, ws.Cols, ws.Stdin = true, t.Rows, t.Cols, true
	}
	return c.open(ctx, "start exec", &shimv2.ExecClientMessage{Msg: &shimv2.ExecClientMessage_Start{Start: &shimv2.ExecStart{
		Spec:         ws,
		Actor:        &shimv2.ExecActor{Tenant: o.Tenant, KeyId: o.KeyID},
		KillOnDetach: o.KillOnDetach,
	}}}, true)
}

// Attach joins exec id. guest.ErrNoExec if the shim does not know it.
func (c *Client) Attach(ctx context.Context, id string, o AttachOptions) (guest.ExecStream, error) {
	if !guest.ValidExecID(id) {
		return nil, guest.ErrNoExec
	}
	return c.open(ctx, "attach exec", &shimv2.ExecClientMessage{Msg: &shimv2.ExecClientMessage_Attach{Attach: &shimv2.ExecAttach{
		ExecId: id, FromStart: o.FromStart, NoOutput: o.Control,
	}}}, !o.Control)
}

// ListExecs returns the running execs and the most recent finished ones,
// oldest first.
func (c *Client) ListExecs(ctx context.Context) ([]guest.ExecInfo, error) {
	resp, err := c.execs().List(ctx, connect.NewRequest(&shimv2.ListExecsRequest{}))
	if err != nil {
		return nil, wireErr(ctx, "list execs", err)
	}
	out := make([]guest.ExecInfo, 0, len(resp.Msg.GetExecs()))
	for _, in := range resp.Msg.GetExecs() {
		out = append(out, execInfo(in))
	}
	return out, nil
}

// GetExec returns exec id; guest.ErrNoExec if the shim does not know it.
func (c *Client) GetExec(ctx context.Context, id string) (guest.ExecInfo, error) {
	if !guest.ValidExecID(id) {
		return guest.ExecInfo{}, guest.ErrNoExec
	}
	resp, err := c.execs().Get(ctx, connect.NewRequest(&shimv2.GetExecRequest{ExecId: id}))
	if err != nil {
		return guest.ExecInfo{}, execErr(ctx, "get exec", err)
	}
	return execInfo(resp.Msg), nil
}

// execErr is wireErr, with an unknown exec as guest.ErrNoExec.
func execErr(ctx context.Context, step string, err error) error {
	if ctx.Err() == nil && connect.CodeOf(err) == connect.CodeNotFound {
		return guest.ErrNoExec
	}
	return wireErr(ctx, step, err)
}

// startErr returns the guest's refusal to start the program as a
// guest.StartError, if err is one (the shim marks it ExecNotStarted).
func startErr(err error) (*guest.StartError, bool) {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok {
		return nil, false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if _, ok := v.(*shimv2.ExecNotStarted); ok {
				reason := ce.Message()
				if len(reason) > 256 {
					reason = reason[:256] + "..."
				}
				reason = strings.ToValidUTF8(reason, "\uFFFD")
				return &guest.StartError{Reason: reason, NotFound: ce.Code() == connect.CodeNotFound}, true
			}
		}
	}
	return nil, false
}

func (c *Client) open(ctx context.Context, step string, first *shimv2.ExecClientMessage, output bool) (*execStream, error) {
	ctx, cancel := context.WithCancel(ctx)
	st := &execStream{step: step, ctx: ctx, cancel: cancel, output: output}
	st.bs = c.execs().Exec(ctx)
	// The HTTP/2 transport notices a cancelled ctx only once the request
	// body is done: end it, so that cancelling always ends the stream.
	context.AfterFunc(ctx, func() { _ = st.closeRequest() })
	if err := st.send(first); err != nil {
		_, rerr := st.bs.Receive()
		err = execErr(ctx, step, errors.Join(err, rerr))
		st.Close()
		return nil, err
	}
	msg, err := st.bs.Receive()
	if err != nil {
		if se, ok := startErr(err); ok && first.GetStart() != nil {
			err = se
		} else {
			err = execErr(ctx, step, err)
		}
		st.Close()
		return nil, err
	}
	in := msg.GetStarted()
	if in == nil {
		st.Close()
		return nil, fmt.Errorf("%w: %s: the shim did not report the exec", errdefs.ErrUnavailable, step)
	}
	st.info = execInfo(in)
	return st, nil
}

// execStream is guest.ExecStream over one v2 Exec stream.
type execStream struct {
	step   string
	ctx    context.Context
	cancel context.CancelFunc
	bs     *connect.BidiStreamForClient[shimv2.ExecClientMessage, shimv2.ExecServerMessage]
	info   guest.ExecInfo
	output bool

	sendMu     sync.Mutex // serializes the request side
	reqClosed  bool
	done       bool // Recv returned the exit
	closeOnce  sync.Once
	finishOnce sync.Once
	finishErr  error
}

func (s *execStream) Info() guest.ExecInfo { return s.info }

func (s *execStream) send(m *shimv2.ExecClientMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.reqClosed {
		return fmt.Errorf("%w: %s: the stream is closed", errdefs.ErrFailedPrecondition, s.step)
	}
	return s.bs.Send(m)
}

func (s *execStream) closeRequest() error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.reqClosed {
		return nil
	}
	s.reqClosed = true
	return s.bs.CloseRequest()
}

// sendErr turns a failed send into the shim's reason where there is one.
func (s *execStream) sendErr(err error) error {
	if errors.Is(err, io.EOF) && !s.output {
		// The shim ended a control stream: its error says why.
		return s.Finish()
	}
	return wireErr(s.ctx, s.step, err)
}

func (s *execStream) Stdin(data []byte) error {
	for len(data) > 0 {
		n := min(len(data), stdinChunk)
		if err := s.send(&shimv2.ExecClientMessage{Msg: &shimv2.ExecClientMessage_Stdin{Stdin: data[:n]}}); err != nil {
			return s.sendErr(err)
		}
		data = data[n:]
	}
	return nil
}

func (s *execStream) CloseStdin() error {
	if err := s.send(&shimv2.ExecClientMessage{Msg: &shimv2.ExecClientMessage_CloseStdin{CloseStdin: true}}); err != nil {
		return s.sendErr(err)
	}
	return nil
}

func (s *execStream) Signal(sig int) error {
	if sig < 1 || sig > 64 {
		return fmt.Errorf("%w: signal %d is out of range", errdefs.ErrInvalid, sig)
	}
	if err := s.send(&shimv2.ExecClientMessage{Msg: &shimv2.ExecClientMessage_Signal{Signal: int32(sig)}}); err != nil {
		return s.sendErr(err)
	}
	return nil
}

func (s *execStream) Resize(size guest.TermSize) error {
	if err := size.Validate(); err != nil {
		return err
	}
	if err := s.send(&shimv2.ExecClientMessage{Msg: &shimv2.ExecClientMessage_Resize{Resize: &shimv2.ExecResize{Rows: size.Rows, Cols: size.Cols}}}); err != nil {
		return s.sendErr(err)
	}
	return nil
}

func (s *execStream) Recv() (guest.ExecEvent, error) {
	if s.done || !s.output {
		return guest.ExecEvent{}, io.EOF
	}
	for {
		msg, err := s.bs.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return guest.ExecEvent{}, fmt.Errorf("%w: %s: the stream ended without an exit status", errdefs.ErrUnavailable, s.step)
			}
			return guest.ExecEvent{}, execErr(s.ctx, s.step, err)
		}
		switch e := msg.GetEvent().(type) {
		case *shimv2.ExecServerMessage_Stdout:
			return guest.ExecEvent{Kind: guest.ExecStdout, Data: e.Stdout}, nil
		case *shimv2.ExecServerMessage_Stderr:
			return guest.ExecEvent{Kind: guest.ExecStderr, Data: e.Stderr}, nil
		case *shimv2.ExecServerMessage_Exited:
			s.done = true
			return guest.ExecEvent{Kind: guest.ExecExited, Exit: exitStatus(e.Exited)}, nil
		case *shimv2.ExecServerMessage_Paused:
			s.done = true
			return guest.ExecEvent{}, guest.ErrExecPaused
		}
	}
}

func (s *execStream) Finish() error {
	s.finishOnce.Do(func() {
		if err := s.closeRequest(); err != nil && !errors.Is(err, io.EOF) {
			s.finishErr = wireErr(s.ctx, s.step, err)
			return
		}
		if s.output {
			return
		}
		for {
			_, err := s.bs.Receive()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				s.finishErr = execErr(s.ctx, s.step, err)
				return
			}
		}
	})
	return s.finishErr
}

func (s *execStream) Close() {
	s.closeOnce.Do(func() {
		s.cancel()
		_ = s.bs.CloseResponse()
	})
}

func exitStatus(ex *shimv2.ExecExit) *guest.ExitStatus {
	if ex == nil {
		return &guest.ExitStatus{}
	}
	return &guest.ExitStatus{
		Code: int(ex.GetExitCode()), Signal: int(ex.GetSignal()), TimedOut: ex.GetTimedOut(),
		Truncated: ex.GetOutputTruncated(), Duration: time.Duration(ex.GetDurationMs()) * time.Millisecond,
		OOMKilled: ex.GetOomKilled(),
	}
}

func execInfo(in *shimv2.ExecInfo) guest.ExecInfo {
	e := guest.ExecInfo{
		ID: in.GetExecId(), Argv: slices.Clone(in.GetArgv()), PID: int(in.GetPid()), State: guest.ExecStateRunning,
		StartedAt: time.Unix(0, in.GetStartedAt()), TTY: in.GetTty(),
	}
	if in.GetState() == shimv2.ExecState_EXEC_STATE_EXITED {
		e.State, e.EndedAt, e.Exit = guest.ExecStateExited, time.Unix(0, in.GetEndedAt()), exitStatus(in.GetExit())
	}
	return e
}
