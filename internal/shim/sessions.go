package shim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Limits on the execs a shim owns (ExecService).
const (
	// maxRunningSessions caps execs running at once in one sandbox.
	maxRunningSessions = 64
	// maxFinishedSessions is how many finished execs (exit status and
	// retained output) the shim remembers; older ones are forgotten.
	maxFinishedSessions = 100
	// finishedOutputBudget caps the output retained by finished sessions
	// together; past it, the oldest finished sessions lose their output
	// (not their exit status).
	finishedOutputBudget = 64 << 20
)

// retainCap caps the stdout+stderr a session keeps for replay (the oldest
// goes first), and how far behind the live output an attacher may fall
// before it is cut off (sessions.retainCap, which tests lower).
const retainCap = 4 << 20

// sessions is the shim's table of execs it owns: each runs independently of
// any client, pumps its agent stream into a retained buffer, and fans its
// output out to attachers. Safe for concurrent use. Close ends every exec
// and waits for its goroutines.
type sessions struct {
	agent     *agentapi.Client
	st        *store.Store
	sandboxID string
	env       *defaultEnv // the sandbox's default environment
	log       *slog.Logger
	clk       clock.Clock   // start and end times, host-side exec deadlines
	retainCap int           // see retainCap
	grace     time.Duration // see timeoutGrace
	// gen holds the context that ends every exec stream when cancelled,
	// and parkCh, closed when Park starts (a flow-controlling attacher no
	// longer holds an exec's output back: its pump must get to the park).
	// reopen replaces it.
	gen atomic.Pointer[sessGen]
	wg  sync.WaitGroup // pumps and kill_on_detach kills
	// hostOOM, if set, counts the host's OOM kills among the sandbox's
	// host processes (runtime.HostOOMCounter: gVisor).
	hostOOM func() (uint64, error)

	mu       sync.Mutex
	endNote  string // why Close ended the running execs (CloseFor)
	byID     map[string]*session
	finished []string // ids of finished sessions, oldest first
	running  int      // running or starting
	closed   bool
	parking  bool // Park runs: Start refuses
	// streams counts client streams following or controlling an exec
	// (ExecService): a pause that parks the execs ends them.
	streams atomic.Int64
}

// sessGen is one life of a sessions table (see sessions.gen).
type sessGen struct {
	ctx    context.Context
	cancel context.CancelFunc
	parkCh chan struct{}
}

func newSessGen() *sessGen {
	ctx, cancel := context.WithCancel(context.Background())
	return &sessGen{ctx: ctx, cancel: cancel, parkCh: make(chan struct{})}
}

func newSessions(agent *agentapi.Client, st *store.Store, sandboxID string, env *defaultEnv, log *slog.Logger, clk clock.Clock) *sessions {
	t := &sessions{agent: agent, st: st, sandboxID: sandboxID, env: env, log: log, clk: clk, retainCap: retainCap, grace: timeoutGrace,
		byID: map[string]*session{}}
	t.gen.Store(newSessGen())
	return t
}

// ctx ends every exec stream of the table's current life when cancelled.
func (t *sessions) ctx() context.Context { return t.gen.Load().ctx }

// session is one exec owned by the shim.
type session struct {
	id           string
	argv         []string
	stdin        bool
	tty          bool
	tenant       string
	keyID        string
	killOnDetach bool
	startedAt    time.Time
	pid          int32
	g            *guardedExec
	hostOOMs     uint64 // sessions.hostOOM at the start
	hostOOMKnown bool

	mu        sync.Mutex
	out       []*agentv1.ExecResponse // retained stdout/stderr, oldest first
	outBytes  int
	dropped   uint64 // bytes dropped from the front of out
	attachers map[*attacher]struct{}
	endedAt   time.Time
	exit      *agentv1.ExecExited // nil while running
	parked    bool                // a pause parked it in the guest (Park)
	killNote  string              // why the host ended its stream (Park), for the output's last note
	pumpDone  chan struct{}       // closed when its pump returns
}

// attacher is one live reader of a session. Its queue is guarded by the
// session's mu.
type attacher struct {
	q      []*agentv1.ExecResponse
	qBytes int
	err    error // set when cut off for falling behind
	wake   chan struct{}
	// flow: the stream that started the exec reads its output like a pipe:
	// instead of being cut off when it falls behind, it holds the exec's
	// output back (the guest's writes block) until it caught up or went
	// away. space is signalled when it took its queue; gone is closed when
	// it detached.
	flow  bool
	space chan struct{}
	gone  chan struct{}
}

func newAttacher(flow bool) *attacher {
	return &attacher{wake: make(chan struct{}, 1), flow: flow, space: make(chan struct{}, 1), gone: make(chan struct{})}
}

func (a *attacher) notify() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// goLocked runs f as a goroutine owned by the table unless the table is
// closed; the caller holds t.mu.
func (t *sessions) goLocked(f func()) bool {
	if t.closed {
		return false
	}
	t.wg.Go(f)
	return true
}

// Start starts an exec that the shim owns and returns once the guest
// reported its pid, with the starting stream's attacher: a flow-controlling
// one, registered before any output is read, so that the starter loses no
// byte however fast the exec writes (Follow it, or detach it). ctx bounds
// only the wait for the start; the exec itself lives until it exits or the
// shim closes. tenant and keyID are recorded in the audit trail; with
// killOnDetach the exec is killed when its last attacher goes away.
func (t *sessions) Start(ctx context.Context, start *agentv1.ExecStart, tenant, keyID string, killOnDetach bool) (*session, *attacher, error) {
	if err := checkStart(start); err != nil {
		return nil, nil, err
	}
	t.mu.Lock()
	switch {
	case t.closed:
		t.mu.Unlock()
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is stopping"))
	case t.parking:
		t.mu.Unlock()
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is pausing; retry"))
	case t.running >= maxRunningSessions:
		t.mu.Unlock()
		return nil, nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("at most %d execs can run at once in a sandbox", maxRunningSessions))
	}
	t.running++ // reserved; released below on failure or by finish
	t.mu.Unlock()
	registered := false
	defer func() {
		if !registered {
			t.mu.Lock()
			t.running--
			t.mu.Unlock()
		}
	}()

	if start.GetTty() != nil {
		if err := t.agent.Require(agentapi.VersionTerminal, "terminals"); err != nil {
			return nil, nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
	}
	g, err := openExec(t.ctx(), t.agent, start, t.env.get(), t.clk, t.grace)
	if err != nil {
		return nil, nil, notStarted(err)
	}
	// The caller may give up while the guest starts the process.
	stop := context.AfterFunc(ctx, g.cancel)
	ev, err := g.Next()
	if !stop() {
		g.Close()
		return nil, nil, connect.NewError(connect.CodeCanceled, fmt.Errorf("start exec: %w", context.Cause(ctx)))
	}
	if err == nil && ev.GetStarted() == nil {
		err = connect.NewError(connect.CodeUnavailable, errors.New("guest did not report the exec's start"))
	}
	if err != nil {
		g.Close()
		return nil, nil, notStarted(err)
	}
	s := &session{
		id: guest.NewExecID(), argv: slices.Clone(start.GetArgv()), stdin: start.GetStdin() || start.GetTty() != nil, tty: start.GetTty() != nil,
		tenant: tenant, keyID: keyID, killOnDetach: killOnDetach,
		startedAt: t.clk.Now(), pid: ev.GetStarted().GetPid(), g: g, attachers: map[*attacher]struct{}{}, pumpDone: make(chan struct{}),
	}
	starter := newAttacher(true)
	s.attachers[starter] = struct{}{} // before the pump reads any output
	if t.hostOOM != nil {
		n, err := t.hostOOM()
		s.hostOOMs, s.hostOOMKnown = n, err == nil
	}
	if err := t.audit(s, "exec.start", map[string]any{
		"exec_id": s.id, "argv": s.argv, "user": start.GetUser(), "cwd": start.GetCwd(),
	}); err != nil {
		g.Close() // no exec runs unrecorded
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("record the exec in the audit trail"))
	}
	t.mu.Lock()
	if registered = t.goLocked(func() { t.pump(s) }); registered {
		t.byID[s.id] = s
	}
	t.mu.Unlock()
	if !registered {
		g.Close()
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox is stopping"))
	}
	t.log.Debug("exec session started", "exec_id", s.id, "pid", s.pid)
	return s, starter, nil
}

// notStarted marks a guest's refusal to start the program itself (the
// codes the agent gives a missing executable, cwd or user, a file it
// cannot execute) with shimv2.ExecNotStarted; other errors pass.
func notStarted(err error) error {
	ce, ok := errors.AsType[*connect.Error](err)
	if !ok {
		return err
	}
	switch ce.Code() {
	case connect.CodeNotFound, connect.CodePermissionDenied, connect.CodeFailedPrecondition:
	default:
		return err
	}
	out := connect.NewError(ce.Code(), errors.New(guest.Text(ce.Message(), maxGuestMessage)))
	if d, derr := connect.NewErrorDetail(&shimv2.ExecNotStarted{}); derr == nil {
		out.AddDetail(d)
	}
	return out
}

func (t *sessions) audit(s *session, action string, detail map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := t.st.AppendEvent(ctx, store.Event{Tenant: s.tenant, KeyID: s.keyID, SandboxID: t.sandboxID, Action: action, Detail: detail})
	if err != nil {
		t.log.Error("audit event", "action", action, "exec_id", s.id, "err", err)
	}
	return err
}

// pump moves the agent's events into the session until the exec ends (or
// is parked).
func (t *sessions) pump(s *session) {
	defer close(s.pumpDone)
	defer s.g.Close()
	for {
		ev, err := s.g.Next()
		if err != nil {
			note := "[airlock: the exec's stream to the guest broke; the process was killed]\n"
			s.mu.Lock()
			killNote := s.killNote
			s.mu.Unlock()
			if killNote != "" {
				note = "[airlock: " + killNote + "; the process was killed]\n"
			} else if t.ctx().Err() != nil {
				t.mu.Lock()
				note = "[airlock: " + cmp.Or(t.endNote, "the sandbox stopped") + "; the process was killed]\n"
				t.mu.Unlock()
			} else {
				t.log.Warn("exec session stream", "exec_id", s.id, "err", err)
			}
			s.publish(t, &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: []byte(note)}})
			t.finish(s, &agentv1.ExecExited{ExitCode: -1, Signal: 9, OutputTruncated: s.g.truncated})
			return
		}
		switch ev.GetEvent().(type) {
		case *agentv1.ExecResponse_Exited:
			t.finish(s, ev.GetExited())
			return
		case *agentv1.ExecResponse_Parked:
			t.parked(s, ev)
			return
		case *agentv1.ExecResponse_Stdout, *agentv1.ExecResponse_Stderr:
			s.publish(t, ev)
		}
	}
}

func outputLen(ev *agentv1.ExecResponse) int { return len(ev.GetStdout()) + len(ev.GetStderr()) }

// publish retains an output event and queues it for every attacher. A
// flow-controlling attacher that is too far behind holds it back first.
func (s *session) publish(t *sessions, ev *agentv1.ExecResponse) {
	n := outputLen(ev)
	s.mu.Lock()
	for {
		var behind *attacher
		for a := range s.attachers {
			if a.flow && a.qBytes > 0 && a.qBytes+n > t.retainCap {
				behind = a
				break
			}
		}
		if behind == nil {
			break
		}
		s.mu.Unlock()
		select {
		case <-behind.space:
		case <-behind.gone:
		case <-t.ctx().Done():
		case <-t.gen.Load().parkCh:
		}
		s.mu.Lock()
		if t.ctx().Err() != nil || t.parkStarted() {
			break
		}
	}
	defer s.mu.Unlock()
	s.out = append(s.out, ev)
	s.outBytes += n
	for s.outBytes > t.retainCap {
		first, excess := s.out[0], s.outBytes-t.retainCap
		if fl := outputLen(first); fl <= excess {
			s.out[0] = nil
			s.out = s.out[1:]
			s.outBytes -= fl
			s.dropped += uint64(fl)
			continue
		}
		// Events are shared with attacher queues: replace, never modify.
		if b := first.GetStdout(); b != nil {
			s.out[0] = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: b[excess:]}}
		} else {
			s.out[0] = &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: first.GetStderr()[excess:]}}
		}
		s.outBytes -= excess
		s.dropped += uint64(excess)
	}
	for a := range s.attachers {
		if a.qBytes+n > t.retainCap {
			a.q, a.qBytes = nil, 0
			a.err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("attacher fell more than %d bytes behind the exec's output", t.retainCap))
			delete(s.attachers, a)
			s.killIfDetachedLocked(t)
		} else {
			a.q = append(a.q, ev)
			a.qBytes += n
		}
		a.notify()
	}
}

// endAttachersLocked queues ev, the last event of s's streams (exited or
// parked), for every attacher and lets them go. The caller holds s.mu.
func (s *session) endAttachersLocked(ev *agentv1.ExecResponse) {
	for a := range s.attachers {
		a.q = append(a.q, ev)
		a.notify()
	}
	s.attachers = nil
}

// parkStarted reports whether Park has begun.
func (t *sessions) parkStarted() bool {
	select {
	case <-t.gen.Load().parkCh:
		return true
	default:
		return false
	}
}

// killIfDetachedLocked kills a kill_on_detach exec whose last attacher
// went away. The caller holds s.mu.
func (s *session) killIfDetachedLocked(t *sessions) {
	if !s.killOnDetach || s.exit != nil || len(s.attachers) > 0 {
		return
	}
	t.mu.Lock()
	t.goLocked(func() { _ = s.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Signal{Signal: 9}}) })
	t.mu.Unlock()
}

// finish records the exit, then hands it to attachers and moves the session
// to the finished list.
func (t *sessions) finish(s *session, ex *agentv1.ExecExited) {
	now := t.clk.Now()
	if ex.GetDurationMs() == 0 {
		ex.DurationMs = now.Sub(s.startedAt).Milliseconds()
	}
	if !ex.GetOomKilled() && t.killedByHostOOM(s, ex) {
		ex.OomKilled = true
	}
	_ = t.audit(s, "exec.exit", map[string]any{
		"exec_id": s.id, "code": ex.GetExitCode(), "signal": ex.GetSignal(), "timeout": ex.GetTimedOut(),
		"truncated": ex.GetOutputTruncated(), "duration_ms": ex.GetDurationMs(), "oom_killed": ex.GetOomKilled(),
	})
	ev := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: ex}}
	s.mu.Lock()
	s.exit, s.endedAt = ex, now
	s.endAttachersLocked(ev)
	s.mu.Unlock()

	t.mu.Lock()
	t.running--
	t.finished = append(t.finished, s.id)
	for len(t.finished) > maxFinishedSessions {
		delete(t.byID, t.finished[0])
		t.finished = t.finished[1:]
	}
	done := make([]*session, 0, len(t.finished))
	for _, id := range slices.Backward(t.finished) {
		done = append(done, t.byID[id]) // newest first
	}
	t.mu.Unlock()
	// Finished sessions no longer change their output: keep the newest
	// within the budget.
	kept := 0
	for _, f := range done {
		f.mu.Lock()
		if kept += f.outBytes; kept > finishedOutputBudget {
			f.dropped += uint64(f.outBytes)
			f.out, f.outBytes = nil, 0
		}
		f.mu.Unlock()
	}
	t.log.Debug("exec session exited", "exec_id", s.id, "code", ex.GetExitCode(), "signal", ex.GetSignal())
}

// killedByHostOOM reports whether an exec the guest does not call OOM
// killed was ended by the host's OOM killer: it ended by SIGKILL (or with
// 137, a shell's report of a child ended so) while the host counted an OOM
// kill in the sandbox's cgroup. Under gVisor that is the only trace of an
// OOM kill: the host ends the stub process behind the guest process.
func (t *sessions) killedByHostOOM(s *session, ex *agentv1.ExecExited) bool {
	if t.hostOOM == nil || !s.hostOOMKnown || (ex.GetSignal() != 9 && ex.GetExitCode() != 137) {
		return false
	}
	n, err := t.hostOOM()
	return err == nil && n > s.hostOOMs
}

// Get returns a session, or a NotFound Connect error.
func (t *sessions) Get(id string) (*session, error) {
	t.mu.Lock()
	s := t.byID[id]
	t.mu.Unlock()
	if s == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such exec"))
	}
	return s, nil
}

// List returns every known session, oldest first.
func (t *sessions) List() []*shimv2.ExecInfo {
	t.mu.Lock()
	all := make([]*session, 0, len(t.byID))
	for _, s := range t.byID {
		all = append(all, s)
	}
	t.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].startedAt.Before(all[j].startedAt) })
	out := make([]*shimv2.ExecInfo, len(all))
	for i, s := range all {
		out[i] = s.info()
	}
	return out
}

// Running is the number of execs running or starting.
func (t *sessions) Running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.running
}

// Close ends every running exec (the guest kills them), records their
// exits and waits for the table's goroutines. Start fails afterwards.
// Each exec's output ends with a note that the sandbox stopped.
func (t *sessions) Close() { t.CloseFor("") }

// CloseFor is Close with why in the note that ends each running exec's
// output ("the sandbox was paused (force)"); "" is "the sandbox stopped".
func (t *sessions) CloseFor(why string) {
	t.mu.Lock()
	t.closed = true
	t.endNote = why
	t.mu.Unlock()
	t.gen.Load().cancel()
	t.wg.Wait()
}

// reopen makes a table that Park and CloseFor ended take execs again,
// empty: a live snapshot then restores what Park saved into it.
func (t *sessions) reopen() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen.Store(newSessGen())
	t.byID, t.finished, t.running = map[string]*session{}, nil, 0
	t.closed, t.parking, t.endNote = false, false, ""
}

func (s *session) info() *shimv2.ExecInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := &shimv2.ExecInfo{
		ExecId: s.id, Argv: s.argv, Pid: s.pid, State: shimv2.ExecState_EXEC_STATE_RUNNING,
		StartedAt: s.startedAt.UnixNano(), Tty: s.tty,
	}
	if s.exit != nil {
		in.State, in.EndedAt, in.Exit = shimv2.ExecState_EXEC_STATE_EXITED, s.endedAt.UnixNano(), wireExit(s.exit)
	}
	return in
}

// send forwards one request to the agent stream.
func (s *session) send(msg *agentv1.ExecRequest) error {
	if err := s.g.Send(msg); err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, guest.ErrExecExited)
	}
	return nil
}

func (s *session) exited() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exit != nil
}

// Input writes data to the exec's stdin in agent-sized chunks, then closes
// stdin if closeStdin.
func (s *session) Input(data []byte, closeStdin bool) error {
	if !s.stdin {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the exec was started without stdin"))
	}
	if s.exited() {
		return connect.NewError(connect.CodeFailedPrecondition, guest.ErrExecExited)
	}
	for len(data) > 0 {
		n := min(len(data), agentapi.ChunkSize)
		if err := s.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	if closeStdin {
		return s.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_CloseStdin{CloseStdin: true}})
	}
	return nil
}

// Signal sends sig to the exec's process group.
func (s *session) Signal(sig int32) error {
	if sig < 1 || sig > 64 {
		return invalid(fmt.Errorf("signal %d is out of range", sig))
	}
	if s.exited() {
		return connect.NewError(connect.CodeFailedPrecondition, guest.ErrExecExited)
	}
	return s.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Signal{Signal: sig}})
}

// Resize sets the size of the exec's terminal.
func (s *session) Resize(rows, cols uint32) error {
	if !s.tty {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("not a terminal: the exec was started without tty"))
	}
	if err := (guest.TermSize{Rows: rows, Cols: cols}).Validate(); err != nil {
		return invalid(err)
	}
	if s.exited() {
		return connect.NewError(connect.CodeFailedPrecondition, guest.ErrExecExited)
	}
	return s.send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Resize{Resize: &agentv1.TerminalSize{Rows: rows, Cols: cols}}})
}

// Attach calls send for the retained output (fromStart), then live output,
// then the exit, and returns nil after the exit. It returns ctx's error if
// ctx ends first, and a ResourceExhausted error if it fell too far behind.
func (s *session) Attach(ctx context.Context, t *sessions, fromStart bool, send func(*agentv1.ExecResponse) error) error {
	s.mu.Lock()
	var backlog []*agentv1.ExecResponse
	if fromStart {
		if s.dropped > 0 {
			note := fmt.Sprintf("[airlock: %d earlier bytes dropped]\n", s.dropped)
			backlog = append(backlog, &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stderr{Stderr: []byte(note)}})
		}
		backlog = append(backlog, s.out...)
	}
	var a *attacher
	switch {
	case s.exit != nil:
		backlog = append(backlog, &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: s.exit}})
	case s.parked:
		backlog = append(backlog, parkedEvent)
	default:
		a = newAttacher(false)
		s.attachers[a] = struct{}{}
	}
	s.mu.Unlock()
	if a != nil {
		defer s.detach(t, a)
	}
	for _, ev := range backlog {
		if err := send(ev); err != nil {
			return err
		}
	}
	if a == nil {
		return nil
	}
	return s.follow(ctx, a, send)
}

// Follow calls send for a's output (the starter's attacher from Start:
// every event since the start), then the exit, and returns nil after the
// exit or ctx's error if ctx ends first. It detaches a when it returns.
func (s *session) Follow(ctx context.Context, t *sessions, a *attacher, send func(*agentv1.ExecResponse) error) error {
	defer s.detach(t, a)
	return s.follow(ctx, a, send)
}

func (s *session) follow(ctx context.Context, a *attacher, send func(*agentv1.ExecResponse) error) error {
	for {
		select {
		case <-a.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		q, err := a.q, a.err
		a.q, a.qBytes = nil, 0
		s.mu.Unlock()
		select {
		case a.space <- struct{}{}:
		default:
		}
		for _, ev := range q {
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetExited() != nil || ev.GetParked() != nil {
				return nil
			}
		}
		if err != nil {
			return err
		}
	}
}

func (s *session) detach(t *sessions, a *attacher) {
	close(a.gone)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.attachers[a]; ok {
		delete(s.attachers, a)
		s.killIfDetachedLocked(t)
	}
}
