// Package e2e drives the real airlock binary against real QEMU guests (vm
// tier). Each test states one acceptance point of the foundation issue.
// Sandboxes are shared where a test does not need its own, to keep the
// number of boots small under TCG.
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

type result struct {
	stdout, stderr string
	code           int
}

type env struct {
	bin, state string
}

func setup(t *testing.T) env {
	t.Helper()
	testutil.RequireVM(t)
	bin := os.Getenv("AIRLOCK_BIN")
	if bin == "" {
		t.Fatal("vm tier needs AIRLOCK_BIN (make test-vm sets it to bin/airlock)")
	}
	return env{bin: bin, state: testutil.StateDir(t)}
}

// onGVisor reports whether the tests run on the gvisor runtime
// (AIRLOCK_RUNTIME=gvisor, as `make test`'s second pass sets it).
func onGVisor() bool { return os.Getenv("AIRLOCK_RUNTIME") == "gvisor" }

// The suite runs on qemu unless AIRLOCK_RUNTIME says gvisor: without it,
// airlock's default (auto) could pick either, and the tests' expectations
// follow runtimeName. The commands the tests run inherit it.
func init() {
	if os.Getenv("AIRLOCK_RUNTIME") != "gvisor" {
		_ = os.Setenv("AIRLOCK_RUNTIME", "qemu")
	}
}

// runtimeName is the runtime the suite's sandboxes run on.
func runtimeName() string {
	if onGVisor() {
		return "gvisor"
	}
	return "qemu"
}

func (e env) cmd(ctx context.Context, stdin io.Reader, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, e.bin, append([]string{"--state-dir", e.state}, args...)...)
	c.Stdin = stdin
	return c
}

func (e env) run(t *testing.T, stdin io.Reader, args ...string) result {
	t.Helper()
	return e.runWith(t, nil, stdin, args...)
}

// runWith runs the CLI with extra environment (inherited by the shims it
// starts) and stdin.
func (e env) runWith(t *testing.T, extraEnv []string, stdin io.Reader, args ...string) result {
	t.Helper()
	// Not t.Context(): it is already cancelled when cleanups run.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := e.cmd(ctx, stdin, args...)
	if extraEnv != nil {
		c.Env = append(os.Environ(), extraEnv...)
	}
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	r := result{out.String(), errb.String(), 0}
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("airlock %v: %v", args, err)
	}
	return r
}

func (e env) must(t *testing.T, args ...string) string {
	t.Helper()
	r := e.run(t, nil, args...)
	if r.code != 0 {
		t.Fatalf("airlock %v: exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func (e env) create(t *testing.T, args ...string) string {
	t.Helper()
	id := strings.TrimSpace(e.must(t, append([]string{"create"}, args...)...))
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	return id
}

func TestRunPrintsGuestKernel(t *testing.T) {
	e := setup(t)
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	r := e.run(t, nil, "run", "--", "python3", "-c", "import platform;print(platform.release())")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	guest := strings.TrimSpace(r.stdout)
	if guest == "" || guest == strings.TrimSpace(string(host)) {
		t.Fatalf("guest kernel %q should be non-empty and differ from host %q", guest, host)
	}
	r = e.run(t, nil, "run", "--", "python3", "-c", "print(6*7)")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "42" {
		t.Fatalf("print(6*7): exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}

func TestExecSemantics(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--memory", "256M")

	r := e.run(t, nil, "exec", id, "--", "sh", "-c", "echo hi; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "hi\n" || r.stderr != "err\n" {
		t.Fatalf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := e.run(t, nil, "exec", id, "--", "sh", "-c", "exit 7"); r.code != 7 {
		t.Fatalf("exit 7 gave %d", r.code)
	}
	r = e.run(t, strings.NewReader("data from stdin\n"), "exec", "-i", id, "--", "cat")
	if r.code != 0 || r.stdout != "data from stdin\n" {
		t.Fatalf("stdin: exit %d %q", r.code, r.stdout)
	}
	r = e.run(t, nil, "exec", "-e", "K=V", "-w", "/tmp", "-u", "nobody", id, "--", "sh", "-c", `echo "$K $(pwd) $(id -un)"`)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "V /tmp nobody" {
		t.Fatalf("env/cwd/user: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// A command the guest cannot start is not a missing sandbox: 127 for
	// not found (program, cwd, user), 126 for not executable, with the
	// guest's reason; the sandbox goes on.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--", "airlock-no-such-program"}, 127, "executable not found"},
		{[]string{"-w", "/no/such/dir", "--", "true"}, 127, "cwd"},
		{[]string{"-u", "no-such-user", "--", "true"}, 127, "unknown user"},
		{[]string{"--", "/etc/hostname"}, 126, "permission denied"},
	} {
		args := append([]string{"exec", id}, c.args...)
		if c.args[0] != "--" {
			args = append([]string{"exec", c.args[0], c.args[1], id}, c.args[2:]...)
		}
		r := e.run(t, nil, args...)
		if r.code != c.code || !strings.Contains(r.stderr, "did not start") || !strings.Contains(r.stderr, c.want) || strings.Contains(r.stderr, "no sandbox") {
			t.Errorf("airlock %v: exit %d, stderr %q; want %d and the guest's reason %q", args, r.code, r.stderr, c.code, c.want)
		}
	}
	// --memory 256M: MemTotal at most 256 MiB.
	out := e.must(t, "exec", id, "--", "sh", "-c", "awk '/MemTotal/{print $2}' /proc/meminfo")
	kb, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || kb > 256*1024 || kb < 128*1024 {
		t.Fatalf("MemTotal = %q kB, want <= 262144", out)
	}
	// Per-exec timeout: sleep 60 with --timeout 2s returns within 10 s.
	start := time.Now()
	r = e.run(t, nil, "exec", "--timeout", "2s", id, "--", "sleep", "60")
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("timeout took %s", el)
	}
	if r.code != 124 || !strings.Contains(r.stderr, "timed out") {
		t.Fatalf("timeout: exit %d stderr %q", r.code, r.stderr)
	}
	// The sandbox still answers afterwards.
	if got := e.must(t, "exec", id, "--", "echo", "ok"); got != "ok\n" {
		t.Fatalf("after timeout: %q", got)
	}
	// Inspect says how it runs.
	var info struct {
		State     string `json:"state"`
		Accel     string `json:"accel"`
		StartMode string `json:"start_mode"`
	}
	if err := json.Unmarshal([]byte(e.must(t, "inspect", id)), &info); err != nil {
		t.Fatal(err)
	}
	accelOK := info.Accel == "tcg" || info.Accel == "kvm"
	if onGVisor() {
		accelOK = info.Accel == "none" && info.StartMode == "gvisor"
	}
	if info.State != "running" || !accelOK {
		t.Fatalf("inspect: %+v", info)
	}
}

func TestThreat085ForkBomb(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	bomb := e.cmd(ctx, nil, "exec", "--timeout", "60s", id, "--", "bash", "-c", ":(){ :|:& };:; sleep 60")
	var bombErr testutil.Buffer
	bomb.Stderr = &bombErr
	if err := bomb.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = bomb.Wait() }()
	bombStart := time.Now()
	// The second exec proves something only once the bomb has spread to its
	// pids limit: bash reports the forks the limit refused (EAGAIN).
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		return strings.Contains(bombErr.String(), "fork") && strings.Contains(bombErr.String(), "Resource temporarily unavailable")
	}) {
		t.Fatalf("the fork bomb never hit its pids limit; its stderr: %q", tail(bombErr.String(), 2000))
	}
	t.Logf("the fork bomb hit its pids limit %s after its exec started", time.Since(bombStart).Round(time.Millisecond))
	start := time.Now()
	r := e.run(t, nil, "exec", "--timeout", "60s", id, "--", "echo", "alive")
	if r.code != 0 || r.stdout != "alive\n" {
		t.Fatalf("second exec during fork bomb: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	t.Logf("second exec answered in %s during a fork bomb", time.Since(start))
}

func sha256File(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestThreat006SharedImagesStayImmutable(t *testing.T) {
	e := setup(t)
	a := e.create(t)
	b := e.create(t)
	// What guests share, hashed before they write anything: the image
	// blobs (qemu), or the extracted read-only image trees (gvisor).
	shared, hash := filepath.Join(e.state, "images", "blobs", "*.ext4"), sha256File
	if onGVisor() {
		shared, hash = filepath.Join(e.state, "images", "dirs", "sha256-*"), testutil.HashTree
	}
	bases, _ := filepath.Glob(shared)
	if len(bases) == 0 {
		t.Fatalf("nothing matches %s in the state dir", shared)
	}
	before := map[string]string{}
	for _, p := range bases {
		before[p] = hash(t, p)
	}
	e.must(t, "exec", a, "--", "sh", "-c", "echo secret-a > /root/a.txt && sync")
	if r := e.run(t, nil, "exec", b, "--", "cat", "/root/a.txt"); r.code == 0 {
		t.Fatalf("sandbox B read A's file: %q", r.stdout)
	}
	// The host's catalog (and anything else of the host) is invisible.
	canary := filepath.Join(e.state, "catalog.db")
	r := e.run(t, nil, "exec", a, "--", "sh", "-c", "cat "+canary+"; grep -E ' (9p|virtiofs|nfs|fuse) ' /proc/mounts; ls /sys/block")
	if strings.Contains(r.stdout, "SQLite") || strings.Contains(r.stdout, "9p") || strings.Contains(r.stdout, "virtiofs") {
		t.Fatalf("guest sees host files: %q", r.stdout)
	}
	// Guest root writes everywhere it can, including raw over its disk.
	e.run(t, nil, "exec", a, "--timeout", "120s", "--", "sh", "-c",
		"rm -rf /usr/share/doc /etc/passwd; echo x > /bin/ls; dd if=/dev/urandom of=/dev/vda bs=1M count=8 seek=1 conv=fsync 2>/dev/null; sync")
	for p, d := range before {
		if got := hash(t, p); got != d {
			t.Fatalf("shared image %s changed: %s -> %s", p, d, got)
		}
		if !onGVisor() && !strings.Contains(p, d) {
			t.Fatalf("blob %s is not named by its digest %s", p, d)
		}
	}
	// B is unaffected by A's damage.
	if got := e.must(t, "exec", b, "--", "sh", "-c", "test -s /etc/passwd && echo intact"); got != "intact\n" {
		t.Fatalf("B affected by A: %q", got)
	}
}

func TestCopyLargeFileRoundTrip(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.bin")
	f, err := os.Create(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(f, rand.Reader, 200<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := sha256File(t, in)
	e.must(t, "cp", in, id+":/srv/in.bin")
	got := strings.Fields(e.must(t, "exec", id, "--", "sha256sum", "/srv/in.bin"))[0]
	if got != want {
		t.Fatalf("guest sha256 %s, want %s", got, want)
	}
	out := filepath.Join(dir, "out.bin")
	e.must(t, "cp", id+":/srv/in.bin", out)
	if got := sha256File(t, out); got != want {
		t.Fatalf("copied-out sha256 %s, want %s", got, want)
	}
}

func TestClonesDifferAndKeepTime(t *testing.T) {
	e := setup(t)
	a, b := e.create(t), e.create(t)
	ra := e.must(t, "exec", a, "--", "sh", "-c", "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
	rb := e.must(t, "exec", b, "--", "sh", "-c", "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
	if len(ra) < 64 || ra == rb {
		t.Fatalf("clones read the same random bytes: %q %q", ra, rb)
	}
	for _, id := range []string{a, b} {
		before := time.Now()
		out := e.must(t, "exec", id, "--", "date", "+%s.%N")
		after := time.Now()
		sec, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if err != nil {
			t.Fatal(err)
		}
		guest := time.Unix(0, int64(sec*1e9))
		if guest.Before(before.Add(-time.Second)) || guest.After(after.Add(time.Second)) {
			t.Fatalf("guest clock %s not within 1s of host [%s, %s]", guest, before, after)
		}
	}
}

// shimPID reads the pid the shim keeps in its lock file.
func shimPID(t *testing.T, e env, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.state, "sandboxes", id, "shim.lock"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// processesMentioning lists pids whose command line contains s.
func processesMentioning(s string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestThreat113KillVMMAndShim(t *testing.T) {
	e := setup(t)
	// Killing the CLI mid-exec leaves the sandbox running and usable.
	id := e.create(t)
	ctx, cancel := context.WithCancel(t.Context())
	c := e.cmd(ctx, nil, "exec", id, "--", "sh", "-c", "echo started; exec sleep 30")
	var out testutil.Buffer
	c.Stdout = &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill the CLI only once the exec runs in the guest (else this tests a
	// CLI killed before it asked for anything).
	if !testutil.WaitFor(t, 60*time.Second, func() bool { return out.String() == "started\n" }) {
		_ = c.Process.Kill()
		t.Fatalf("the exec never started: stdout %q", out.String())
	}
	_ = c.Process.Signal(syscall.SIGKILL)
	_ = c.Wait()
	cancel()
	if got := e.must(t, "exec", id, "--", "echo", "still here"); got != "still here\n" {
		t.Fatalf("after killing the CLI: %q", got)
	}

	// rm leaves nothing behind: no processes, sockets, files or rows.
	sdir := filepath.Join(e.state, "sandboxes", id)
	if len(processesMentioning(id)) == 0 {
		t.Fatal("no process mentions the sandbox id before rm; the leak check below would prove nothing")
	}
	e.must(t, "rm", id)
	if _, err := os.Stat(sdir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sandbox dir left after rm: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(processesMentioning(id)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if p := processesMentioning(id); len(p) > 0 {
		t.Fatalf("processes left after rm: %v", p)
	}
	if r := e.run(t, nil, "inspect", id); r.code == 0 {
		t.Fatalf("catalog row left after rm: %s", r.stdout)
	}

	// Killing the shim marks the sandbox failed, and its VMM dies with it.
	id2 := e.create(t)
	pid := shimPID(t, e, id2)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	var info struct{ State, Reason string }
	for time.Now().Before(deadline) {
		_ = json.Unmarshal([]byte(e.must(t, "inspect", id2)), &info)
		if info.State == "failed" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if info.State != "failed" || info.Reason == "" {
		t.Fatalf("after killing the shim: %+v", info)
	}
	for len(processesMentioning(id2)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if p := processesMentioning(id2); len(p) > 0 {
		t.Fatalf("VMM outlived its shim: %v", p)
	}
	e.must(t, "rm", id2)
	if _, err := os.Stat(filepath.Join(e.state, "sandboxes", id2)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("failed sandbox's files left after rm")
	}

	// Killing the VMM (gVisor's sentry) marks the sandbox failed with a
	// reason; the shim exits.
	id3 := e.create(t)
	vmm := "qemu-system"
	if onGVisor() {
		vmm = "runsc-sandbox"
	}
	var vmmPID int
	for _, p := range processesMentioning(id3) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); bytes.HasPrefix(b, []byte(vmm)) || bytes.Contains(b, []byte("/"+vmm)) {
			vmmPID = p
		}
	}
	if vmmPID == 0 {
		t.Fatalf("no %s process found for the sandbox", vmm)
	}
	if err := syscall.Kill(vmmPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(15 * time.Second)
	info.State, info.Reason = "", ""
	for time.Now().Before(deadline) && info.State != "failed" {
		time.Sleep(100 * time.Millisecond)
		_ = json.Unmarshal([]byte(e.must(t, "inspect", id3)), &info)
	}
	if info.State != "failed" || !strings.Contains(info.Reason, "guest stopped unexpectedly") {
		t.Fatalf("after killing the VMM: %+v", info)
	}
	if r := e.run(t, nil, "exec", id3, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "failed") {
		t.Fatalf("exec in a failed sandbox: exit %d %q", r.code, r.stderr)
	}
}

func TestThreat094LifetimeTimeoutHolds(t *testing.T) {
	e := setup(t)
	id := strings.TrimSpace(e.must(t, "create", "--lifetime", "4s"))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if r := e.run(t, nil, "inspect", id); r.code != 0 && len(processesMentioning(id)) == 0 {
			if _, err := os.Stat(filepath.Join(e.state, "sandboxes", id)); errors.Is(err, os.ErrNotExist) {
				return // gone: row, processes and files
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("sandbox %s still exists 30s after a 4s lifetime", id)
}

func TestThreat100LimitValidation(t *testing.T) {
	e := setup(t)
	var wg sync.WaitGroup
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "--image", "no-such-image", "--", "true"}, "unknown image"},
		{[]string{"exec", "aaaaaaaaaaaa", "--", "true"}, "no sandbox"},
		{[]string{"exec", "../etc", "--", "true"}, "not a sandbox id"},
		{[]string{"create", "--memory", "lots"}, "--memory"},
		{[]string{"create", "--cpus", "0"}, "--cpus"},
		{[]string{"create", "--lifetime", "-3s"}, "--lifetime"},
	}
	res := make([]result, len(cases))
	for i, c := range cases {
		wg.Go(func() { res[i] = e.run(t, nil, c.args...) })
	}
	wg.Wait()
	for i, c := range cases {
		if res[i].code == 0 || !strings.Contains(res[i].stderr, c.want) {
			t.Errorf("airlock %v: exit %d, stderr %q; want an error mentioning %q", c.args, res[i].code, res[i].stderr, c.want)
		}
	}
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
