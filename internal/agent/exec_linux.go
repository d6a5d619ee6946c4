package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	"github.com/airlock-sandbox/airlock/internal/agent/cgroup"
	"github.com/airlock-sandbox/airlock/internal/agent/reaper"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

const (
	// outputChunk caps one stdout or stderr message.
	outputChunk = 32 << 10
	// defaultMaxOutput is the output cap when the host sets none.
	defaultMaxOutput = 64 << 20
	// maxDrain bounds how long output is drained after the process exits
	// while the pipes stay busy (see run).
	maxDrain = time.Second
	// maxTermSize bounds a terminal's rows and columns.
	maxTermSize = 10000
)

// execService implements ExecService.
type execService struct {
	log    *slog.Logger
	reaper *reaper.Reaper
	cg     *cgroup.Manager // nil: no cgroups (host mode)
	users  userDB
	pids   uint32        // default pids limit
	guest  bool          // PID 1: adjust oom_score_adj around forks
	grace  time.Duration // how long to drain pipes after the process exits

	// wg owns the per-exec request readers, which can outlive their
	// handler by a moment (until connect closes the request body).
	wg *sync.WaitGroup
	// parked holds the execs parked by their streams.
	parked *parkTable
}

var _ agentv1connect.ExecServiceHandler = (*execService)(nil)

// Exec runs one process. See ExecService in the proto for the contract.
func (s *execService) Exec(ctx context.Context, stream *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse]) error {
	first, err := stream.Receive()
	if errors.Is(err, io.EOF) {
		return invalidf("exec stream has no start message")
	}
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return invalidf("the first exec message must be start")
	}
	var e *execState
	if token := start.GetAdopt(); token != "" {
		if len(start.GetArgv()) > 0 || len(start.GetEnv()) > 0 || start.GetCwd() != "" || start.GetUser() != "" ||
			start.GetStdin() || start.GetTimeoutMs() != 0 || start.GetMaxOutputBytes() != 0 || start.GetPidsLimit() != 0 || start.GetTty() != nil {
			return invalidf("an adopting start has only adopt set")
		}
		if e = s.parked.take(token); e == nil {
			return connect.NewError(connect.CodeNotFound, errors.New("no exec is parked with this token"))
		}
	} else {
		spec, err := s.prepare(start)
		if err != nil {
			return err
		}
		p, err := s.spawn(spec)
		if err != nil {
			return err
		}
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.Debug("exec started", "pid", p.pid, "path", spec.path)
		}
		e = &execState{spec: spec, p: p, left: spec.maxOut, timeoutLeft: spec.timeout}
	}
	parked, err := s.run(ctx, stream, e)
	if !parked {
		e.p.release()
	}
	return err
}

// ListParked returns the parked execs. See the proto.
func (s *execService) ListParked(context.Context, *connect.Request[agentv1.ListParkedRequest]) (*connect.Response[agentv1.ListParkedResponse], error) {
	return connect.NewResponse(&agentv1.ListParkedResponse{Execs: s.parked.list()}), nil
}

// prepare validates start and resolves the user, environment, working
// directory and executable.
func (s *execService) prepare(start *agentv1.ExecStart) (*execSpec, error) {
	if err := checkArgv(start.GetArgv()); err != nil {
		return nil, err
	}
	if err := checkEnv(start.GetEnv()); err != nil {
		return nil, err
	}
	id, err := s.users.resolve(start.GetUser())
	if err != nil {
		return nil, err
	}
	spec := &execSpec{
		argv:    start.GetArgv(),
		env:     buildEnv(id, start.GetEnv()),
		user:    start.GetUser(),
		id:      id,
		stdin:   start.GetStdin(),
		timeout: time.Duration(start.GetTimeoutMs()) * time.Millisecond,
		maxOut:  start.GetMaxOutputBytes(),
		pids:    start.GetPidsLimit(),
	}
	if spec.maxOut == 0 {
		spec.maxOut = defaultMaxOutput
	}
	if t := start.GetTty(); t != nil {
		if t.GetRows() < 1 || t.GetRows() > maxTermSize || t.GetCols() < 1 || t.GetCols() > maxTermSize {
			return nil, invalidf("terminal size %dx%d: rows and cols are 1..%d", t.GetCols(), t.GetRows(), maxTermSize)
		}
		spec.tty = &pty.Winsize{Rows: uint16(t.GetRows()), Cols: uint16(t.GetCols())}
		spec.stdin = true
		if envValue(spec.env, "TERM") == "" {
			spec.env = append(spec.env, "TERM=xterm-256color")
		}
	}
	if spec.pids == 0 {
		spec.pids = s.pids
	}
	spec.dir = start.GetCwd()
	if spec.dir == "" {
		spec.dir = "/"
		if id.uid != 0 {
			if fi, err := os.Stat(id.home); err == nil && fi.IsDir() {
				spec.dir = id.home
			}
		}
	} else if why := pathProblem(spec.dir); why != "" {
		return nil, invalidf("cwd %s", why)
	}
	fi, err := os.Stat(spec.dir)
	if err != nil {
		return nil, sysError("cwd", err)
	}
	if !fi.IsDir() {
		return nil, preconditionf("cwd is not a directory")
	}
	spec.path, err = lookPath(spec.argv[0], envValue(spec.env, "PATH"))
	if err != nil {
		return nil, err
	}
	return spec, nil
}

// run streams the process's output, handles stdin and signals, enforces the
// timeout, and ends with exactly one exited message, or with parked when the
// host parks the exec (parked is then true and the park table owns e).
func (s *execService) run(ctx context.Context, stream *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse], e *execState) (parked bool, _ error) {
	p := e.p
	out := &outSender{stream: stream, left: e.left, truncated: e.truncated}
	if err := out.sendMsg(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Started{Started: &agentv1.ExecStarted{Pid: int32(p.pid)}}}); err != nil {
		p.kill()
		<-p.done
		return false, err
	}

	// An adopted exec's pipes still have the deadline that parked it.
	_ = p.stdout.SetReadDeadline(time.Time{})
	if p.stderr != nil {
		_ = p.stderr.SetReadDeadline(time.Time{})
	}
	readers := make(chan struct{}, 2)
	go out.pump(p.stdout, false, readers)
	if p.stderr != nil {
		go out.pump(p.stderr, true, readers)
	} else {
		readers <- struct{}{} // a terminal: one output stream
	}
	parkc := make(chan string, 1)
	s.wg.Go(func() { receive(stream, p, parkc) })

	var (
		timeout  <-chan time.Time
		deadline time.Time
	)
	if e.timeoutLeft > 0 {
		deadline = time.Now().Add(e.timeoutLeft)
		t := time.NewTimer(e.timeoutLeft)
		defer t.Stop()
		timeout = t.C
	}
	cancelled := ctx.Done()
	var (
		ws       syscall.WaitStatus
		lost     bool
		timedOut = e.timedOut
		gone     bool // the host cancelled the stream
	)
wait:
	for {
		select {
		case st, ok := <-p.done:
			ws, lost = st, !ok
			break wait
		case <-timeout:
			timedOut, timeout = true, nil
			p.kill()
		case <-cancelled:
			gone, cancelled = true, nil
			p.kill()
		case token := <-parkc:
			if timeout != nil {
				e.timeoutLeft = max(time.Until(deadline), time.Millisecond)
			}
			e.timedOut = timedOut
			return s.park(p, out, readers, token, e)
		}
	}
	duration := time.Since(p.start)

	// Drain what the process wrote. Background children may hold the pipes
	// open, so stop once the pipes have been quiet for a grace period, or
	// at the latest after maxDrain: output still being read or forwarded
	// extends the grace, so what the process wrote before exiting is not cut
	// off by a slow channel.
	exitedAt := time.Now()
	grace := time.NewTimer(s.grace)
	defer grace.Stop()
	lastReads := out.reads.Load()
	for n := 0; n < 2; {
		select {
		case <-readers:
			n++
		case <-grace.C:
			reads := out.reads.Load()
			busy := reads != lastReads || out.sending.Load() > 0
			lastReads = reads
			if busy && time.Since(exitedAt) < maxDrain {
				grace.Reset(s.grace)
				continue
			}
			now := time.Now()
			_ = p.stdout.SetReadDeadline(now)
			if p.stderr != nil {
				_ = p.stderr.SetReadDeadline(now)
			}
		}
	}
	if gone {
		return false, connect.NewError(connect.CodeCanceled, errors.New("exec cancelled by the host"))
	}

	exited := &agentv1.ExecExited{
		TimedOut:        timedOut,
		OutputTruncated: out.wasTruncated(),
		DurationMs:      duration.Milliseconds(),
		OomKilled:       p.cg != nil && p.cg.OOMKills() > 0,
	}
	switch {
	case lost:
		exited.ExitCode = -1
	case ws.Signaled():
		exited.ExitCode, exited.Signal = -1, int32(ws.Signal())
	default:
		exited.ExitCode = int32(ws.ExitStatus())
	}
	return false, out.sendMsg(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Exited{Exited: exited}})
}

// park stops the output pumps (what they read is sent first), hands e to
// the park table under token and answers parked. If the table refuses,
// the exec is killed and the stream fails.
func (s *execService) park(p *process, out *outSender, readers <-chan struct{}, token string, e *execState) (bool, error) {
	now := time.Now()
	_ = p.stdout.SetReadDeadline(now)
	if p.stderr != nil {
		_ = p.stderr.SetReadDeadline(now)
	}
	<-readers
	<-readers
	out.mu.Lock()
	e.left, e.truncated = out.left, out.truncated
	out.mu.Unlock()
	if err := s.parked.add(token, e); err != nil {
		p.kill()
		<-p.done
		return false, err
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("exec parked", "pid", p.pid)
	}
	// The exec stays parked even if the host is gone by now: it can list
	// and adopt it.
	return true, out.sendMsg(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Parked{Parked: &agentv1.ExecParked{}}})
}

// receive handles the requests after start until the host closes its side
// or parks the exec. Closing the request side counts as closing stdin; a
// park leaves stdin open for the adopter and sends the token on parkc.
func receive(stream *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse], p *process, parkc chan<- string) {
	for {
		req, err := stream.Receive()
		if err != nil {
			p.closeStdin()
			return
		}
		switch m := req.GetMsg().(type) {
		case *agentv1.ExecRequest_Park:
			parkc <- m.Park.GetToken() // buffered; the only send
			return
		case *agentv1.ExecRequest_Stdin:
			p.writeStdin(m.Stdin)
		case *agentv1.ExecRequest_CloseStdin:
			if m.CloseStdin {
				p.closeStdin()
			}
		case *agentv1.ExecRequest_Signal:
			p.signal(m.Signal)
		case *agentv1.ExecRequest_Resize:
			if r, c := m.Resize.GetRows(), m.Resize.GetCols(); r >= 1 && r <= maxTermSize && c >= 1 && c <= maxTermSize {
				p.resize(&pty.Winsize{Rows: uint16(r), Cols: uint16(c)})
			}
		}
	}
}

// outSender serializes messages on the stream and applies the output cap.
type outSender struct {
	stream *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse]

	reads   atomic.Uint64 // successful pipe reads, for the drain
	sending atomic.Int32  // pumps inside output

	mu        sync.Mutex
	left      uint64 // output bytes still allowed
	truncated bool
	err       error // first send error: later output is dropped
}

func (o *outSender) sendMsg(m *agentv1.ExecResponse) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return o.err
	}
	o.err = o.stream.Send(m)
	return o.err
}

func (o *outSender) output(stderr bool, b []byte) {
	o.sending.Add(1)
	defer o.sending.Add(-1)
	o.mu.Lock()
	defer o.mu.Unlock()
	if uint64(len(b)) > o.left {
		b = b[:o.left]
		o.truncated = true
	}
	if len(b) == 0 || o.err != nil {
		return
	}
	o.left -= uint64(len(b))
	m := &agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: b}}
	if stderr {
		m.Event = &agentv1.ExecResponse_Stderr{Stderr: b}
	}
	o.err = o.stream.Send(m) // marshals b before returning
}

func (o *outSender) wasTruncated() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.truncated
}

// pump forwards f until EOF, an error or the read deadline. Past the cap it
// keeps reading so the process is never blocked on a full pipe.
func (o *outSender) pump(f *os.File, stderr bool, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	buf := make([]byte, outputChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			o.reads.Add(1)
			o.output(stderr, buf[:n])
		}
		if err != nil {
			return
		}
	}
}
