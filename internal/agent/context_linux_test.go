package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// codeRun is what one Run returned.
type codeRun struct {
	stdout, stderr strings.Builder
	results        []*agentv1.CodeResult
	errs           []*agentv1.CodeError
	end            *agentv1.CodeEnd
}

func (r *codeRun) main() string {
	for _, res := range r.results {
		if res.GetIsMainResult() {
			return string(res.GetData()["text/plain"])
		}
	}
	return ""
}

// needProgram fails (never skips) when an interpreter is missing.
func needProgram(t *testing.T, path, check string) {
	t.Helper()
	args := []string{}
	if check != "" {
		args = append(args, "-c", check)
	}
	if out, err := exec.Command(path, args...).CombinedOutput(); err != nil && check != "" {
		t.Fatalf("%s %s: %v\n%s\ninstall the code-context interpreters with scripts/deps.sh (python3-ipykernel python3-matplotlib nodejs)", path, check, err, out)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s: %v; install the code-context interpreters with scripts/deps.sh", path, err)
	}
}

func newContextEnv(t *testing.T) *testEnv {
	t.Helper()
	needProgram(t, "/usr/bin/python3", "import ipykernel, matplotlib, matplotlib_inline")
	needProgram(t, "/usr/bin/node", "")
	return newTestEnv(t, func(o *Options) {
		o.interpreters = interpreters{Python: "/usr/bin/python3", Node: "/usr/bin/node", Bash: "/bin/bash", RunDir: t.TempDir()}
	})
}

func (env *testEnv) run(t *testing.T, req *agentv1.RunCodeRequest) *codeRun {
	t.Helper()
	r, err := env.tryRun(t.Context(), req)
	if err != nil {
		t.Fatalf("run %q: %v", req.GetCode(), err)
	}
	return r
}

func (env *testEnv) tryRun(ctx context.Context, req *agentv1.RunCodeRequest) (*codeRun, error) {
	stream, err := env.c.Contexts.Run(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	r := &codeRun{}
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *agentv1.RunCodeEvent_Stdout:
			r.stdout.Write(ev.Stdout)
		case *agentv1.RunCodeEvent_Stderr:
			r.stderr.Write(ev.Stderr)
		case *agentv1.RunCodeEvent_Result:
			r.results = append(r.results, ev.Result)
		case *agentv1.RunCodeEvent_Error:
			r.errs = append(r.errs, ev.Error)
		case *agentv1.RunCodeEvent_End:
			r.end = ev.End
		}
	}
	if err := stream.Err(); err != nil {
		return r, err
	}
	if r.end == nil {
		return r, connect.NewError(connect.CodeInternal, os.ErrClosed)
	}
	return r, nil
}

func (env *testEnv) create(t *testing.T, lang, id string) string {
	t.Helper()
	info, err := env.c.Contexts.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{Language: lang, Id: id}))
	if err != nil {
		t.Fatalf("create %s: %v", lang, err)
	}
	return info.Msg.GetId()
}

func TestContextPython(t *testing.T) {
	t.Parallel()
	env := newContextEnv(t)
	py := func(code string) *codeRun {
		return env.run(t, &agentv1.RunCodeRequest{Code: code})
	}
	if r := py("x = 21"); r.end.GetContextId() != "default-python" || len(r.errs) != 0 {
		t.Fatalf("x = 21: end %v errs %v", r.end, r.errs)
	}
	if r := py("x * 2"); r.main() != "42" || r.end.GetExecutionCount() != 2 {
		t.Errorf("x * 2: main %q end %v", r.main(), r.end)
	}
	if r := py("print('hello')\nimport sys; print('oops', file=sys.stderr)"); r.stdout.String() != "hello\n" || r.stderr.String() != "oops\n" {
		t.Errorf("print: stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}
	r := py("1/0")
	if len(r.errs) != 1 || r.errs[0].GetName() != "ZeroDivisionError" || len(r.errs[0].GetTraceback()) == 0 {
		t.Fatalf("1/0: %v", r.errs)
	}
	for _, l := range r.errs[0].GetTraceback() {
		if strings.Contains(l, "\x1b[") {
			t.Errorf("traceback keeps ANSI escapes: %q", l)
		}
	}
	r = py("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
	var png []byte
	for _, res := range r.results {
		if b := res.GetData()["image/png"]; b != nil && !res.GetIsMainResult() {
			png = b
		}
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("matplotlib: no PNG display_data (errs %v, stderr %q)", r.errs, r.stderr.String())
	}
	r = py("from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))")
	if len(r.results) != 1 || string(r.results[0].GetData()["text/html"]) != "<b>hi</b>" {
		t.Errorf("display(HTML): %v", r.results)
	}
	// Timeout: interrupted, and the state survives.
	r = env.run(t, &agentv1.RunCodeRequest{Code: "while True: pass", TimeoutMs: 1000})
	if !r.end.GetTimedOut() || len(r.errs) != 1 || r.errs[0].GetName() != "KeyboardInterrupt" {
		t.Errorf("timeout: end %v errs %v", r.end, r.errs)
	}
	if r := py("x * 2"); r.main() != "42" {
		t.Errorf("after the timeout: x * 2 = %q (errs %v)", r.main(), r.errs)
	}
	// max_output_bytes.
	r = env.run(t, &agentv1.RunCodeRequest{Code: "print('a' * 1000)", MaxOutputBytes: 100})
	if !r.end.GetTruncated() || r.stdout.Len() != 100 {
		t.Errorf("truncation: %d bytes, end %v", r.stdout.Len(), r.end)
	}
}

func TestContextInterruptRestartDelete(t *testing.T) {
	t.Parallel()
	env := newContextEnv(t)
	id := env.create(t, "python", "")
	if !contextIDRe().MatchString(id) {
		t.Fatalf("generated id %q", id)
	}
	env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: "y = 5"})
	done := make(chan *codeRun, 1)
	looping := filepath.Join(t.TempDir(), "looping")
	go func() {
		code := fmt.Sprintf("import pathlib, time\npathlib.Path(%q).touch()\nwhile True: time.sleep(0.01)", looping)
		r, _ := env.tryRun(context.Background(), &agentv1.RunCodeRequest{ContextId: id, Code: code})
		done <- r
	}()
	waitState(t, env, id, "busy")
	// An idle kernel ignores SIGINT: interrupt once the code runs its loop.
	if !testutil.WaitFor(t, 30*time.Second, func() bool { _, err := os.Stat(looping); return err == nil }) {
		t.Fatal("the cell never started its loop")
	}
	if _, err := env.c.Contexts.Interrupt(t.Context(), connect.NewRequest(&agentv1.InterruptContextRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r == nil || len(r.errs) != 1 || r.errs[0].GetName() != "KeyboardInterrupt" || r.end.GetTimedOut() {
			t.Errorf("interrupted run: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("interrupt did not end the run")
	}
	if r := env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: "y"}); r.main() != "5" {
		t.Errorf("after interrupt: y = %q", r.main())
	}
	if _, err := env.c.Contexts.Restart(t.Context(), connect.NewRequest(&agentv1.RestartContextRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	if r := env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: "y"}); len(r.errs) != 1 || r.errs[0].GetName() != "NameError" {
		t.Errorf("after restart: errs %v", r.errs)
	}
	// An exited interpreter is dead, and says how, until the next run
	// restarts it.
	r := env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: "y = 6\nimport os; os._exit(3)"})
	if len(r.errs) != 1 || r.errs[0].GetName() != "ContextDied" || !strings.Contains(r.errs[0].GetValue(), "exit code 3") {
		t.Errorf("exit in a run: errs %v", r.errs)
	}
	if info := waitState(t, env, id, "dead"); info.GetExit().GetExitCode() != 3 || info.GetExit().GetSignal() != 0 {
		t.Errorf("dead context's exit: %v", info.GetExit())
	}
	r = env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: "y = 7\ny"})
	if want := "[airlock: the python context had died (exit code 3); it was restarted and its state is lost]\n"; r.stderr.String() != want || r.main() != "7" || len(r.errs) != 0 {
		t.Errorf("run after the exit: stderr %q (want %q), main %q, errs %v", r.stderr.String(), want, r.main(), r.errs)
	}
	if info := waitState(t, env, id, "idle"); info.GetExit() != nil {
		t.Errorf("a restarted context keeps its exit: %v", info.GetExit())
	}
	if _, err := env.c.Contexts.Delete(t.Context(), connect.NewRequest(&agentv1.DeleteContextRequest{Id: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := env.tryRun(t.Context(), &agentv1.RunCodeRequest{ContextId: id, Code: "1"}); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("run on a deleted context: %v", err)
	}
	if _, err := env.c.Contexts.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{Id: "Bad_ID"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("bad id: %v", err)
	}
}

func waitState(t *testing.T, env *testEnv, id, state string) *agentv1.ContextInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := env.c.Contexts.List(t.Context(), connect.NewRequest(&agentv1.ListContextsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range resp.Msg.GetContexts() {
			if c.GetId() == id && c.GetState() == state {
				return c
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("context %s never became %s", id, state)
	return nil
}

// TestContextPythonFigures: figures come back whatever backend the code
// picked (Agg shows nothing: they stayed open and every later plt.show()
// returned nothing too), each once, and a run that never imported
// matplotlib does not make the kernel import it.
func TestContextPythonFigures(t *testing.T) {
	t.Parallel()
	env := newContextEnv(t)
	id := env.create(t, "python", "figs")
	py := func(code string) *codeRun {
		t.Helper()
		return env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: code})
	}
	pngs := func(r *codeRun) int {
		n := 0
		for _, res := range r.results {
			if bytes.HasPrefix(res.GetData()["image/png"], []byte("\x89PNG\r\n\x1a\n")) && !res.GetIsMainResult() {
				n++
			}
		}
		return n
	}
	py("x = 1")
	py("1/0") // a failed run's reply does not say whether figures are open
	if r := py("import sys; 'matplotlib' in sys.modules"); r.main() != "False" {
		t.Fatalf("matplotlib imported by airlock: %q (errs %v)", r.main(), r.errs)
	}
	out := filepath.Join(t.TempDir(), "saved.png")
	r := py("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.savefig(" + fmt.Sprintf("%q", out) + ")")
	if n := pngs(r); n != 1 {
		t.Errorf("Agg + savefig: %d PNGs, want 1 (errs %v, stderr %q)", n, r.errs, r.stderr.String())
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("savefig: %v", err)
	}
	r = py("fig, ax = plt.subplots(); ax.plot([3, 2, 1]); fig2 = plt.figure(); plt.show()")
	if n := pngs(r); n != 2 {
		t.Errorf("Agg, two figures + show: %d PNGs, want 2 (errs %v, stderr %q)", n, r.errs, r.stderr.String())
	}
	r = py("plt.plot([1]); raise ValueError('after plotting')")
	if n := pngs(r); n != 1 || len(r.errs) != 1 || r.errs[0].GetName() != "ValueError" {
		t.Errorf("figure then error: %d PNGs, errs %v", n, r.errs)
	}
	r = py("len(plt.get_fignums())")
	if n := pngs(r); n != 0 || r.main() != "0" {
		t.Errorf("figures were not closed: main %q, %d PNGs", r.main(), n)
	}
	// The capture runs are silent: the execution counter counts the
	// user's runs only.
	if r.end.GetExecutionCount() != 7 {
		t.Errorf("execution count %d, want 7", r.end.GetExecutionCount())
	}
}

func TestContextJavaScript(t *testing.T) {
	t.Parallel()
	env := newContextEnv(t)
	js := func(code string, timeout uint32) *codeRun {
		return env.run(t, &agentv1.RunCodeRequest{Language: "javascript", Code: code, TimeoutMs: timeout})
	}
	if r := js("let a = [1, 2]; a.length", 0); r.main() != "2" {
		t.Errorf("a.length = %q (errs %v)", r.main(), r.errs)
	}
	if r := js("a.push(3); console.log('n', a.length); a", 0); r.main() != "[ 1, 2, 3 ]" || r.stdout.String() != "n 3\n" {
		t.Errorf("state: main %q stdout %q errs %v", r.main(), r.stdout.String(), r.errs)
	}
	if r := js("const v = await new Promise(r => setTimeout(() => r(7), 10)); v * 6", 0); r.main() != "42" {
		t.Errorf("await: %q (errs %v)", r.main(), r.errs)
	}
	if r := js("console.error('bad'); throw new TypeError('boom')", 0); len(r.errs) != 1 || r.errs[0].GetName() != "TypeError" || r.errs[0].GetValue() != "boom" || r.stderr.String() != "bad\n" {
		t.Errorf("throw: errs %v stderr %q", r.errs, r.stderr.String())
	}
	if r := js("while (true) {}", 1000); !r.end.GetTimedOut() {
		t.Errorf("timeout: %v", r.end)
	}
	if r := js("v", 0); r.main() != "7" {
		t.Errorf("after the timeout: v = %q (errs %v)", r.main(), r.errs)
	}
}

func TestContextBash(t *testing.T) {
	t.Parallel()
	env := newContextEnv(t)
	id := env.create(t, "bash", "sh1")
	sh := func(code string, timeout uint32) *codeRun {
		return env.run(t, &agentv1.RunCodeRequest{ContextId: id, Code: code, TimeoutMs: timeout})
	}
	dir := t.TempDir()
	sh("cd "+dir+"\nexport FOO=bar", 0)
	if r := sh("pwd; echo $FOO; echo err >&2", 0); r.stdout.String() != dir+"\nbar\n" || r.stderr.String() != "err\n" || len(r.errs) != 0 {
		t.Errorf("state: stdout %q stderr %q errs %v", r.stdout.String(), r.stderr.String(), r.errs)
	}
	if r := sh("printf 'no newline'; false", 0); r.stdout.String() != "no newline" || len(r.errs) != 1 || r.errs[0].GetName() != "ExitStatus" || r.errs[0].GetValue() != "1" {
		t.Errorf("status: stdout %q errs %v", r.stdout.String(), r.errs)
	}
	if r := sh("sleep 30", 500); !r.end.GetTimedOut() {
		t.Errorf("timeout: %v", r.end)
	}
	if r := sh("while :; do :; done", 500); !r.end.GetTimedOut() {
		t.Errorf("timeout of a builtin loop: %v", r.end)
	}
	if r := sh("echo $FOO", 0); r.stdout.String() != "bar\n" {
		t.Errorf("after the timeouts: %q", r.stdout.String())
	}
	// Calls to one context run one at a time, in order.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var order []string
	for i := range 3 {
		wg.Go(func() {
			r := sh("echo start; sleep 0.1; echo end", 0)
			mu.Lock()
			order = append(order, r.stdout.String())
			mu.Unlock()
		})
		_ = i
	}
	wg.Wait()
	for _, o := range order {
		if o != "start\nend\n" {
			t.Errorf("interleaved output: %q", o)
		}
	}
}

// kernelsIn lists the pids of kernels whose connection file is under dir.
func kernelsIn(dir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(b, []byte(dir+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestContextWarmPython: a warm Python context is started apart (not
// listed) and becomes the default context at the first Run that asks for
// it, the same kernel; a default context asked for with an environment
// ends the warm kernel and gets one of its own that sees it. Only python
// with no id, cwd or env can be warm.
func TestContextWarmPython(t *testing.T) {
	t.Parallel()
	needProgram(t, "/usr/bin/python3", "import ipykernel, matplotlib, matplotlib_inline")
	for _, env := range [][]string{nil, {"AIRLOCK_WARM_TEST=yes"}} {
		runDir := t.TempDir()
		te := newTestEnv(t, func(o *Options) {
			o.interpreters = interpreters{Python: "/usr/bin/python3", Bash: "/bin/bash", RunDir: runDir}
		})
		for _, bad := range []*agentv1.CreateContextRequest{
			{Language: "javascript", Warm: true}, {Language: "python", Id: "x", Warm: true},
			{Language: "python", Cwd: "/", Warm: true}, {Language: "python", Env: []string{"A=1"}, Warm: true},
		} {
			if _, err := te.c.Contexts.Create(t.Context(), connect.NewRequest(bad)); connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("warm %v: %v", bad, err)
			}
		}
		if _, err := te.c.Contexts.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{Language: "python", Warm: true})); err != nil {
			t.Fatal(err)
		}
		warm := kernelsIn(runDir)
		if len(warm) != 1 {
			t.Fatalf("kernels after the warm start: %v", warm)
		}
		if l, err := te.c.Contexts.List(t.Context(), connect.NewRequest(&agentv1.ListContextsRequest{})); err != nil || len(l.Msg.GetContexts()) != 0 {
			t.Fatalf("the warm context is listed: %v %v", l, err)
		}
		if env != nil {
			if _, err := te.c.Contexts.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{Language: "python", Id: "default-python", Env: env})); err != nil {
				t.Fatal(err)
			}
		}
		r := te.run(t, &agentv1.RunCodeRequest{Code: "import os; print(os.getpid(), os.environ.get('AIRLOCK_WARM_TEST'))"})
		if len(r.errs) != 0 || r.end.GetContextId() != "default-python" {
			t.Fatalf("run: %v %v", r.errs, r.end)
		}
		var pid int
		var seen string
		if _, err := fmt.Sscanf(r.stdout.String(), "%d %s", &pid, &seen); err != nil {
			t.Fatalf("run printed %q", r.stdout.String())
		}
		switch {
		case env == nil && (pid != warm[0] || seen != "None"):
			t.Errorf("the default context runs in kernel %d (%s), not the warm one %d", pid, seen, warm[0])
		case env != nil && (pid == warm[0] || seen != "yes"):
			t.Errorf("a default context with an environment runs in kernel %d seeing %q (the warm one was %d)", pid, seen, warm[0])
		}
		if env != nil && !testutil.WaitFor(t, 10*time.Second, func() bool { _, err := os.Stat(fmt.Sprintf("/proc/%d", warm[0])); return err != nil }) {
			t.Errorf("the unused warm kernel %d still runs", warm[0])
		}
		// Execution counts start at 1: the warm-up and reseed are not in
		// the history.
		if r := te.run(t, &agentv1.RunCodeRequest{Code: "1"}); r.end.GetExecutionCount() != 2 {
			t.Errorf("the second run's execution count is %d, want 2", r.end.GetExecutionCount())
		}
		// Once the default context exists nothing would adopt a warm
		// kernel: none is started.
		if _, err := te.c.Contexts.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{Language: "python", Warm: true})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("a warm start after the default context: %v", err)
		}
		if n := len(kernelsIn(runDir)); n != 1 {
			t.Errorf("%d kernels run after a refused warm start, want 1", n)
		}
	}
}
