package hostcg

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestFor(t *testing.T) {
	l := For(512)
	if l.MemoryBytes != (2*512+256)<<20 || l.Pids != 768 {
		t.Fatalf("For(512) = %+v", l)
	}
	r := l.resources()
	if *r.Memory.Limit != l.MemoryBytes || *r.Pids.Limit != 768 || r.CPU != nil {
		t.Fatalf("resources = %+v %+v %+v", r.CPU, *r.Memory, *r.Pids)
	}
}

func TestValidName(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", "a\x00", "x\ny", strings.Repeat("a", 129)} {
		if _, err := Enter("/airlock", bad, For(64)); err == nil {
			t.Errorf("Enter(%q) accepted", bad)
		}
		if err := Remove("/airlock", bad); err == nil {
			t.Errorf("Remove(%q) accepted", bad)
		}
	}
	if _, err := Enter("airlock", "x", For(64)); err == nil {
		t.Error("relative parent accepted")
	}
}

// helperEnv tells the test binary, started again, to be the helper.
const helperEnv = "HOSTCG_TEST_HELPER"

// TestMain runs the helper instead of the tests when the test binary is
// started as one (runHelper).
func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		helper(mode)
	}
	os.Exit(m.Run())
}

// helper is the process that enters an envelope (the calling process
// moves, so it must not be the test binary running the tests). It prints
// one JSON line per result and exits.
func helper(mode string) {
	var lim Limits
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv+"_LIMITS")), &lim); err != nil {
		fail(err)
	}
	e, err := Enter(os.Getenv(helperEnv+"_PARENT"), "sbx", lim)
	if err != nil {
		fail(err)
	}
	emit("entered", e.Path())
	switch mode {
	case "pids":
		var started []*exec.Cmd
		for range 60 {
			c := exec.Command("sleep", "30")
			if c.Start() != nil {
				continue
			}
			started = append(started, c)
		}
		emit("started", len(started))
		for _, c := range started {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	case "memory":
		// Touch 4x the limit; the kernel must kill this process first.
		var keep [][]byte
		for range 4 * lim.MemoryBytes >> 20 {
			b := make([]byte, 1<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		emit("survived", len(keep))
	case "cpu":
		// Spin until this process has used 1 s of CPU by its own
		// account (not for 1 s of wall time: on a loaded host that
		// can be much less CPU), or a minute has passed.
		var stop atomic.Bool
		done := make(chan struct{})
		for range runtime.NumCPU() {
			go func() {
				for !stop.Load() {
				}
				done <- struct{}{}
			}()
		}
		for deadline := time.Now().Add(time.Minute); selfCPU() < time.Second && time.Now().Before(deadline); {
		}
		stop.Store(true)
		for range runtime.NumCPU() {
			<-done
		}
		emit("self_cpu_nanos", uint64(selfCPU()))
		s, err := e.Stats()
		if err != nil {
			fail(err)
		}
		emit("cpu_nanos", s.CPUNanos)
		cg, err := Of("self")
		if err != nil {
			fail(err)
		}
		emit("cgroups", cg)
	}
	if err := e.Leave(); err != nil {
		fail(err)
	}
	emit("left", true)
	os.Exit(0)
}

func emit(k string, v any) {
	b, _ := json.Marshal(map[string]any{k: v})
	fmt.Println(string(b))
}

func fail(err error) {
	emit("error", err.Error())
	os.Exit(3)
}

// runHelper runs the helper in mode with lim under a fresh parent cgroup
// and returns its results and its wait error.
func runHelper(t *testing.T, mode string, lim Limits) (map[string]json.RawMessage, string, error) {
	t.Helper()
	var r [6]byte
	_, _ = rand.Read(r[:])
	parent := "/airlock-test-" + hex.EncodeToString(r[:])
	t.Cleanup(func() {
		if err := Remove(parent, "sbx"); err != nil {
			t.Errorf("remove: %v", err)
		}
		_ = removeTree(parent)
	})
	b, _ := json.Marshal(lim)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperEnv+"_LIMITS="+string(b), helperEnv+"_PARENT="+parent)
	out, err := cmd.Output()
	res := map[string]json.RawMessage{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var m map[string]json.RawMessage
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			for k, v := range m {
				res[k] = v
			}
		}
	}
	if e, ok := res["error"]; ok {
		t.Fatalf("helper: %s", e)
	}
	if _, ok := res["entered"]; !ok {
		t.Fatalf("the helper never entered its envelope (%v): %s", err, out)
	}
	return res, parent, err
}

func requireCgroups(t *testing.T) {
	testutil.RequireRoot(t)
	if err := Check(); err != nil {
		t.Fatalf("the root tier needs writable memory and pids cgroups: %v", err)
	}
}

func TestEnvelopePidsLimit(t *testing.T) {
	requireCgroups(t)
	lim := For(64)
	lim.Pids = 24 // the helper's own threads count too
	res, parent, err := runHelper(t, "pids", lim)
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var n int
	_ = json.Unmarshal(res["started"], &n)
	if n == 0 || n >= 24 {
		t.Fatalf("started %d sleeps under pids.max 24 (want 1..23)", n)
	}
	if _, ok := res["left"]; !ok {
		t.Fatal("the helper did not leave")
	}
	assertGone(t, path.Join(parent, "sbx"))
}

func TestEnvelopeMemoryLimit(t *testing.T) {
	requireCgroups(t)
	lim := For(64)
	lim.MemoryBytes = 64 << 20
	res, parent, err := runHelper(t, "memory", lim)
	if _, ok := res["survived"]; ok {
		t.Fatalf("touched 256 MiB under a 64 MiB envelope and lived: %s", res["survived"])
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("helper: %v", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want SIGKILL (the OOM killer)", ws)
	}
	e, err := Open(parent, "sbx")
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.Stats()
	if err != nil {
		t.Fatal(err)
	}
	// The peak may pass the limit by a charge batch (seen: one page).
	if st.OOMKills == 0 || st.MemoryPeakBytes > 65<<20 {
		t.Fatalf("stats after the OOM kill: %+v", st)
	}
	// OOMKills counts the same kill from the cgroup path (what a runtime
	// that knows only its cgroup reads: gVisor's).
	if n, err := OOMKills(path.Join(parent, "sbx")); err != nil || n != st.OOMKills {
		t.Fatalf("OOMKills = %d, %v; Stats says %d", n, err, st.OOMKills)
	}
	if _, err := OOMKills("airlock/../etc"); err == nil {
		t.Fatal("OOMKills took a relative path")
	}
	// The dead helper left its envelope behind, empty: Remove cleans it.
	if err := Remove(parent, "sbx"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, path.Join(parent, "sbx"))
}

// TestEnvelopeCPU: the process stays out of any CPU group of airlock's
// (see the package doc), and its CPU time is counted where cpuacct is its
// own hierarchy.
func TestEnvelopeCPU(t *testing.T) {
	requireCgroups(t)
	res, parent, err := runHelper(t, "cpu", For(64))
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var cg map[string]string
	_ = json.Unmarshal(res["cgroups"], &cg)
	cpuKey := "cpu"
	if Version() == "v2" {
		cpuKey = ""
	}
	if Version() == "v1" && strings.HasPrefix(cg["cpu"], parent) {
		t.Errorf("cpu cgroup %q: the envelope must not group CPU", cg["cpu"])
	}
	if want := parent + "/sbx/shim"; cg["memory"] != want && cg[cpuKey] != want {
		t.Errorf("cgroups %v, want memory and pids in %s", cg, want)
	}
	var ns uint64
	_ = json.Unmarshal(res["cpu_nanos"], &ns)
	if cpuacctApart() || Version() == "v2" {
		// The helper spun until it had used 1 s of CPU by its own
		// account (getrusage); the envelope must have counted it.
		var self uint64
		_ = json.Unmarshal(res["self_cpu_nanos"], &self)
		if self < uint64(time.Second) {
			t.Fatalf("the helper used only %v of CPU in a minute of spinning", time.Duration(self))
		}
		if ns < self*8/10 {
			t.Fatalf("the envelope counted %v of CPU; the helper used %v by its own account", time.Duration(ns), time.Duration(self))
		}
	}
	t.Logf("%d goroutines spinning: %v of CPU counted; cgroups %v", runtime.NumCPU(), time.Duration(ns), cg)
}

func assertGone(t *testing.T, p string) {
	t.Helper()
	roots := []string{"/sys/fs/cgroup"}
	if Version() == "v1" {
		roots = []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"}
	}
	for _, r := range roots {
		if _, err := os.Stat(path.Join(r, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists (%v)", path.Join(r, p), err)
		}
	}
}

// selfCPU is the CPU time (user and system) this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
