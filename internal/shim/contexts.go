package shim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// Host-side bounds on what a guest's ContextService may send back.
const (
	// maxContexts caps the contexts one List returns.
	maxContexts = 1024
	// maxMIMELen caps a result's MIME type.
	maxMIMELen = 128
	// maxErrorName, maxErrorValue, maxTracebackLines and maxTracebackBytes
	// bound a CodeError.
	maxErrorName      = 256
	maxErrorValue     = 64 << 10
	maxTracebackLines = 512
	maxTracebackBytes = 1 << 20
	// maxInfoString bounds the strings of a ContextInfo (cwd, state).
	maxInfoString = 4096
)

// contextRelay serves the shim's ContextService (proto/airlock/shim/v2) by
// mapping it to the guest's, with the limits a hostile agent cannot
// ignore: ids and languages are checked before the guest sees them, a
// run's output (stdout + stderr + result bytes) is capped, its deadline
// (timeout + timeoutGrace) holds, results are bounded
// (guest.MaxResultEntries values of at most guest.MaxResultValueBytes
// each), unknown events are dropped, and every run ends with exactly one
// `end`.
type contextRelay struct {
	agent *agentapi.Client
	env   *defaultEnv   // the sandbox's default environment
	clk   clock.Clock   // host-side deadlines and durations (nil: the system clock)
	grace time.Duration // past a run's timeout, the host's deadline (timeoutGrace)
}

var _ shimv2connect.ContextServiceHandler = (*contextRelay)(nil)

// require refuses agents that predate ContextService.
func (r *contextRelay) require() error {
	if err := r.agent.Require(agentapi.VersionContexts, "code contexts"); err != nil {
		return connect.NewError(connect.CodeUnimplemented, err)
	}
	return nil
}

// hostErr turns a manager-side validation error into InvalidArgument.
func hostErr(err error) error { return invalid(err) }

func checkRef(id string) error {
	if err := guest.ValidateContextID(id); err != nil {
		return hostErr(err)
	}
	return nil
}

// checkInfo validates a ContextInfo from the guest (guest data: it must
// look like what was asked for, with bounded strings).
func checkInfo(in *agentv1.ContextInfo) error {
	if in == nil {
		return errors.New("guest sent no context info")
	}
	if guest.ValidateContextID(in.GetId()) != nil {
		return errors.New("guest sent a malformed context id")
	}
	if guest.ValidateLanguage(in.GetLanguage()) != nil {
		return errors.New("guest sent an unknown context language")
	}
	if len(in.GetCwd()) > maxInfoString || len(in.GetState()) > 16 {
		return errors.New("guest sent an oversized context info")
	}
	switch in.GetState() {
	case "", "idle", "busy", "dead":
	default:
		return errors.New("guest sent an unknown context state")
	}
	return nil
}

func badGuest(err error) error { return connect.NewError(connect.CodeUnavailable, err) }

// wireContextInfo maps a checked guest ContextInfo. An exit is kept only
// for a dead context and only if it is one a process can have: an exit
// status 0-255, or -1 with a signal 1-64.
func wireContextInfo(in *agentv1.ContextInfo) *shimv2.ContextInfo {
	out := &shimv2.ContextInfo{Id: in.GetId(), Language: in.GetLanguage(), Cwd: in.GetCwd(),
		CreatedUnixNano: in.GetCreatedUnixNano(), State: in.GetState(), IsDefault: in.GetIsDefault()}
	if e := in.GetExit(); e != nil && in.GetState() == "dead" {
		code, sig := e.GetExitCode(), e.GetSignal()
		if (code >= 0 && code <= 255 && sig == 0) || (code == -1 && sig >= 1 && sig <= 64) {
			out.Exit = &shimv2.ContextExit{ExitCode: code, Signal: sig, OomKilled: e.GetOomKilled() && sig == 9}
		}
	}
	return out
}

func (r *contextRelay) Create(ctx context.Context, req *connect.Request[shimv2.CreateContextRequest]) (*connect.Response[shimv2.ContextInfo], error) {
	if err := r.require(); err != nil {
		return nil, err
	}
	m := req.Msg
	areq, step := &agentv1.CreateContextRequest{Language: "python", Warm: true}, "create a warm context"
	if m.GetWarm() {
		// The manager's warm pools ask, for a sandbox no caller holds yet.
		// It gets no environment: the default context adopts it only if it
		// is asked for with none.
		if lang := m.GetLanguage(); (lang != "" && lang != "python") || m.GetId() != "" || m.GetCwd() != "" || len(m.GetEnv()) > 0 {
			return nil, invalid(errors.New("only a python context with no id, cwd or env can be started warm"))
		}
	} else {
		if err := (guest.ContextSpec{ID: m.GetId(), Language: m.GetLanguage(), Cwd: m.GetCwd(), Env: m.GetEnv()}).Validate(); err != nil {
			return nil, hostErr(err)
		}
		if c := m.GetCwd(); c != "" {
			if err := ValidateGuestPath(c); err != nil {
				return nil, invalid(fmt.Errorf("cwd: %w", err))
			}
		}
		areq, step = &agentv1.CreateContextRequest{
			Language: m.GetLanguage(), Id: m.GetId(), Cwd: m.GetCwd(), Env: withDefaults(r.env.get(), m.GetEnv()),
		}, "create context"
	}
	resp, err := r.agent.Contexts.Create(ctx, connect.NewRequest(areq))
	if err != nil {
		return nil, relayErr(step, err)
	}
	if err := checkInfo(resp.Msg); err != nil {
		return nil, badGuest(err)
	}
	return connect.NewResponse(wireContextInfo(resp.Msg)), nil
}

func (r *contextRelay) List(ctx context.Context, _ *connect.Request[shimv2.ListContextsRequest]) (*connect.Response[shimv2.ListContextsResponse], error) {
	if err := r.require(); err != nil {
		return nil, err
	}
	resp, err := r.agent.Contexts.List(ctx, connect.NewRequest(&agentv1.ListContextsRequest{}))
	if err != nil {
		return nil, relayErr("list contexts", err)
	}
	if len(resp.Msg.GetContexts()) > maxContexts {
		return nil, badGuest(fmt.Errorf("guest listed more than %d contexts", maxContexts))
	}
	out := &shimv2.ListContextsResponse{Contexts: make([]*shimv2.ContextInfo, 0, len(resp.Msg.GetContexts()))}
	for _, in := range resp.Msg.GetContexts() {
		if err := checkInfo(in); err != nil {
			return nil, badGuest(err)
		}
		out.Contexts = append(out.Contexts, wireContextInfo(in))
	}
	return connect.NewResponse(out), nil
}

func (r *contextRelay) Delete(ctx context.Context, req *connect.Request[shimv2.DeleteContextRequest]) (*connect.Response[shimv2.DeleteContextResponse], error) {
	if err := r.require(); err != nil {
		return nil, err
	}
	if err := checkRef(req.Msg.GetId()); err != nil {
		return nil, err
	}
	if _, err := r.agent.Contexts.Delete(ctx, connect.NewRequest(&agentv1.DeleteContextRequest{Id: req.Msg.GetId()})); err != nil {
		return nil, relayErr("delete context", err)
	}
	return connect.NewResponse(&shimv2.DeleteContextResponse{}), nil
}

func (r *contextRelay) Restart(ctx context.Context, req *connect.Request[shimv2.RestartContextRequest]) (*connect.Response[shimv2.ContextInfo], error) {
	if err := r.require(); err != nil {
		return nil, err
	}
	if err := checkRef(req.Msg.GetId()); err != nil {
		return nil, err
	}
	resp, err := r.agent.Contexts.Restart(ctx, connect.NewRequest(&agentv1.RestartContextRequest{Id: req.Msg.GetId()}))
	if err != nil {
		return nil, relayErr("restart context", err)
	}
	if err := checkInfo(resp.Msg); err != nil {
		return nil, badGuest(err)
	}
	return connect.NewResponse(wireContextInfo(resp.Msg)), nil
}

func (r *contextRelay) Interrupt(ctx context.Context, req *connect.Request[shimv2.InterruptContextRequest]) (*connect.Response[shimv2.InterruptContextResponse], error) {
	if err := r.require(); err != nil {
		return nil, err
	}
	if err := checkRef(req.Msg.GetId()); err != nil {
		return nil, err
	}
	if _, err := r.agent.Contexts.Interrupt(ctx, connect.NewRequest(&agentv1.InterruptContextRequest{Id: req.Msg.GetId()})); err != nil {
		return nil, relayErr("interrupt context", err)
	}
	return connect.NewResponse(&shimv2.InterruptContextResponse{}), nil
}

// Run relays one run, applying runGuard's limits.
func (r *contextRelay) Run(ctx context.Context, req *connect.Request[shimv2.RunCodeRequest], out *connect.ServerStream[shimv2.CodeEvent]) error {
	if err := r.require(); err != nil {
		return err
	}
	m := req.Msg
	if err := (guest.CodeRequest{ContextID: m.GetContextId(), Language: m.GetLanguage(), Code: m.GetCode(),
		Timeout: time.Duration(m.GetTimeoutMs()) * time.Millisecond}).Validate(); err != nil {
		return hostErr(err)
	}
	msg := &agentv1.RunCodeRequest{ContextId: m.GetContextId(), Language: m.GetLanguage(), Code: m.GetCode(),
		TimeoutMs: m.GetTimeoutMs(), MaxOutputBytes: m.GetMaxOutputBytes()}
	if limit := msg.GetMaxOutputBytes(); limit == 0 || limit > guest.MaxCodeOutputBytes {
		msg.MaxOutputBytes = guest.MaxCodeOutputBytes
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	clk := clock.Or(r.clk)
	g := &runGuard{limit: msg.GetMaxOutputBytes(), clk: clk, t0: clk.Now(), contextID: msg.GetContextId()}
	if t := msg.GetTimeoutMs(); t > 0 {
		d := time.Duration(t)*time.Millisecond + r.grace
		timer := clk.AfterFunc(d, func() { g.hostTimedOut.Store(true); cancel() })
		defer timer.Stop()
	}
	in, err := r.agent.Contexts.Run(ctx, connect.NewRequest(msg))
	if err != nil {
		if g.hostTimedOut.Load() {
			return out.Send(wireCodeEvent(g.madeUpEnd()))
		}
		return relayErr("run code", err)
	}
	defer in.Close()
	for in.Receive() {
		ev, done := g.filter(in.Msg())
		if ev == nil {
			continue
		}
		if err := out.Send(wireCodeEvent(ev)); err != nil {
			return err
		}
		if done {
			return nil
		}
	}
	if g.hostTimedOut.Load() {
		return out.Send(wireCodeEvent(g.madeUpEnd()))
	}
	if err := in.Err(); err != nil {
		return relayErr("run code", err)
	}
	return connect.NewError(connect.CodeUnavailable, errors.New("guest ended the run without an end event"))
}

// wireCodeEvent maps an event runGuard.filter admitted (or made up).
func wireCodeEvent(ev *agentv1.RunCodeEvent) *shimv2.CodeEvent {
	switch e := ev.GetEvent().(type) {
	case *agentv1.RunCodeEvent_Stdout:
		return &shimv2.CodeEvent{Event: &shimv2.CodeEvent_Stdout{Stdout: e.Stdout}}
	case *agentv1.RunCodeEvent_Stderr:
		return &shimv2.CodeEvent{Event: &shimv2.CodeEvent_Stderr{Stderr: e.Stderr}}
	case *agentv1.RunCodeEvent_Result:
		return &shimv2.CodeEvent{Event: &shimv2.CodeEvent_Result{Result: &shimv2.CodeResult{Data: e.Result.GetData(), Main: e.Result.GetIsMainResult()}}}
	case *agentv1.RunCodeEvent_Error:
		return &shimv2.CodeEvent{Event: &shimv2.CodeEvent_Error{Error: &shimv2.CodeError{
			Name: e.Error.GetName(), Value: e.Error.GetValue(), Traceback: e.Error.GetTraceback()}}}
	case *agentv1.RunCodeEvent_End:
		return &shimv2.CodeEvent{Event: &shimv2.CodeEvent_End{End: &shimv2.CodeEnd{
			TimedOut: e.End.GetTimedOut(), Truncated: e.End.GetTruncated(), DurationMs: e.End.GetDurationMs(),
			ExecutionCount: e.End.GetExecutionCount(), ContextId: e.End.GetContextId()}}}
	}
	return &shimv2.CodeEvent{}
}

// runGuard applies the host-side limits to one run's events.
type runGuard struct {
	hostTimedOut atomic.Bool
	limit        uint64
	sent         uint64
	truncated    bool
	clk          clock.Clock
	t0           time.Time
	contextID    string
}

// madeUpEnd is the end the host reports when the agent missed the deadline.
func (g *runGuard) madeUpEnd() *agentv1.RunCodeEvent {
	return &agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_End{End: &agentv1.CodeEnd{
		TimedOut: true, Truncated: g.truncated, DurationMs: g.clk.Now().Sub(g.t0).Milliseconds(), ContextId: g.contextID,
	}}}
}

// filter returns the event to forward (nil to drop it) and whether it is
// the end.
func (g *runGuard) filter(ev *agentv1.RunCodeEvent) (*agentv1.RunCodeEvent, bool) {
	switch e := ev.GetEvent().(type) {
	case *agentv1.RunCodeEvent_Stdout:
		if !admit(&g.sent, g.limit, &e.Stdout, &g.truncated) {
			return nil, false
		}
	case *agentv1.RunCodeEvent_Stderr:
		if !admit(&g.sent, g.limit, &e.Stderr, &g.truncated) {
			return nil, false
		}
	case *agentv1.RunCodeEvent_Result:
		res, n, ok := boundResult(e.Result)
		if !ok || g.sent+n > g.limit {
			// A result is whole or absent: never a cut image.
			g.truncated = true
			return nil, false
		}
		g.sent += n
		e.Result = res
	case *agentv1.RunCodeEvent_Error:
		e.Error = boundError(e.Error)
	case *agentv1.RunCodeEvent_End:
		end := e.End
		if end == nil {
			end = &agentv1.CodeEnd{}
		}
		if g.truncated {
			end.Truncated = true
		}
		if guest.ValidateContextID(end.GetContextId()) != nil {
			end.ContextId = g.contextID
		}
		if end.DurationMs < 0 {
			end.DurationMs = 0
		}
		e.End = end
		return ev, true
	default:
		return nil, false // unknown event from a newer or hostile agent: drop
	}
	return ev, false
}

// boundResult checks a result's MIME entries (at most MaxResultEntries,
// each value at most MaxResultValueBytes, types of the form type/subtype)
// and returns it with its size; ok is false if it breaks a bound.
func boundResult(res *agentv1.CodeResult) (*agentv1.CodeResult, uint64, bool) {
	if res == nil || len(res.GetData()) == 0 || len(res.GetData()) > guest.MaxResultEntries {
		return nil, 0, false
	}
	var n uint64
	for k, v := range res.GetData() {
		if !validMIME(k) || len(v) > guest.MaxResultValueBytes {
			return nil, 0, false
		}
		n += uint64(len(v))
	}
	return res, n, true
}

// validMIME accepts type/subtype in printable ASCII without spaces.
func validMIME(s string) bool {
	if len(s) == 0 || len(s) > maxMIMELen || strings.Count(s, "/") != 1 || s[0] == '/' || s[len(s)-1] == '/' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// boundError trims a CodeError's fields to the host's bounds.
func boundError(e *agentv1.CodeError) *agentv1.CodeError {
	if e == nil {
		return &agentv1.CodeError{Name: "Error"}
	}
	out := &agentv1.CodeError{Name: clip(e.GetName(), maxErrorName), Value: clip(e.GetValue(), maxErrorValue)}
	total := 0
	for i, line := range e.GetTraceback() {
		if i >= maxTracebackLines || total+len(line) > maxTracebackBytes {
			out.Traceback = append(out.Traceback, "... (traceback truncated)")
			break
		}
		total += len(line)
		out.Traceback = append(out.Traceback, line)
	}
	return out
}

// clip cuts s to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
