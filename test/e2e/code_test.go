package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestCodeContexts is the acceptance test of code contexts through the
// CLI: state kept between calls, a matplotlib PNG, an exception with a
// traceback, a timeout that leaves the state alone, and javascript and bash
// contexts that keep state too. Needs the base image's python (with
// ipykernel and matplotlib) and node.
func TestCodeContexts(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--memory", "1024M")

	e.must(t, "code", id, "x = 21")
	if out := strings.TrimSpace(e.must(t, "code", id, "x * 2")); out != "42" {
		t.Fatalf("x * 2 = %q, want 42", out)
	}

	dir := t.TempDir()
	plot := "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
	r := e.run(t, nil, "code", "--out", dir, id, plot)
	if r.code != 0 {
		t.Fatalf("plot: exit %d\n%s", r.code, r.stderr)
	}
	pngs, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	if len(pngs) == 0 {
		t.Fatalf("plot saved no PNG; stderr: %s", r.stderr)
	}
	b, err := os.ReadFile(pngs[0])
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("%s is not a PNG (%d bytes, %v)", pngs[0], len(b), err)
	}

	r = e.run(t, nil, "code", id, "1/0")
	if r.code != 1 || !strings.Contains(r.stderr, "ZeroDivisionError") || !strings.Contains(r.stderr, "Traceback") {
		t.Fatalf("1/0: exit %d\nstderr: %s", r.code, r.stderr)
	}

	r = e.run(t, nil, "code", "--timeout", "2s", id, "while True: pass")
	if r.code != 124 {
		t.Fatalf("timeout: exit %d\nstderr: %s", r.code, r.stderr)
	}
	if out := strings.TrimSpace(e.must(t, "code", id, "x")); out != "21" {
		t.Fatalf("x after the timeout = %q, want 21", out)
	}

	e.must(t, "code", "--lang", "javascript", id, "let y = 5")
	if out := strings.TrimSpace(e.must(t, "code", "--lang", "javascript", id, "y * 3")); out != "15" {
		t.Fatalf("javascript y * 3 = %q, want 15", out)
	}
	e.must(t, "code", "--lang", "bash", id, "cd /tmp && export Z=7")
	if out := strings.TrimSpace(e.must(t, "code", "--lang", "bash", id, `echo "$Z $(pwd)"`)); out != "7 /tmp" {
		t.Fatalf("bash state = %q, want \"7 /tmp\"", out)
	}

	// A new kernel starts without debugpy (kept out of its start), and
	// code may still import it.
	cid := strings.TrimSpace(e.must(t, "contexts", "create", "--lang", "python", id))
	if out := strings.TrimSpace(e.must(t, "code", "--context", cid, id, "import sys\nprint('debugpy' in sys.modules)\nimport debugpy\nprint(debugpy.__name__)")); out != "False\ndebugpy" {
		t.Fatalf("debugpy in a new kernel: %q, want False then debugpy", out)
	}
	e.must(t, "code", "--context", cid, id, "x = 1")
	if out := strings.TrimSpace(e.must(t, "code", id, "x")); out != "21" {
		t.Fatalf("default context changed by another context: %q", out)
	}
	if !strings.Contains(e.must(t, "contexts", "ls", id), cid) {
		t.Fatal("contexts ls misses the new context")
	}
	e.must(t, "contexts", "rm", id, cid)

	// --context NAME creates the context on first use (README example),
	// in --lang, and says so on stderr; the next call finds its state.
	r = e.run(t, nil, "code", "--context", "scratch-1", "--lang", "bash", id, "export W=9")
	if r.code != 0 || !strings.Contains(r.stderr, "created context scratch-1 (bash)") {
		t.Fatalf("first use of --context scratch-1: exit %d stderr %q", r.code, r.stderr)
	}
	r = e.run(t, nil, "code", "--context", "scratch-1", id, "echo $W")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "9" || strings.Contains(r.stderr, "created") {
		t.Fatalf("second use of --context scratch-1: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestCodeFirstRunFiguresAndDeath is what a new user hits (#21 items 2,
// 3, 5), on one sandbox: the first python run says on stderr that the
// context is starting (--progress; stdout stays the code's); matplotlib
// figures come back with the Agg backend (savefig, then show in a later
// run), and --return-files brings back the file savefig wrote; a kernel
// killed by a signal is reported by contexts ls, and the next run restarts
// it and says so first.
func TestCodeFirstRunFiguresAndDeath(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--memory", "1024M")

	t0 := time.Now()
	r := e.run(t, nil, "code", "--progress", id, "x = 20\nprint(x + 1)")
	took := time.Since(t0)
	if r.code != 0 || r.stdout != "21\n" {
		t.Fatalf("first run: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	// Status lines come after a second of waiting for the context to
	// start: a first run that took two seconds longer than a run that
	// starts nothing must have said so. (The second run is the baseline of
	// the CLI's and the exec's own time, which a busy host stretches too;
	// on qemu the template's kernel is adopted at once.)
	t1 := time.Now()
	if out := e.must(t, "code", id, "x"); strings.TrimSpace(out) != "20" {
		t.Fatalf("second run: %q", out)
	}
	warm := time.Since(t1)
	if took-warm > 2*time.Second && !strings.Contains(r.stderr, "airlock: starting python context\n") {
		t.Fatalf("first run took %s (a second one %s) and said nothing on stderr: %q", took, warm, r.stderr)
	}
	t.Logf("first run: %s (a second one %s), stderr %q", took, warm, r.stderr)

	dir := t.TempDir()
	count := func() int {
		pngs, _ := filepath.Glob(filepath.Join(dir, "*.png"))
		for _, p := range pngs {
			if b, err := os.ReadFile(p); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
				t.Fatalf("%s is not a PNG (%v)", p, err)
			}
		}
		return len(pngs)
	}
	agg := "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.savefig('plot.png')"
	r = e.run(t, nil, "code", "--out", dir, "--return-files", "*.png", id, agg)
	if r.code != 0 || count() != 2 || !strings.Contains(r.stderr, "[image/png plot.png saved to ") {
		t.Fatalf("Agg + savefig + --return-files: exit %d, %d PNGs\nstderr: %s", r.code, count(), r.stderr)
	}
	r = e.run(t, nil, "code", "--out", dir, id, "plt.plot([3, 2, 1])\nplt.show()")
	if r.code != 0 || count() != 3 {
		t.Fatalf("a later plt.show() under Agg: exit %d, %d PNGs\nstderr: %s", r.code, count(), r.stderr)
	}

	r = e.run(t, nil, "code", id, "import os; os.kill(os.getpid(), 9)")
	if r.code != 1 || !strings.Contains(r.stderr, "ContextDied") || !strings.Contains(r.stderr, "killed by signal 9") {
		t.Fatalf("kill: exit %d stderr %q", r.code, r.stderr)
	}
	var cxs []struct {
		ID, State string
		Exit      *struct{ Reason string }
	}
	if err := json.Unmarshal([]byte(e.must(t, "contexts", "ls", "--json", id)), &cxs); err != nil {
		t.Fatal(err)
	}
	dead := false
	for _, c := range cxs {
		dead = dead || (c.ID == "default-python" && c.State == "dead" && c.Exit != nil && c.Exit.Reason == "killed by signal 9")
	}
	if !dead {
		t.Fatalf("contexts ls --json: %+v", cxs)
	}
	if ls := e.must(t, "contexts", "ls", id); !strings.Contains(ls, "dead (killed by signal 9; the next run restarts it)") {
		t.Fatalf("contexts ls: %s", ls)
	}
	// The restart (tens of seconds under TCG) does not count against the
	// run's timeout; the state is gone.
	r = e.run(t, nil, "code", "--timeout", "10s", id, "print('back')\nprint('x' in globals())")
	want := "[airlock: the python context had died (killed by signal 9); it was restarted and its state is lost]\n"
	if r.code != 0 || r.stdout != "back\nFalse\n" || !strings.HasPrefix(r.stderr, want) {
		t.Fatalf("run after the kill: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}

// kernelStat is Python code that prints its own process's /proc stat line.
const kernelStat = `import os; print(open("/proc/%d/stat" % os.getpid()).read())`

// startTick is a /proc/PID/stat line's start time, in clock ticks since
// the guest booted (a template's clones count on from the template's).
func startTick(t *testing.T, stat string) int64 {
	t.Helper()
	_, rest, ok := strings.Cut(stat, ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 20 {
		t.Fatalf("not a /proc/PID/stat line: %q", stat)
	}
	n, err := strconv.ParseInt(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCodeWarmPythonFromTemplate: a sandbox cloned from a template finds
// its default Python kernel running already (started while the template
// was built: before the sandbox's first exec), with random state of its
// own (two sandboxes draw different numbers from the kernel both got from
// the template); a sandbox with an environment (here a secret's
// placeholder) gets a kernel started for it, which sees that environment.
func TestCodeWarmPythonFromTemplate(t *testing.T) {
	e := setup(t)
	a, b := e.create(t), e.create(t)
	firstExec := startTick(t, e.must(t, "exec", a, "--", "cat", "/proc/self/stat"))
	if kernel := startTick(t, e.must(t, "code", a, kernelStat)); kernel >= firstExec {
		t.Fatalf("the kernel started at tick %d, after the sandbox's first exec (%d): not the template's", kernel, firstExec)
	}
	const draw = "import random; print(random.getrandbits(64))"
	if ra, rb := e.must(t, "code", a, draw), e.must(t, "code", b, draw); ra == rb {
		t.Fatalf("two sandboxes drew the same number from their kernels: %q", ra)
	}

	r := e.runWith(t, []string{"AIRLOCK_E2E_WARM=value"}, nil, "create", "--secret", "AIRLOCK_E2E_WARM@example.com")
	if r.code != 0 {
		t.Fatalf("create with a secret: %d %s", r.code, r.stderr)
	}
	c := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", c) })
	firstExec = startTick(t, e.must(t, "exec", c, "--", "cat", "/proc/self/stat"))
	if kernel := startTick(t, e.must(t, "code", c, kernelStat)); kernel <= firstExec {
		t.Errorf("a sandbox with an environment got the template's kernel (started at tick %d, first exec %d)", kernel, firstExec)
	}
	if got := strings.TrimSpace(e.must(t, "code", c, `import os; print(os.environ.get("AIRLOCK_E2E_WARM", "unset") != "unset")`)); got != "True" {
		t.Errorf("the kernel does not see the sandbox's environment: %q", got)
	}
}

// TestCodeWarmPythonFromWarmPool: sandboxes that creates take from a warm
// pool (airlock serve --warm-pool) find their default Python kernel
// running already, with random state of their own. On qemu the pool's
// clones carry the template's kernel; on gVisor, whose templates are
// images, the pool starts one in each of its sandboxes.
func TestCodeWarmPythonFromWarmPool(t *testing.T) {
	e := setup(t)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-warmcode"))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", key[4:14]) })
	// warm lists the pools' sandboxes (no caller but the local admin sees
	// them). They outlive serve, and a later serve with the same pool
	// would take them: they are removed before and after.
	warm := func() (ids []string) {
		var sbs []struct {
			ID, Tenant, State string
		}
		if err := json.Unmarshal([]byte(e.must(t, "ls", "--json")), &sbs); err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if sb.Tenant == "@warm" && sb.State == "running" {
				ids = append(ids, sb.ID)
			}
		}
		return ids
	}
	drop := func() {
		if ids := warm(); len(ids) > 0 {
			e.must(t, append([]string{"rm"}, ids...)...)
		}
	}
	drop()
	t.Cleanup(drop) // after serve stops (cleanups run last first)
	s := startServe(t, e, "--warm-pool", "image=base,size=2")
	if !testutil.WaitFor(t, 5*time.Minute, func() bool { return len(warm()) == 2 }) {
		t.Fatalf("the pool has %d sandboxes, want 2", len(warm()))
	}
	var ids []string
	for range 2 {
		code, b := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
		var sb struct{ ID, Source string }
		if code != http.StatusCreated || json.Unmarshal(b, &sb) != nil {
			t.Fatalf("create: %d %s", code, b)
		}
		t.Cleanup(func() { s.do(key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })
		if !strings.HasPrefix(sb.Source, "warm:") {
			t.Fatalf("create did not take a warm sandbox: source %q", sb.Source)
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		firstExec := startTick(t, e.must(t, "exec", id, "--", "cat", "/proc/self/stat"))
		kernel := startTick(t, e.must(t, "code", id, kernelStat))
		if kernel >= firstExec {
			t.Fatalf("%s's kernel started at tick %d, after its first exec (%d): not the pool's", id, kernel, firstExec)
		}
		t.Logf("%s: its kernel started at tick %d, its first exec at %d", id, kernel, firstExec)
	}
	const draw = "import random; print(random.getrandbits(64))"
	if ra, rb := e.must(t, "code", ids[0], draw), e.must(t, "code", ids[1], draw); ra == rb {
		t.Fatalf("two sandboxes drew the same number from their kernels: %q", ra)
	}
}
