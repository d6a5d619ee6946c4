package fake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

// The fake ContextService runs a tiny language instead of real
// interpreters. Code is split into lines (and python's `;`); each line is
// one statement, and in python and javascript the value of a last line
// that is an expression becomes the main result (text/plain). Variables
// are integers, kept per context until Delete or Restart.
//
// python:
//
//	x = 21            assign an integer (or an expression below)
//	x * 2   x + 1   x   7      expression: NAME|INT [(*|+|-) NAME|INT]
//	print(EXPR)   print("text")   stdout, with a newline
//	eprint("text")    stderr, with a newline
//	1/0               ZeroDivisionError: division by zero (with a traceback)
//	undefined name    NameError: name 'y' is not defined
//	sleep(N)          sleep N seconds (time.sleep(N) works too)
//	while True: pass  loop until interrupted or timed out
//	plot()            a display result with image/png (a 4x4 PNG) and text/plain
//	svg()             a display result with image/svg+xml
//	savefig("p.png")  write FakePNG to the file (relative to the cwd)
//	flood(N)          N bytes of "x" on stdout, in 64 KiB chunks
//	exit(N)  kill(N)  oom()   the interpreter dies: exit status N, signal N,
//	                  or killed by the OOM killer (SIGKILL); the run reports
//	                  ContextDied, the context is "dead" with its exit, and
//	                  the next run restarts it (state lost) with a stderr
//	                  line that says so first, as the real agent does
//	import ...        ignored
//
// javascript: `let|const|var x = 21`, expressions as above, console.log(EXPR
// or "text"), and the python forms of sleep/while/flood.
//
// bash: `x=21`, `echo TEXT` with $x expanded, `sleep N`; no results.
//
// An interrupt (or the run's timeout) ends the running code: an interrupt
// reports KeyboardInterrupt, a timeout end.timed_out; the context keeps its
// variables. Runs of one context are serialized. The default context of a
// language is "default-<language>", as in the real agent.
type codeContexts struct {
	agentv1connect.UnimplementedContextServiceHandler
	// starting, if set, is called before an interpreter starts (create,
	// restart, a run's restart of a dead context); it may block.
	starting func(lang string)
	// fs is the guest's filesystem (savefig); nil in tests of this file.
	fs *fs

	mu   sync.Mutex
	byID map[string]*codeContext
	n    int
}

type codeContext struct {
	info *agentv1.ContextInfo
	fs   *fs
	run  sync.Mutex // held by the running code

	mu        sync.Mutex // guards the fields below
	vars      map[string]int64
	count     int32
	interrupt context.CancelFunc   // of the running code, or nil
	exit      *agentv1.ContextExit // how the interpreter died; nil while alive
}

var fakeIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`) })

func fakeLang(l string) (string, error) {
	switch l {
	case "":
		return "python", nil
	case "python", "javascript", "bash":
		return l, nil
	}
	return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unknown language %q", l))
}

func noContext(id string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("no context %q", id))
}

func (cs *codeContexts) get(id string) (*codeContext, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c, ok := cs.byID[id]
	if !ok {
		return nil, noContext(id)
	}
	return c, nil
}

// createLocked makes a context; cs.mu must be held.
func (cs *codeContexts) createLocked(id, lang, cwd string, isDefault bool) (*codeContext, error) {
	if cs.byID == nil {
		cs.byID = map[string]*codeContext{}
	}
	if id == "" {
		cs.n++
		id = fmt.Sprintf("ctx-%d", cs.n)
	}
	if !fakeIDRe().MatchString(id) {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("bad context id"))
	}
	if _, ok := cs.byID[id]; ok {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("context %q exists", id))
	}
	if cwd == "" {
		cwd = "/root"
	}
	c := &codeContext{
		info: &agentv1.ContextInfo{Id: id, Language: lang, Cwd: cwd, CreatedUnixNano: time.Now().UnixNano(), State: "idle", IsDefault: isDefault},
		vars: map[string]int64{},
		fs:   cs.fs,
	}
	cs.byID[id] = c
	return c, nil
}

func (c *codeContext) snapshot() *agentv1.ContextInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	state := "idle"
	switch {
	case c.exit != nil:
		state = "dead"
	case c.interrupt != nil:
		state = "busy"
	}
	in := c.info
	return &agentv1.ContextInfo{Id: in.Id, Language: in.Language, Cwd: in.Cwd, CreatedUnixNano: in.CreatedUnixNano, State: state, IsDefault: in.IsDefault, Exit: c.exit}
}

func (cs *codeContexts) start(lang string) {
	if cs.starting != nil {
		cs.starting(lang)
	}
}

func (cs *codeContexts) Create(_ context.Context, req *connect.Request[agentv1.CreateContextRequest]) (*connect.Response[agentv1.ContextInfo], error) {
	lang, err := fakeLang(req.Msg.GetLanguage())
	if err != nil {
		return nil, err
	}
	cs.start(lang)
	cs.mu.Lock()
	c, err := cs.createLocked(req.Msg.GetId(), lang, req.Msg.GetCwd(), req.Msg.GetId() == "default-"+lang)
	cs.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(c.snapshot()), nil
}

func (cs *codeContexts) List(context.Context, *connect.Request[agentv1.ListContextsRequest]) (*connect.Response[agentv1.ListContextsResponse], error) {
	cs.mu.Lock()
	all := make([]*codeContext, 0, len(cs.byID))
	for _, c := range cs.byID {
		all = append(all, c)
	}
	cs.mu.Unlock()
	out := &agentv1.ListContextsResponse{}
	for _, c := range all {
		out.Contexts = append(out.Contexts, c.snapshot())
	}
	slices.SortFunc(out.Contexts, func(x, y *agentv1.ContextInfo) int { return strings.Compare(x.Id, y.Id) })
	return connect.NewResponse(out), nil
}

func (cs *codeContexts) Delete(_ context.Context, req *connect.Request[agentv1.DeleteContextRequest]) (*connect.Response[agentv1.DeleteContextResponse], error) {
	cs.mu.Lock()
	c, ok := cs.byID[req.Msg.GetId()]
	delete(cs.byID, req.Msg.GetId())
	cs.mu.Unlock()
	if !ok {
		return nil, noContext(req.Msg.GetId())
	}
	c.stop()
	return connect.NewResponse(&agentv1.DeleteContextResponse{}), nil
}

func (cs *codeContexts) Restart(_ context.Context, req *connect.Request[agentv1.RestartContextRequest]) (*connect.Response[agentv1.ContextInfo], error) {
	c, err := cs.get(req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	c.stop()
	c.run.Lock()
	cs.start(c.info.Language)
	c.reset()
	c.run.Unlock()
	return connect.NewResponse(c.snapshot()), nil
}

// reset gives c a fresh interpreter.
func (c *codeContext) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.vars, c.count, c.exit = map[string]int64{}, 0, nil
}

// stop interrupts the running code, if any.
func (c *codeContext) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.interrupt != nil {
		c.interrupt()
	}
}

func (cs *codeContexts) Interrupt(_ context.Context, req *connect.Request[agentv1.InterruptContextRequest]) (*connect.Response[agentv1.InterruptContextResponse], error) {
	c, err := cs.get(req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	c.stop()
	return connect.NewResponse(&agentv1.InterruptContextResponse{}), nil
}

// errInterrupted ends code on Interrupt.
var errInterrupted = errors.New("interrupted")

func (cs *codeContexts) Run(ctx context.Context, req *connect.Request[agentv1.RunCodeRequest], st *connect.ServerStream[agentv1.RunCodeEvent]) error {
	m := req.Msg
	var c *codeContext
	if id := m.GetContextId(); id != "" {
		var err error
		if c, err = cs.get(id); err != nil {
			return err
		}
	} else {
		lang, err := fakeLang(m.GetLanguage())
		if err != nil {
			return err
		}
		if c, err = cs.get("default-" + lang); err != nil {
			cs.start(lang)
			cs.mu.Lock()
			if c = cs.byID["default-"+lang]; c == nil {
				c, err = cs.createLocked("default-"+lang, lang, "", true)
			}
			cs.mu.Unlock()
			if err != nil {
				return err
			}
		}
	}
	c.run.Lock()
	defer c.run.Unlock()
	t0 := time.Now()
	c.mu.Lock()
	died := c.exit
	c.mu.Unlock()
	var notice []byte
	if died != nil {
		cs.start(c.info.Language)
		c.reset()
		notice = []byte("[airlock: the " + c.info.Language + " context had died (" + exitReason(died) + "); it was restarted and its state is lost]\n")
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var timedOut bool
	if t := m.GetTimeoutMs(); t > 0 {
		timer := time.AfterFunc(time.Duration(t)*time.Millisecond, func() { cancel(errTimedOut) })
		defer timer.Stop()
	}
	c.mu.Lock()
	c.interrupt = func() { cancel(errInterrupted) }
	if c.info.Language == "python" {
		c.count++
	}
	count := c.count
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.interrupt = nil
		c.mu.Unlock()
	}()

	limit := m.GetMaxOutputBytes()
	if limit == 0 {
		limit = 16 << 20
	}
	var sent uint64
	var truncated bool
	send := func(ev *agentv1.RunCodeEvent) error { return st.Send(ev) }
	out := func(stderr bool, b []byte) error {
		if sent >= limit {
			truncated = true
			return nil
		}
		if room := limit - sent; uint64(len(b)) > room {
			b, truncated = b[:room], true
		}
		sent += uint64(len(b))
		if stderr {
			return send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Stderr{Stderr: b}})
		}
		return send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Stdout{Stdout: b}})
	}
	result := func(data map[string][]byte, main bool) error {
		return send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{Data: data, IsMainResult: main}}})
	}
	if notice != nil {
		if err := out(true, notice); err != nil {
			return err
		}
	}
	err := interpret(runCtx, c, m.GetCode(), out, result)
	var ce *codeErr
	var de *deathErr
	switch {
	case errors.As(err, &de):
		c.mu.Lock()
		c.exit = de.exit
		c.mu.Unlock()
		if err := send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
			Name: "ContextDied", Value: "the interpreter died (" + exitReason(de.exit) + "); the next run restarts it, with its state lost",
		}}}); err != nil {
			return err
		}
	case errors.As(err, &ce):
		if err := send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{
			Name: ce.name, Value: ce.value, Traceback: []string{"Traceback (most recent call last):", "  Cell In[" + strconv.Itoa(int(count)) + "], line " + strconv.Itoa(ce.line), ce.name + ": " + ce.value},
		}}}); err != nil {
			return err
		}
	case errors.Is(err, errStopped):
		switch cause := context.Cause(runCtx); {
		case errors.Is(cause, errTimedOut):
			timedOut = true
		case errors.Is(cause, errInterrupted):
			if err := send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{Name: "KeyboardInterrupt"}}}); err != nil {
				return err
			}
		default:
			return ctx.Err() // the host went away
		}
	case err != nil:
		return err
	}
	if c.info.Language != "python" {
		count = 0
	}
	return send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_End{End: &agentv1.CodeEnd{
		TimedOut: timedOut, Truncated: truncated, DurationMs: time.Since(t0).Milliseconds(), ExecutionCount: count, ContextId: c.info.Id,
	}}})
}

// codeErr is an exception of the fake language.
type codeErr struct {
	name, value string
	line        int
}

func (e *codeErr) Error() string { return e.name + ": " + e.value }

// deathErr ends the interpreter (exit, kill, oom).
type deathErr struct{ exit *agentv1.ContextExit }

func (e *deathErr) Error() string { return "died: " + exitReason(e.exit) }

// exitReason words an exit as the real agent does.
func exitReason(e *agentv1.ContextExit) string {
	switch {
	case e.GetOomKilled():
		return "out of memory"
	case e.GetSignal() > 0:
		return "killed by signal " + strconv.Itoa(int(e.GetSignal()))
	}
	return "exit code " + strconv.Itoa(int(e.GetExitCode()))
}

// errStopped means the run's ctx ended (interrupt, timeout, host gone).
var errStopped = errors.New("stopped")

var (
	assignRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(?:(?:let|const|var)\s+)?([A-Za-z_]\w*)\s*=\s*(.+)$`)
	})
	callRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(print|eprint|console\.log|sleep|time\.sleep|flood|plot|svg|exit|kill|oom|savefig)\((.*)\)$`)
	})
	exprRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^([A-Za-z_]\w*|-?\d+)\s*(?:([*+\-/])\s*([A-Za-z_]\w*|-?\d+))?$`)
	})
)

// FakePNG is the image plot() returns (a valid 4x4 PNG).
var FakePNG = func() []byte {
	img := image.NewRGBA(image.Rect(0, 0, 4, 4))
	for i := range 4 {
		img.Set(i, i, color.RGBA{R: 255, A: 255})
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img)
	return b.Bytes()
}()

// interpret runs code in c; see codeContexts for the language.
func interpret(ctx context.Context, c *codeContext, code string, out func(bool, []byte) error, result func(map[string][]byte, bool) error) error {
	lang := c.info.Language
	var lines []string
	for l := range strings.SplitSeq(code, "\n") {
		if lang == "python" {
			lines = append(lines, strings.Split(l, ";")...)
		} else {
			lines = append(lines, strings.TrimSuffix(strings.TrimSpace(l), ";"))
		}
	}
	last := len(lines) - 1
	for last >= 0 && strings.TrimSpace(lines[last]) == "" {
		last--
	}
	for i, raw := range lines[:last+1] {
		line := strings.TrimSpace(raw)
		if ctx.Err() != nil {
			return errStopped
		}
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "import ") || strings.HasPrefix(line, "from ") {
			continue
		}
		if lang == "bash" {
			if err := bashLine(ctx, c, line, out); err != nil {
				return err
			}
			continue
		}
		if strings.HasPrefix(line, "while True") || strings.HasPrefix(line, "while (true)") {
			<-ctx.Done()
			return errStopped
		}
		if m := callRe().FindStringSubmatch(line); m != nil {
			if err := call(ctx, c, m[1], strings.TrimSpace(m[2]), i+1, out, result); err != nil {
				return err
			}
			continue
		}
		if m := assignRe().FindStringSubmatch(line); m != nil && !strings.Contains(m[2], "=") {
			v, err := eval(c, m[2], i+1)
			if err != nil {
				return err
			}
			c.mu.Lock()
			c.vars[m[1]] = v
			c.mu.Unlock()
			continue
		}
		v, err := eval(c, line, i+1)
		if err != nil {
			return err
		}
		if i == last {
			return result(map[string][]byte{"text/plain": []byte(strconv.FormatInt(v, 10))}, true)
		}
	}
	return nil
}

func call(ctx context.Context, c *codeContext, fn, arg string, line int, out func(bool, []byte) error, result func(map[string][]byte, bool) error) error {
	switch fn {
	case "print", "console.log", "eprint":
		text := strings.Trim(arg, `"'`)
		if !strings.HasPrefix(arg, `"`) && !strings.HasPrefix(arg, `'`) {
			v, err := eval(c, arg, line)
			if err != nil {
				return err
			}
			text = strconv.FormatInt(v, 10)
		}
		return out(fn == "eprint", []byte(text+"\n"))
	case "sleep", "time.sleep":
		secs, _ := strconv.ParseFloat(arg, 64)
		t := time.NewTimer(time.Duration(secs * float64(time.Second)))
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return errStopped
		}
	case "flood":
		n, _ := strconv.Atoi(arg)
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for n > 0 {
			if ctx.Err() != nil {
				return errStopped
			}
			k := min(n, len(chunk))
			if err := out(false, chunk[:k]); err != nil {
				return err
			}
			n -= k
		}
		return nil
	case "savefig":
		if c.fs == nil {
			return &codeErr{"OSError", "no filesystem", line}
		}
		p := strings.Trim(arg, `"'`)
		if !path.IsAbs(p) {
			p = path.Join(c.info.Cwd, p)
		}
		c.fs.mu.Lock()
		defer c.fs.mu.Unlock()
		if d := c.fs.files[path.Dir(p)]; d == nil || !d.dir {
			return &codeErr{"FileNotFoundError", "no such directory", line}
		}
		c.fs.files[p] = &file{data: bytes.Clone(FakePNG), mode: 0o644, mtime: time.Now()}
		return nil
	case "exit":
		n, _ := strconv.Atoi(arg)
		return &deathErr{&agentv1.ContextExit{ExitCode: int32(n)}}
	case "kill":
		n, _ := strconv.Atoi(arg)
		return &deathErr{&agentv1.ContextExit{ExitCode: -1, Signal: int32(n)}}
	case "oom":
		return &deathErr{&agentv1.ContextExit{ExitCode: -1, Signal: 9, OomKilled: true}}
	case "plot":
		return result(map[string][]byte{"image/png": FakePNG, "text/plain": []byte("<Figure size 640x480 with 1 Axes>")}, false)
	case "svg":
		return result(map[string][]byte{"image/svg+xml": []byte(`<svg xmlns="http://www.w3.org/2000/svg"/>`), "text/plain": []byte("<SVG>")}, false)
	}
	return nil
}

// eval evaluates NAME|INT [(*|+|-|/) NAME|INT].
func eval(c *codeContext, s string, line int) (int64, error) {
	m := exprRe().FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, &codeErr{"SyntaxError", "invalid syntax", line}
	}
	x, err := operand(c, m[1], line)
	if err != nil || m[2] == "" {
		return x, err
	}
	y, err := operand(c, m[3], line)
	if err != nil {
		return 0, err
	}
	switch m[2] {
	case "*":
		return x * y, nil
	case "+":
		return x + y, nil
	case "-":
		return x - y, nil
	default:
		if y == 0 {
			return 0, &codeErr{"ZeroDivisionError", "division by zero", line}
		}
		return x / y, nil
	}
}

func operand(c *codeContext, s string, line int) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	c.mu.Lock()
	v, ok := c.vars[s]
	c.mu.Unlock()
	if !ok {
		if c.info.Language == "javascript" {
			return 0, &codeErr{"ReferenceError", s + " is not defined", line}
		}
		return 0, &codeErr{"NameError", "name '" + s + "' is not defined", line}
	}
	return v, nil
}

var bashAssignRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([A-Za-z_]\w*)=(-?\d+)$`) })

func bashLine(ctx context.Context, c *codeContext, line string, out func(bool, []byte) error) error {
	if m := bashAssignRe().FindStringSubmatch(line); m != nil {
		v, _ := strconv.ParseInt(m[2], 10, 64)
		c.mu.Lock()
		c.vars[m[1]] = v
		c.mu.Unlock()
		return nil
	}
	f := strings.Fields(line)
	switch f[0] {
	case "echo":
		words := f[1:]
		c.mu.Lock()
		for i, w := range words {
			if strings.HasPrefix(w, "$") {
				words[i] = strconv.FormatInt(c.vars[w[1:]], 10)
			}
		}
		c.mu.Unlock()
		return out(false, []byte(strings.Join(words, " ")+"\n"))
	case "sleep":
		secs := 0.0
		if len(f) > 1 {
			secs, _ = strconv.ParseFloat(f[1], 64)
		}
		return call(ctx, c, "sleep", strconv.FormatFloat(secs, 'f', -1, 64), 0, out, nil)
	}
	return out(true, []byte("fake bash: "+f[0]+": command not found\n"))
}
