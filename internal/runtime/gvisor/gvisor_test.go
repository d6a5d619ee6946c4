package gvisor

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
)

// requireRunsc gates the tests that run real sandboxes: they skip under
// -short, or when runsc is missing unless AIRLOCK_TEST_VM=1 (then missing
// runsc, or not being root, fails the test: CI must not skip silently).
func requireRunsc(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("gvisor: not under -short")
	}
	requested := os.Getenv("AIRLOCK_TEST_VM") == "1"
	p, err := FindRunsc()
	if err != nil {
		if requested {
			t.Fatalf("AIRLOCK_TEST_VM=1 but %v", err)
		}
		t.Skipf("gvisor: %v; or set AIRLOCK_TEST_VM=1 to make this fail", err)
	}
	if os.Geteuid() != 0 {
		if requested {
			t.Fatal("AIRLOCK_TEST_VM=1 but the gvisor tests need root")
		}
		t.Skip("gvisor: runs sandboxes only as root")
	}
	return p
}

var (
	agentOnce sync.Once
	agentBin  string
	agentErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if agentBin != "" {
		_ = os.RemoveAll(filepath.Dir(agentBin))
	}
	os.Exit(code)
}

// buildAgent builds the static agent once per test binary.
func buildAgent(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-gvisor-agent-") //nolint:usetesting // built once per test binary, shared by every test
		if err != nil {
			agentErr = err
			return
		}
		agentBin = filepath.Join(dir, "airlock-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-o", agentBin, "github.com/airlock-sandbox/airlock/cmd/airlock-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = fmt.Errorf("build agent: %v: %s", err, out)
		}
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentBin
}

// testRootfs makes a tiny image tree: busybox and an /etc/passwd.
func testRootfs(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox-static is needed (make deps): %v", err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "etc", "root", "tmp", "usr/bin", "proc", "sys", "dev", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := PrepareRoot(root); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "cat", "echo", "ls", "true", "sleep", "env", "nproc", "head", "dd", "nc", "mkdir", "rm", "hostname"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/tmp:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:1000:\n",
		"etc/hosts":  "127.0.0.1 localhost\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

type fixture struct {
	rt     *Runtime
	rootfs string
	base   string // every instance's RunDir is under base
	n      atomic.Int64
}

func newFixture(t *testing.T, tweak ...func(*Config)) *fixture {
	runsc := requireRunsc(t)
	cfg := Config{RunscPath: runsc, AgentPath: buildAgent(t)}
	for _, f := range tweak {
		f(&cfg)
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Probe(t.Context()); err != nil {
		t.Fatal(err)
	}
	return &fixture{rt: rt, rootfs: testRootfs(t), base: t.TempDir()}
}

func (f *fixture) spec(t *testing.T) runtime.Spec {
	i := f.n.Add(1)
	dir, err := os.MkdirTemp(f.base, "run-") //nolint:usetesting // under the fixture's base directory, not the test's
	if err != nil {
		t.Fatal(err)
	}
	return runtime.Spec{
		ID:        fmt.Sprintf("gv-%d", i),
		CPUs:      1,
		MemoryMiB: 256,
		Kernel:    "unused",
		Initrd:    "unused",
		RootDisk:  f.rootfs,
		RunDir:    dir,
	}
}

// inUse counts instances not yet released plus processes whose command
// line names a run dir of this fixture (runsc, its sandbox and gofer).
func (f *fixture) inUse(t *testing.T) int {
	n := f.rt.InUse()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), f.base) {
			n++
		}
	}
	return n
}

// TestConformance runs the runtime conformance suite against runsc.
func TestConformance(t *testing.T) {
	f := newFixture(t)
	runtimetest.Run(t, runtimetest.Harness{
		Runtime: f.rt,
		Spec:    f.spec,
		BrokenSpec: func(t *testing.T) runtime.Spec {
			s := f.spec(t)
			// A root that is a file: runsc starts and then fails.
			s.RootDisk = filepath.Join(s.RunDir, "not-a-dir")
			if err := os.WriteFile(s.RootDisk, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return s
		},
		InUse:       f.inUse,
		BootTimeout: 20 * time.Second,
	})
	if n := f.inUse(t); n != 0 {
		t.Errorf("%d resources still in use after the suite", n)
	}
	checkNoLeftovers(t, f)
}

// checkNoLeftovers fails if a sandbox left a runsc state dir, a bundle, an
// overlay dir, a cgroup or a network namespace behind.
func checkNoLeftovers(t *testing.T, f *fixture) {
	t.Helper()
	_ = filepath.WalkDir(f.base, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && (d.Name() == "runsc" || d.Name() == "bundle" || d.Name() == "upper" || d.Name() == monitorDir) {
			t.Errorf("left behind: %s", p)
		}
		return nil
	})
	for _, c := range []string{"memory", "cpu", "pids"} {
		ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", c, f.rt.cfg.CgroupParent))
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), "airlock-gv-") {
				t.Errorf("cgroup left behind: %s/%s", c, e.Name())
			}
		}
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "airlock-gv-") {
			t.Errorf("netns left behind: %s", e.Name())
		}
	}
}
