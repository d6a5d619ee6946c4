package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agent/cgroup"
	"github.com/airlock-sandbox/airlock/internal/agent/reaper"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

const (
	// defaultCodeOutput is the output cap of a Run when the host sets none.
	defaultCodeOutput = 16 << 20
	// interruptGrace is how long a timed-out or abandoned Run waits for its
	// interrupted code to stop before the interpreter is killed (the
	// context is then dead).
	interruptGrace = 5 * time.Second
	// startTimeout bounds how long an interpreter may take to be ready.
	startTimeout = 60 * time.Second
	// maxContexts caps the contexts of one guest.
	maxContexts = 64
	// maxCode caps the code of one Run.
	maxCode = 4 << 20
)

var contextIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`) })

// interpreters says which programs run contexts. Empty fields are looked up
// in the context's PATH.
type interpreters struct {
	Python string // python3 with ipykernel
	Node   string
	Bash   string
	// RunDir holds the contexts' private directories (default /run/airlock-contexts).
	RunDir string
}

// interp is a running interpreter. Its methods other than run and
// interrupt are safe to call at any time; run is called one at a time.
type interp interface {
	// run executes code and reports what happens through out. It returns
	// when the interpreter finished the code or died (then dead() is
	// closed), or with ctx's error once ctx is done and the interpreter
	// did not finish in time.
	run(ctx context.Context, code string, out *codeOutput) (execCount int32, err error)
	// interrupt asks the running code to stop (KeyboardInterrupt, SIGINT).
	interrupt()
	// dead is closed once the interpreter exited.
	dead() <-chan struct{}
	// exit says how the interpreter ended; nil until dead() is closed
	// (and when the agent could not tell).
	exit() *agentv1.ContextExit
	// close kills the interpreter and frees what it holds. Idempotent.
	close()
}

// codeContext is one context. Its interpreter is replaced by Restart.
type codeContext struct {
	id, lang, cwd string
	env           []string
	created       time.Time
	isDefault     bool

	// sem serializes runs (and restarts) in arrival order: blocked channel
	// senders are woken first in, first out.
	sem chan struct{}

	mu      sync.Mutex
	it      interp // nil once deleted
	busy    bool
	deleted bool
}

func (c *codeContext) current() interp {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.it
}

func (c *codeContext) info() *agentv1.ContextInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	state := "idle"
	switch {
	case c.it == nil || isClosed(c.it.dead()):
		state = "dead"
	case c.busy:
		state = "busy"
	}
	info := &agentv1.ContextInfo{
		Id:              c.id,
		Language:        c.lang,
		Cwd:             c.cwd,
		CreatedUnixNano: c.created.UnixNano(),
		State:           state,
		IsDefault:       c.isDefault,
	}
	if state == "dead" && c.it != nil {
		info.Exit = c.it.exit()
	}
	return info
}

// describeExit says how an interpreter ended, in the words of the
// messages that report it ("killed by signal 9").
func describeExit(e *agentv1.ContextExit) string {
	switch {
	case e == nil:
		return "the reason is unknown"
	case e.GetOomKilled():
		return "out of memory"
	case e.GetSignal() > 0:
		return "killed by signal " + strconv.Itoa(int(e.GetSignal()))
	}
	return "exit code " + strconv.Itoa(int(e.GetExitCode()))
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// contextService implements ContextService.
type contextService struct {
	log    *slog.Logger
	reaper *reaper.Reaper
	cg     *cgroup.Manager
	users  userDB
	pids   uint32
	guest  bool
	progs  interpreters

	// createMu serializes creation, so a default context starts once.
	createMu sync.Mutex

	mu       sync.Mutex
	contexts map[string]*codeContext
	// warm holds the default contexts started ahead of any sandbox
	// (CreateContextRequest.warm), by language: unlisted until adopted.
	warm   map[string]*codeContext
	closed bool
}

var _ agentv1connect.ContextServiceHandler = (*contextService)(nil)

func newContextService(log *slog.Logger, rp *reaper.Reaper, cg *cgroup.Manager, users userDB, pids uint32, guest bool, progs interpreters) *contextService {
	if progs.RunDir == "" {
		progs.RunDir = "/run/airlock-contexts"
	}
	return &contextService{log: log, reaper: rp, cg: cg, users: users, pids: pids, guest: guest, progs: progs, contexts: map[string]*codeContext{},
		warm: map[string]*codeContext{}}
}

func normalizeLang(l string) (string, error) {
	switch l {
	case "", "python", "python3":
		return "python", nil
	case "javascript", "js", "node":
		return "javascript", nil
	case "bash", "sh":
		return "bash", nil
	}
	return "", invalidf("unsupported language %q", truncate(l))
}

func (s *contextService) Create(_ context.Context, req *connect.Request[agentv1.CreateContextRequest]) (*connect.Response[agentv1.ContextInfo], error) {
	m := req.Msg
	lang, err := normalizeLang(m.GetLanguage())
	if err != nil {
		return nil, err
	}
	if m.GetWarm() {
		if lang != "python" || m.GetId() != "" || m.GetCwd() != "" || len(m.GetEnv()) > 0 {
			return nil, invalidf("only a python context with no id, cwd or env can be started warm")
		}
		c, err := s.startWarm(lang)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(c.info()), nil
	}
	id := m.GetId()
	if id == "" {
		var b [12]byte // 96 bits
		_, _ = rand.Read(b[:])
		id = "ctx-" + hex.EncodeToString(b[:])
	} else if !contextIDRe().MatchString(id) {
		return nil, invalidf("context id must match [a-z0-9][a-z0-9-]{0,62}")
	}
	// The host creates a language's default context ahead of a run, to
	// report its start (a Jupyter kernel takes seconds).
	c, err := s.create(id, lang, m.GetCwd(), m.GetEnv(), id == "default-"+lang)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(c.info()), nil
}

// create starts a context and registers it.
func (s *contextService) create(id, lang, cwd string, env []string, isDefault bool) (*codeContext, error) {
	if err := checkEnv(env); err != nil {
		return nil, err
	}
	if cwd != "" {
		if why := pathProblem(cwd); why != "" {
			return nil, invalidf("cwd %s", why)
		}
	}
	s.createMu.Lock()
	defer s.createMu.Unlock()
	s.mu.Lock()
	_, exists := s.contexts[id]
	n, closed := len(s.contexts), s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the agent is shutting down"))
	case exists:
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("context exists"))
	case n >= maxContexts:
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("too many contexts"))
	}
	c := &codeContext{id: id, lang: lang, cwd: cwd, env: env, created: time.Now(), isDefault: isDefault, sem: make(chan struct{}, 1)}
	it := s.adoptWarm(c)
	if it == nil {
		var err error
		if it, err = s.start(c); err != nil {
			return nil, err
		}
	}
	c.it = it
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		it.close()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the agent is shutting down"))
	}
	s.contexts[id] = c
	s.mu.Unlock()
	return c, nil
}

// startWarm starts lang's default interpreter for a template (see
// CreateContextRequest.warm), runs nothing in it but its own warm-up, and
// keeps it apart, replacing an earlier one.
func (s *contextService) startWarm(lang string) (*codeContext, error) {
	s.createMu.Lock()
	defer s.createMu.Unlock()
	c := &codeContext{id: "default-" + lang, lang: lang, created: time.Now(), isDefault: true, sem: make(chan struct{}, 1)}
	s.mu.Lock()
	_, exists := s.contexts[c.id]
	s.mu.Unlock()
	if exists {
		// Nothing would adopt it: the default context adopts a warm one
		// only when it is created.
		return nil, preconditionf("the default %s context exists already", lang)
	}
	it, err := s.start(c)
	if err != nil {
		return nil, err
	}
	// The first execute makes the kernel import what every run needs.
	if w, ok := it.(warmer); ok {
		ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
		err := w.warmUp(ctx)
		cancel()
		if err != nil {
			it.close()
			return nil, sysError("warm up the "+lang+" context", err)
		}
	}
	c.it = it
	s.mu.Lock()
	old := s.warm[lang]
	closed := s.closed
	if !closed {
		s.warm[lang] = c
	}
	s.mu.Unlock()
	if old != nil {
		old.it.close()
	}
	if closed {
		it.close()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the agent is shutting down"))
	}
	return c, nil
}

// warmTimeout bounds a warm context's warm-up and its reseed at adoption.
const warmTimeout = time.Minute

// warmer is an interpreter that can be started ahead of the sandbox that
// uses it: warmUp runs its first (empty) code, reseed gives its
// in-process random state fresh seeds from the guest kernel (after the
// clone's Sync reseeded that).
type warmer interface {
	warmUp(ctx context.Context) error
	reseed(ctx context.Context) error
}

// adoptWarm returns the warm interpreter of c's language if c is that
// language's default context asked for with no cwd and no env, reseeded,
// and nil otherwise; a warm interpreter that c cannot use is ended (it
// would only hold memory). The caller holds createMu.
func (s *contextService) adoptWarm(c *codeContext) interp {
	s.mu.Lock()
	w := s.warm[c.lang]
	delete(s.warm, c.lang)
	s.mu.Unlock()
	if w == nil {
		return nil
	}
	it := w.it
	if !c.isDefault || c.id != "default-"+c.lang || c.cwd != "" || len(c.env) > 0 || isClosed(it.dead()) {
		it.close()
		return nil
	}
	rs, ok := it.(warmer)
	if !ok {
		it.close()
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	if err := rs.reseed(ctx); err != nil {
		// Never hand out an interpreter whose random state others share.
		s.log.Warn("warm context: reseed failed; starting a new one", "lang", c.lang, "err", err)
		it.close()
		return nil
	}
	return it
}

// ctxSpawn is what starting an interpreter needs.
type ctxSpawn struct {
	s     *contextService
	dir   string // private run dir (0700)
	cwd   string
	env   []string
	id    identity
	extra []*os.File // the child's fds 3, 4, ...
}

// start starts c's interpreter in a fresh private directory.
func (s *contextService) start(c *codeContext) (interp, error) {
	id, err := s.users.resolve("root")
	if err != nil {
		return nil, err
	}
	cwd := c.cwd
	if cwd == "" {
		cwd = id.home
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			cwd = "/"
		}
	}
	if fi, err := os.Stat(cwd); err != nil {
		return nil, sysError("cwd", err)
	} else if !fi.IsDir() {
		return nil, preconditionf("cwd is not a directory")
	}
	if err := os.MkdirAll(s.progs.RunDir, 0o700); err != nil {
		return nil, sysError("create run dir", err)
	}
	dir, err := os.MkdirTemp(s.progs.RunDir, c.id+"-")
	if err != nil {
		return nil, sysError("create run dir", err)
	}
	sp := &ctxSpawn{s: s, dir: dir, cwd: cwd, env: buildEnv(id, c.env), id: id}
	var it interp
	switch c.lang {
	case "python":
		it, err = startPython(sp)
	case "javascript":
		it, err = startNode(sp)
	case "bash":
		it, err = startBash(sp)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return it, nil
}

// program resolves an interpreter: the configured path, or name in PATH.
func (sp *ctxSpawn) program(configured, name string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	p, err := lookPath(name, envValue(sp.env, "PATH"))
	if err != nil {
		return "", connect.NewError(connect.CodeFailedPrecondition, errors.New(name+" is not installed in the guest"))
	}
	return p, nil
}

// spawn starts argv like an exec (own session, own cgroup, the reaper
// owns wait4) with stdin, stdout and stderr as given plus sp.extra.
func (sp *ctxSpawn) spawn(path string, argv []string, stdin, stdout, stderr *os.File) (*process, error) {
	s := sp.s
	p := &process{reaper: s.reaper}
	if s.cg != nil {
		cg, err := s.cg.NewExec(s.pids)
		if err != nil {
			return nil, sysError("create context cgroup", err)
		}
		p.cg = cg
	}
	files := []uintptr{stdin.Fd(), stdout.Fd(), stderr.Fd()}
	for _, f := range sp.extra {
		files = append(files, f.Fd())
	}
	sys := &syscall.SysProcAttr{Setsid: true}
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: sp.id.uid, Gid: sp.id.gid, Groups: sp.id.groups}
	}
	if p.cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, p.cg.FD()
	}
	attr := &syscall.ProcAttr{Dir: sp.cwd, Env: sp.env, Files: files, Sys: sys}
	launch := direct
	if s.guest && p.cg != nil && os.Geteuid() == 0 {
		launch = enveloped(sys)
	}
	pid, done, err := s.reaper.Start(func() (int, error) {
		if s.guest {
			setOOMScoreAdj(s.log, "0")
			defer setOOMScoreAdj(s.log, "-1000")
		}
		p.start = time.Now()
		return launch(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	})
	if err != nil {
		if p.cg != nil {
			p.cg.Release()
		}
		return nil, sysError("start interpreter", err)
	}
	p.pid, p.done = pid, done
	return p, nil
}

// ending is an interpreter's end: dead is closed once its process
// exited, and how it ended is set before.
type ending struct {
	dead chan struct{}
	how  *agentv1.ContextExit
}

// get returns how the process ended; nil while it runs.
func (e *ending) get() *agentv1.ContextExit {
	if !isClosed(e.dead) {
		return nil
	}
	return e.how
}

// watch returns p's ending. An OOM kill is a SIGKILL while p's cgroup
// counts one (read before the cgroup is released, which waits for dead).
func watch(p *process) *ending {
	e := &ending{dead: make(chan struct{})}
	go func() {
		ws, ok := <-p.done
		if ok {
			how := &agentv1.ContextExit{ExitCode: int32(ws.ExitStatus())}
			if ws.Signaled() {
				how.ExitCode, how.Signal = -1, int32(ws.Signal())
				how.OomKilled = ws.Signal() == syscall.SIGKILL && p.cg != nil && p.cg.OOMKills() > 0
			}
			e.how = how
		}
		close(e.dead)
	}()
	return e
}

// stop kills p's process group and cgroup and waits (bounded) for it.
func stopProcess(p *process, dead <-chan struct{}) {
	p.kill()
	select {
	case <-dead:
	case <-time.After(5 * time.Second):
	}
	if p.cg != nil {
		p.cg.Release()
	}
}

func (s *contextService) get(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.contexts[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such context"))
	}
	return c, nil
}

func (s *contextService) List(context.Context, *connect.Request[agentv1.ListContextsRequest]) (*connect.Response[agentv1.ListContextsResponse], error) {
	s.mu.Lock()
	cs := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	sort.Slice(cs, func(i, j int) bool { return cs[i].created.Before(cs[j].created) })
	resp := &agentv1.ListContextsResponse{}
	for _, c := range cs {
		resp.Contexts = append(resp.Contexts, c.info())
	}
	return connect.NewResponse(resp), nil
}

func (s *contextService) Delete(_ context.Context, req *connect.Request[agentv1.DeleteContextRequest]) (*connect.Response[agentv1.DeleteContextResponse], error) {
	s.mu.Lock()
	c, ok := s.contexts[req.Msg.GetId()]
	delete(s.contexts, req.Msg.GetId())
	s.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such context"))
	}
	c.mu.Lock()
	it := c.it
	c.it, c.deleted = nil, true
	c.mu.Unlock()
	if it != nil {
		it.close() // ends a Run in progress
	}
	return connect.NewResponse(&agentv1.DeleteContextResponse{}), nil
}

func (s *contextService) Restart(ctx context.Context, req *connect.Request[agentv1.RestartContextRequest]) (*connect.Response[agentv1.ContextInfo], error) {
	c, err := s.get(req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	// Kill the old interpreter first: that ends a Run in progress.
	if old := c.current(); old != nil {
		old.close()
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	defer func() { <-c.sem }()
	if _, err := s.replace(c); err != nil {
		return nil, err
	}
	return connect.NewResponse(c.info()), nil
}

// replace starts a new interpreter for c and closes the old one. The
// caller holds c.sem.
func (s *contextService) replace(c *codeContext) (interp, error) {
	it, err := s.start(c)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.deleted {
		c.mu.Unlock()
		it.close()
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such context"))
	}
	old := c.it
	c.it = it
	c.mu.Unlock()
	if old != nil {
		old.close()
	}
	return it, nil
}

func (s *contextService) Interrupt(_ context.Context, req *connect.Request[agentv1.InterruptContextRequest]) (*connect.Response[agentv1.InterruptContextResponse], error) {
	c, err := s.get(req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	if it := c.current(); it != nil {
		it.interrupt()
	}
	return connect.NewResponse(&agentv1.InterruptContextResponse{}), nil
}

// Run executes code; see ContextService.Run in the proto.
func (s *contextService) Run(ctx context.Context, req *connect.Request[agentv1.RunCodeRequest], stream *connect.ServerStream[agentv1.RunCodeEvent]) error {
	m := req.Msg
	if len(m.GetCode()) > maxCode {
		return invalidf("code is longer than %d bytes", maxCode)
	}
	var c *codeContext
	if id := m.GetContextId(); id != "" {
		var err error
		if c, err = s.get(id); err != nil {
			return err
		}
	} else {
		lang, err := normalizeLang(m.GetLanguage())
		if err != nil {
			return err
		}
		id := "default-" + lang
		if c, err = s.get(id); err != nil {
			c, err = s.create(id, lang, "", nil, true)
			if connect.CodeOf(err) == connect.CodeAlreadyExists {
				c, err = s.get(id)
			}
			if err != nil {
				return err
			}
		}
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	defer func() { <-c.sem }()
	maxOut := m.GetMaxOutputBytes()
	if maxOut == 0 {
		maxOut = defaultCodeOutput
	}
	out := &codeOutput{stream: stream, left: maxOut}
	begin := time.Now()
	c.mu.Lock()
	it := c.it
	if it == nil {
		c.mu.Unlock()
		return connect.NewError(connect.CodeNotFound, errors.New("no such context"))
	}
	c.busy = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
	}()
	if isClosed(it.dead()) {
		// A dead context (killed, out of memory, exited) comes back with
		// its state lost, and the run says so before anything else.
		why := describeExit(it.exit())
		fresh, err := s.replace(c)
		if err != nil {
			msg := err.Error()
			if ce := (*connect.Error)(nil); errors.As(err, &ce) {
				msg = ce.Message()
			}
			return connect.NewError(connect.CodeOf(err), fmt.Errorf("the %s context had died (%s) and did not restart: %s", c.lang, why, msg))
		}
		it = fresh
		out.text(true, []byte("[airlock: the "+c.lang+" context had died ("+why+"); it was restarted and its state is lost]\n"))
	}

	// runCtx ends the run: the host went away, or the timeout fired and
	// the interrupt did not stop the code in time.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// Interrupts go only to this run: once it has ended (finished), the
	// repeats below must not reach the next run's code.
	var (
		timedOut bool
		finished bool
		stopMu   sync.Mutex
		repeats  []*time.Timer
	)
	interrupt := func() {
		stopMu.Lock()
		defer stopMu.Unlock()
		if !finished {
			it.interrupt()
		}
	}
	stop := func(timeout bool) {
		stopMu.Lock()
		defer stopMu.Unlock()
		if finished {
			return
		}
		if timeout {
			timedOut = true
		}
		it.interrupt()
		// An interrupt that raced the start of the code (an idle kernel
		// ignores SIGINT) is repeated before the interpreter is killed.
		repeats = append(repeats, time.AfterFunc(time.Second, interrupt), time.AfterFunc(2*time.Second, interrupt),
			time.AfterFunc(interruptGrace, cancel))
	}
	var timer *time.Timer
	if t := m.GetTimeoutMs(); t > 0 {
		timer = time.AfterFunc(time.Duration(t)*time.Millisecond, func() { stop(true) })
	}
	watchDone := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stop(false)
		case <-watchDone:
		}
	}()
	count, err := it.run(runCtx, m.GetCode(), out)
	close(watchDone)
	if timer != nil {
		timer.Stop()
	}
	stopMu.Lock()
	finished = true
	for _, r := range repeats {
		r.Stop()
	}
	to := timedOut
	stopMu.Unlock()
	if err != nil {
		// The code did not stop: the interpreter goes, the context is dead.
		it.close()
		if ctx.Err() != nil {
			return connect.NewError(connect.CodeCanceled, errors.New("run cancelled by the host"))
		}
		out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
			Name: "ContextDied", Value: "the interpreter did not stop after an interrupt and was killed; the next run restarts it, with its state lost",
		}}})
	} else if isClosed(it.dead()) {
		out.event(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
			Name: "ContextDied", Value: "the interpreter died (" + describeExit(it.exit()) + "); the next run restarts it, with its state lost",
		}}})
	}
	if ctx.Err() != nil {
		return connect.NewError(connect.CodeCanceled, errors.New("run cancelled by the host"))
	}
	return out.send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_End{End: &agentv1.CodeEnd{
		TimedOut:       to,
		Truncated:      out.wasTruncated(),
		DurationMs:     time.Since(begin).Milliseconds(),
		ExecutionCount: count,
		ContextId:      c.id,
	}}})
}

// close kills every context (Server.Close).
func (s *contextService) close() {
	s.mu.Lock()
	s.closed = true
	cs := s.contexts
	s.contexts = map[string]*codeContext{}
	for lang, c := range s.warm {
		cs["warm-"+lang] = c
	}
	s.warm = map[string]*codeContext{}
	s.mu.Unlock()
	for _, c := range cs {
		c.mu.Lock()
		it := c.it
		c.it, c.deleted = nil, true
		c.mu.Unlock()
		if it != nil {
			it.close()
		}
	}
}

// codeOutput sends a Run's events and applies its output cap. Safe for
// concurrent use.
type codeOutput struct {
	stream *connect.ServerStream[agentv1.RunCodeEvent]

	mu        sync.Mutex
	left      uint64
	truncated bool
	err       error
}

func (o *codeOutput) send(ev *agentv1.RunCodeEvent) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		o.err = o.stream.Send(ev)
	}
	return o.err
}

// take reserves n bytes of the cap; false means drop (and truncated).
func (o *codeOutput) take(n uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if n > o.left {
		o.left = 0
		o.truncated = true
		return false
	}
	o.left -= n
	return true
}

// text forwards stdout or stderr, cut at the cap, in chunks.
func (o *codeOutput) text(stderr bool, b []byte) {
	for len(b) > 0 {
		chunk := b[:min(len(b), outputChunk)]
		b = b[len(chunk):]
		o.mu.Lock()
		if uint64(len(chunk)) > o.left {
			chunk = chunk[:o.left]
			o.truncated = true
			b = nil
		}
		o.left -= uint64(len(chunk))
		o.mu.Unlock()
		if len(chunk) == 0 {
			return
		}
		ev := &agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Stdout{Stdout: chunk}}
		if stderr {
			ev.Event = &agentv1.RunCodeEvent_Stderr{Stderr: chunk}
		}
		_ = o.send(ev)
	}
}

// event forwards a result or error, whole or not at all.
func (o *codeOutput) event(ev *agentv1.RunCodeEvent) {
	var n uint64
	switch e := ev.GetEvent().(type) {
	case *agentv1.RunCodeEvent_Result:
		for k, v := range e.Result.GetData() {
			n += uint64(len(k) + len(v))
		}
	case *agentv1.RunCodeEvent_Error:
		n = uint64(len(e.Error.GetName()) + len(e.Error.GetValue()))
		for _, l := range e.Error.GetTraceback() {
			n += uint64(len(l))
		}
	}
	if !o.take(n) {
		return
	}
	_ = o.send(ev)
}

func (o *codeOutput) wasTruncated() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.truncated
}

// removeRunDir removes a context's private directory.
func removeRunDir(dir string) {
	if dir != "" && filepath.IsAbs(dir) {
		_ = os.RemoveAll(dir)
	}
}

// unblock ends the reads of pipes whose writers may linger in
// background processes; their readers close them.
func unblock(files ...*os.File) {
	now := time.Now()
	for _, f := range files {
		if f != nil {
			_ = f.SetReadDeadline(now)
		}
	}
}
