package shimclient

import (
	"context"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// contexts returns a ContextService client on c's connection, reading
// messages up to guest.MaxCodeMessageBytes (a result with an 8 MiB image
// plus its small text siblings).
func (c *Client) contexts() shimv2connect.ContextServiceClient {
	return shimv2connect.NewContextServiceClient(c.hc, baseURL,
		connect.WithReadMaxBytes(guest.MaxCodeMessageBytes), connect.WithAcceptCompression("gzip", nil, nil))
}

func contextInfo(in *shimv2.ContextInfo) guest.ContextInfo {
	out := guest.ContextInfo{ID: in.GetId(), Language: in.GetLanguage(), Cwd: in.GetCwd(),
		CreatedAt: time.Unix(0, in.GetCreatedUnixNano()), State: in.GetState(), IsDefault: in.GetIsDefault()}
	if e := in.GetExit(); e != nil {
		out.Exit = &guest.ContextExit{Code: int(e.GetExitCode()), Signal: int(e.GetSignal()), OOMKilled: e.GetOomKilled()}
	}
	return out
}

// CreateContext starts a code context. Errors: ErrInvalid (the shim refused
// the spec), ErrConflict (the id is taken), ErrUnsupported (the guest
// agent predates code contexts), ErrUnavailable.
func (c *Client) CreateContext(ctx context.Context, spec guest.ContextSpec) (guest.ContextInfo, error) {
	resp, err := c.contexts().Create(ctx, connect.NewRequest(&shimv2.CreateContextRequest{
		Id: spec.ID, Language: spec.Language, Cwd: spec.Cwd, Env: spec.Env,
	}))
	if err != nil {
		return guest.ContextInfo{}, wireErr(ctx, "create context", err)
	}
	return contextInfo(resp.Msg), nil
}

// WarmContext has the sandbox start a warm Python interpreter, kept apart
// until its default Python context is created with no cwd or env.
func (c *Client) WarmContext(ctx context.Context) error {
	if _, err := c.contexts().Create(ctx, connect.NewRequest(&shimv2.CreateContextRequest{Language: "python", Warm: true})); err != nil {
		return wireErr(ctx, "start a warm context", err)
	}
	return nil
}

// ListContexts returns the sandbox's code contexts.
func (c *Client) ListContexts(ctx context.Context) ([]guest.ContextInfo, error) {
	resp, err := c.contexts().List(ctx, connect.NewRequest(&shimv2.ListContextsRequest{}))
	if err != nil {
		return nil, wireErr(ctx, "list contexts", err)
	}
	out := make([]guest.ContextInfo, 0, len(resp.Msg.GetContexts()))
	for _, in := range resp.Msg.GetContexts() {
		out = append(out, contextInfo(in))
	}
	return out, nil
}

// DeleteContext stops context id and forgets its state (ErrNotFound if
// there is none).
func (c *Client) DeleteContext(ctx context.Context, id string) error {
	if _, err := c.contexts().Delete(ctx, connect.NewRequest(&shimv2.DeleteContextRequest{Id: id})); err != nil {
		return wireErr(ctx, "delete context", err)
	}
	return nil
}

// RestartContext replaces context id's interpreter (same id, state lost).
func (c *Client) RestartContext(ctx context.Context, id string) (guest.ContextInfo, error) {
	resp, err := c.contexts().Restart(ctx, connect.NewRequest(&shimv2.RestartContextRequest{Id: id}))
	if err != nil {
		return guest.ContextInfo{}, wireErr(ctx, "restart context", err)
	}
	return contextInfo(resp.Msg), nil
}

// InterruptContext interrupts the code running in context id.
func (c *Client) InterruptContext(ctx context.Context, id string) error {
	if _, err := c.contexts().Interrupt(ctx, connect.NewRequest(&shimv2.InterruptContextRequest{Id: id})); err != nil {
		return wireErr(ctx, "interrupt context", err)
	}
	return nil
}

// RunCode runs req and calls fn for every event, the last being exactly
// one EventEnd; it returns nil after it. An error from fn ends the run
// (the shim interrupts the code) and is returned as it is. A broken stream
// is categorized ("run code: ..."), one that ends without an end is
// ErrUnavailable. The caller validates req (req.Timeout fits in uint32
// milliseconds).
func (c *Client) RunCode(ctx context.Context, req guest.CodeRequest, fn func(guest.CodeEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.contexts().Run(ctx, connect.NewRequest(&shimv2.RunCodeRequest{
		ContextId: req.ContextID, Language: req.Language, Code: req.Code,
		TimeoutMs: uint32(req.Timeout / time.Millisecond), MaxOutputBytes: req.MaxOutputBytes,
	}))
	if err != nil {
		return wireErr(ctx, "run code", err)
	}
	defer st.Close()
	for st.Receive() {
		ev, ok := codeEvent(st.Msg())
		if !ok {
			continue // unknown (newer) event
		}
		if err := fn(ev); err != nil {
			return err
		}
		if ev.Kind == guest.EventEnd {
			return nil
		}
	}
	if err := st.Err(); err != nil {
		return wireErr(ctx, "run code", err)
	}
	return fmt.Errorf("%w: run code: the stream ended without an end event", errdefs.ErrUnavailable)
}

// codeEvent maps a wire event; ok is false for an empty or unknown one.
func codeEvent(in *shimv2.CodeEvent) (ev guest.CodeEvent, ok bool) {
	switch e := in.GetEvent().(type) {
	case *shimv2.CodeEvent_Stdout:
		return guest.CodeEvent{Kind: guest.EventStdout, Data: e.Stdout}, true
	case *shimv2.CodeEvent_Stderr:
		return guest.CodeEvent{Kind: guest.EventStderr, Data: e.Stderr}, true
	case *shimv2.CodeEvent_Result:
		data := e.Result.GetData()
		if data == nil {
			data = map[string][]byte{}
		}
		return guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{Data: data, Main: e.Result.GetMain()}}, true
	case *shimv2.CodeEvent_Error:
		return guest.CodeEvent{Kind: guest.EventError, Error: &guest.CodeError{
			Name: e.Error.GetName(), Value: e.Error.GetValue(), Traceback: e.Error.GetTraceback()}}, true
	case *shimv2.CodeEvent_End:
		ms := min(max(e.End.GetDurationMs(), 0), math.MaxInt64/int64(time.Millisecond))
		return guest.CodeEvent{Kind: guest.EventEnd, End: &guest.CodeEnd{
			TimedOut: e.End.GetTimedOut(), Truncated: e.End.GetTruncated(), Duration: time.Duration(ms) * time.Millisecond,
			ExecutionCount: e.End.GetExecutionCount(), ContextID: e.End.GetContextId()}}, true
	}
	return guest.CodeEvent{}, false
}
