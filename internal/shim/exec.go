package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
)

// checkStart validates an exec start on the host side and clamps its output
// cap to DefaultMaxOutputBytes. It returns an InvalidArgument Connect error.
func checkStart(start *agentv1.ExecStart) error {
	if start == nil {
		return invalid(errors.New("first exec message must be start"))
	}
	if len(start.GetArgv()) == 0 || start.GetArgv()[0] == "" {
		return invalid(errors.New("empty command"))
	}
	if c := start.GetCwd(); c != "" {
		if err := ValidateGuestPath(c); err != nil {
			return invalid(fmt.Errorf("cwd: %w", err))
		}
	}
	if limit := start.GetMaxOutputBytes(); limit == 0 || limit > DefaultMaxOutputBytes {
		start.MaxOutputBytes = DefaultMaxOutputBytes
	}
	return nil
}

// guardedExec is one agent exec stream with the host-side limits applied:
// the output cap (checkStart's MaxOutputBytes) and the deadline
// (timeout_ms + its grace, timeoutGrace in the shim) hold whatever the guest does. Every exec the
// shim owns (sessions) runs on one.
//
// Next must be called from one goroutine; Send and CloseRequest from any;
// Close may be called at any time and more than once.
type guardedExec struct {
	as *connect.BidiStreamForClient[agentv1.ExecRequest, agentv1.ExecResponse]

	reqMu sync.Mutex // serializes the request side: Send, CloseRequest

	cancel       context.CancelFunc
	timer        clock.Timer
	deadline     time.Time // of timer (zero without one)
	clk          clock.Clock
	hostTimedOut atomic.Bool
	limit        uint64
	sent         uint64
	truncated    bool
	done         bool
}

// openExec checks start (see checkStart), opens an exec stream to the agent
// under ctx and sends start. The host-side deadline is the start's timeout
// plus grace on clk. The caller must Close the result.
func openExec(ctx context.Context, agent *agentapi.Client, start *agentv1.ExecStart, defaults []string, clk clock.Clock, grace time.Duration) (*guardedExec, error) {
	if err := checkStart(start); err != nil {
		return nil, err
	}
	start.Env = withDefaults(defaults, start.GetEnv())
	var d time.Duration
	if t := start.GetTimeoutMs(); t > 0 {
		d = time.Duration(t)*time.Millisecond + grace
	}
	return openStream(ctx, agent, start, clk, start.GetMaxOutputBytes(), d)
}

// openAdopt opens an exec stream that adopts the process the agent parked
// under token (a pause parked it). The host-side limits go on where they
// stopped: sent of limit output bytes forwarded, and left of the deadline
// (0: none). The caller must Close the result.
func openAdopt(ctx context.Context, agent *agentapi.Client, token string, clk clock.Clock, limit, sent uint64, truncated bool, left time.Duration) (*guardedExec, error) {
	g, err := openStream(ctx, agent, &agentv1.ExecStart{Adopt: token}, clk, limit, left)
	if err != nil {
		return nil, err
	}
	g.sent, g.truncated = sent, truncated
	return g, nil
}

// openStream opens the agent stream, arms the host-side deadline (after d,
// 0: none) and sends start.
func openStream(ctx context.Context, agent *agentapi.Client, start *agentv1.ExecStart, clk clock.Clock, limit uint64, d time.Duration) (*guardedExec, error) {
	ctx, cancel := context.WithCancel(ctx)
	g := &guardedExec{cancel: cancel, limit: limit, clk: clk}
	if d > 0 {
		g.deadline = clk.Now().Add(d)
		g.timer = clk.AfterFunc(d, func() { g.hostTimedOut.Store(true); cancel() })
	}
	g.as = agent.Exec.Exec(ctx)
	// The HTTP/2 transport notices a cancelled ctx only once the request
	// body is done: end it, so that cancelling (Close, the host deadline,
	// the caller) always ends the stream and wakes Next.
	context.AfterFunc(ctx, func() { _ = g.CloseRequest() })
	if err := g.sendStart(start); err != nil {
		_, rerr := g.as.Receive()
		g.Close()
		return nil, relayErr("start exec", errors.Join(err, rerr))
	}
	return g, nil
}

// sendStart sends the start message.
func (g *guardedExec) sendStart(start *agentv1.ExecStart) error {
	g.reqMu.Lock()
	defer g.reqMu.Unlock()
	return g.as.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: start}})
}

// Send forwards stdin, close_stdin or a signal (never a second start).
func (g *guardedExec) Send(msg *agentv1.ExecRequest) error {
	if msg.GetStart() != nil {
		return nil
	}
	g.reqMu.Lock()
	defer g.reqMu.Unlock()
	return g.as.Send(msg)
}

// CloseRequest half-closes the stream (the client will send nothing more).
func (g *guardedExec) CloseRequest() error {
	g.reqMu.Lock()
	defer g.reqMu.Unlock()
	return g.as.CloseRequest()
}

// Next returns the next event for the client: started, stdout, stderr
// (trimmed to the output cap), and last exactly one exited, after which it
// returns io.EOF. If the host-side deadline fired, the exited event is made
// up by the host (signal 9, timed_out). Unknown events are dropped. Errors
// are Connect errors with bounded messages.
func (g *guardedExec) Next() (*agentv1.ExecResponse, error) {
	if g.done {
		return nil, io.EOF
	}
	for {
		ev, err := g.as.Receive()
		if err != nil {
			if g.hostTimedOut.Load() {
				g.done = true
				return &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: &agentv1.ExecExited{
					ExitCode: -1, Signal: 9, TimedOut: true, OutputTruncated: g.truncated,
				}}}, nil
			}
			if errors.Is(err, io.EOF) {
				return nil, connect.NewError(connect.CodeUnavailable, errors.New("guest ended the exec without an exit status"))
			}
			return nil, relayErr("exec", err)
		}
		switch e := ev.GetEvent().(type) {
		case *agentv1.ExecResponse_Stdout:
			if !admit(&g.sent, g.limit, &e.Stdout, &g.truncated) {
				continue
			}
		case *agentv1.ExecResponse_Stderr:
			if !admit(&g.sent, g.limit, &e.Stderr, &g.truncated) {
				continue
			}
		case *agentv1.ExecResponse_Exited:
			if e.Exited == nil {
				e.Exited = &agentv1.ExecExited{}
			}
			if g.truncated {
				e.Exited.OutputTruncated = true
			}
			g.done = true
		case *agentv1.ExecResponse_Started:
			if e.Started == nil {
				e.Started = &agentv1.ExecStarted{}
			}
		case *agentv1.ExecResponse_Parked:
			// The agent keeps the process (the answer to a park): the host
			// deadline stops with it and goes on from where it was (left).
			if g.timer != nil {
				g.timer.Stop()
			}
			g.done = true
		default:
			continue // unknown event from a newer or hostile agent: drop
		}
		return ev, nil
	}
}

// left is what remains of the host-side deadline (0: none; at least 1 ns
// once armed).
func (g *guardedExec) left() time.Duration {
	if g.deadline.IsZero() {
		return 0
	}
	return max(g.deadline.Sub(g.clk.Now()), time.Nanosecond)
}

// Close cancels the stream (the agent kills the process if it still runs)
// and releases it.
func (g *guardedExec) Close() {
	if g.timer != nil {
		g.timer.Stop()
	}
	g.cancel()
	if g.as != nil {
		_ = g.as.CloseResponse()
	}
}

// admit trims *data so that the total forwarded stays within limit.
func admit(sent *uint64, limit uint64, data *[]byte, truncated *bool) bool {
	if *sent >= limit {
		*truncated = true
		return false
	}
	if room := limit - *sent; uint64(len(*data)) > room {
		*data = (*data)[:room]
		*truncated = true
	}
	*sent += uint64(len(*data))
	return len(*data) > 0
}

// withDefaults returns the sandbox's default environment ("KEY=VALUE")
// without the keys env sets, then env: a request's own variables win.
func withDefaults(defaults, env []string) []string {
	if len(defaults) == 0 {
		return env
	}
	set := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := make([]string, 0, len(defaults)+len(env))
	for _, kv := range defaults {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}

// envList is a sandbox's default environment in a stable order.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// defaultEnv is the sandbox's default environment of execs and code
// contexts as "K=V" lines, replaced whole by a live change of its secrets
// (their placeholders). A nil *defaultEnv is empty. Safe for concurrent
// use.
type defaultEnv struct{ p atomic.Pointer[[]string] }

func newDefaultEnv(env map[string]string) *defaultEnv {
	d := &defaultEnv{}
	d.set(env)
	return d
}

func (d *defaultEnv) get() []string {
	if d == nil {
		return nil
	}
	if p := d.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (d *defaultEnv) set(env map[string]string) {
	l := envList(env)
	d.p.Store(&l)
}
