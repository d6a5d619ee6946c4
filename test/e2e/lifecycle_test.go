package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

type inspected struct {
	State         string  `json:"state"`
	Reason        string  `json:"reason"`
	IdlePauseS    float64 `json:"idle_pause_s"`
	LifetimeLeftS float64 `json:"lifetime_left_s"`
	Runtime       string  `json:"runtime"`
}

func inspect(t *testing.T, e env, id string) inspected {
	t.Helper()
	var in inspected
	if err := json.Unmarshal([]byte(e.must(t, "inspect", id)), &in); err != nil {
		t.Fatal(err)
	}
	return in
}

// vmmRunning reports whether a VMM of sandbox id exists: a QEMU process,
// or on gVisor a runsc process of it.
func vmmRunning(id string) bool {
	for _, pid := range processesMentioning(id) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.Contains(string(b), "-M\x00microvm") || strings.Contains(string(b), "runsc") {
			return true
		}
	}
	return false
}

// TestPauseResumeKeepsEverything: a Python context's variables and a
// 100 MB numpy array, a background process, and the disk survive a pause
// (which ends the VMM, or on gVisor the sandbox's runsc) and a resume.
func TestPauseResumeKeepsEverything(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--lifetime", "10m")
	out := e.must(t, "code", id, `import numpy as np, hashlib
x = 41
a = np.random.default_rng().random(100 * 1024 * 1024 // 8)
digest = hashlib.sha256(a.tobytes()).hexdigest()
print(digest)`)
	digest := strings.TrimSpace(out)
	if len(digest) != 64 {
		t.Fatalf("setup printed %q", out)
	}
	pid := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!; echo on-disk > /root/marker"))

	t0 := time.Now()
	e.must(t, "pause", id)
	pauseDur := time.Since(t0)
	if st := inspect(t, e, id); st.State != "paused" {
		t.Fatalf("after pause: state %q (%s)", st.State, st.Reason)
	}
	if vmmRunning(id) {
		t.Fatal("the VMM still runs after pause")
	}
	if shimAliveE2E(t, e, id) {
		t.Fatal("the shim still runs after pause")
	}

	t1 := time.Now()
	e.must(t, "resume", id)
	resumeDur := time.Since(t1)
	t.Logf("pause %v, resume %v (CLI processes included)", pauseDur, resumeDur)
	if st := inspect(t, e, id); st.State != "running" {
		t.Fatalf("after resume: state %q (%s)", st.State, st.Reason)
	}
	out = e.must(t, "code", id, `print(x + 1, hashlib.sha256(a.tobytes()).hexdigest() == digest)`)
	if strings.TrimSpace(out) != "42 True" {
		t.Fatalf("after resume the context printed %q", out)
	}
	if r := e.run(t, nil, "exec", id, "--", "kill", "-0", pid); r.code != 0 {
		t.Fatalf("background sleep (pid %s) is gone after resume: %s", pid, r.stderr)
	}
	if got := e.must(t, "exec", id, "--", "cat", "/root/marker"); got != "on-disk\n" {
		t.Fatalf("disk marker %q", got)
	}

	// Any call to a paused sandbox resumes it first, on the runtime it
	// was created with whatever the caller's --runtime says.
	e.must(t, "pause", id)
	other := "gvisor"
	if onGVisor() {
		other = "qemu"
	}
	if r := e.runWith(t, []string{"AIRLOCK_RUNTIME=" + other}, nil, "exec", id, "--", "cat", "/root/marker"); r.code != 0 || r.stdout != "on-disk\n" {
		t.Fatalf("exec on a paused sandbox: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	if st := inspect(t, e, id); st.State != "running" || st.Runtime != runtimeName() {
		t.Fatalf("after an exec on a paused sandbox: %+v", st)
	}
}

func shimAliveE2E(t *testing.T, e env, id string) bool {
	t.Helper()
	b, err := os.ReadFile(e.state + "/sandboxes/" + id + "/shim.lock")
	if err != nil {
		return false
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 {
		return false
	}
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(cmd), id)
}

// TestIdlePause: a sandbox with --idle-pause 5s pauses itself within 10 s
// of going idle, and the next exec just works.
func TestIdlePause(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--idle-pause", "5s")
	e.must(t, "exec", id, "--", "true")
	idleSince := time.Now()
	for {
		st := inspect(t, e, id)
		if st.State == "paused" {
			break
		}
		if time.Since(idleSince) > 10*time.Second {
			t.Fatalf("not paused %v after going idle (state %q)", time.Since(idleSince), st.State)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("paused %v after the last exec", time.Since(idleSince).Round(100*time.Millisecond))
	if vmmRunning(id) {
		t.Fatal("VMM still running while paused")
	}
	if got := e.must(t, "exec", id, "--", "echo", "back"); got != "back\n" {
		t.Fatalf("exec after idle pause: %q", got)
	}
}

// smapsRollup returns a process's RSS and PSS in KiB.
func smapsRollup(t *testing.T, pid int) (rss, pss int64) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "Rss:":
				rss = v
			case "Pss:":
				pss = v
			}
		}
	}
	return rss, pss
}

// TestForkDiverges: three forks of a live sandbox start with its memory
// (a Python variable) and disk, then diverge, and share the memory pages
// none of them changed.
func TestForkDiverges(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	if out := e.must(t, "code", id, "x = 41\nprint('set')"); strings.TrimSpace(out) != "set" {
		t.Fatalf("setup: %q", out)
	}
	e.must(t, "exec", id, "--", "sh", "-c", "echo parent > /root/who")
	out := e.must(t, "fork", id, "--count", "3")
	forks := strings.Fields(out)
	if len(forks) != 3 {
		t.Fatalf("fork printed %q", out)
	}
	for _, f := range forks {
		t.Cleanup(func() { e.run(t, nil, "rm", f) })
	}
	rands := map[string]bool{}
	for i, f := range forks {
		if got := strings.TrimSpace(e.must(t, "code", f, "print(x + 1)")); got != "42" {
			t.Errorf("fork %s: x + 1 = %q", f, got)
		}
		e.must(t, "exec", f, "--", "sh", "-c", "echo fork"+strconv.Itoa(i)+" > /root/who")
		rands[strings.TrimSpace(e.must(t, "exec", f, "--", "sh", "-c", "head -c 16 /dev/urandom | od -An -tx1"))] = true
	}
	if len(rands) != 3 {
		t.Errorf("forks read the same /dev/urandom bytes: %v", rands)
	}
	for i, f := range forks {
		if got := e.must(t, "exec", f, "--", "cat", "/root/who"); got != "fork"+strconv.Itoa(i)+"\n" {
			t.Errorf("fork %d sees %q", i, got)
		}
	}
	if got := e.must(t, "exec", id, "--", "cat", "/root/who"); got != "parent\n" {
		t.Errorf("the parent sees %q", got)
	}
	if got := strings.TrimSpace(e.must(t, "code", id, "print(x)")); got != "41" {
		t.Errorf("the parent's x is %q", got)
	}
	for _, f := range forks {
		pid := vmmPID(t, f)
		rss, pss := smapsRollup(t, pid)
		t.Logf("fork %s VMM: RSS %d MiB, PSS %d MiB", f, rss>>10, pss>>10)
		if pss*4 > rss*3 {
			t.Errorf("fork %s shares little memory: PSS %d KiB of RSS %d KiB", f, pss, rss)
		}
	}
}

// TestSnapshotLiveKeepsSourceRunning: a snapshot and a fork of a running
// sandbox save it while it runs: its shim and VMM go on (a pause and a
// resume would replace both), a TCP connection from the host into the
// guest through a published port stays open across both and keeps
// working, a command started before goes on in it and in the fork, and the
// trail records the moments its process audit was off. A sandbox starts
// from the snapshot with the source's processes.
func TestSnapshotLiveKeepsSourceRunning(t *testing.T) {
	e := setup(t)
	var sandboxes []string
	name := "e2e-live-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Cleanup(func() {
		for _, sb := range sandboxes {
			e.run(t, nil, "rm", sb)
		}
		e.run(t, nil, "snapshot", "rm", name)
	})
	id := e.create(t, "-p", "127.0.0.1:0:7000")
	const echo = `import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000))
s.listen()
while True:
    c, _ = s.accept()
    while d := c.recv(4096):
        c.sendall(d)
    c.close()
`
	e.must(t, "exec", id, "--", "sh", "-c", "printf '%s' \"$1\" > /root/echo.py; setsid python3 /root/echo.py >/dev/null 2>&1 </dev/null &\n"+
		`for i in $(seq 100); do python3 -c 'import socket;socket.create_connection(("127.0.0.1",7000)).close()' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`, "sh", echo)
	ports := publishedPorts(t, e, id)
	if len(ports) != 1 {
		t.Fatalf("inspect ports: %+v", ports)
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(ports[0].HostPort), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	roundTrip := func(when, line string) {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(time.Minute))
		if _, err := conn.Write([]byte(line + "\n")); err != nil {
			t.Fatalf("%s: write: %v", when, err)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != line+"\n" {
			t.Fatalf("%s: echo %q, %v", when, got, err)
		}
	}
	roundTrip("before", "one")
	waiter := e.cmd(t.Context(), nil, "exec", id, "--", "sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.1; done; echo went")
	if err := waiter.Start(); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, time.Minute, func() bool {
		return e.run(t, nil, "exec", id, "--", "pgrep", "-f", "^sh -c while").code == 0
	}) {
		t.Fatal("the waiting command never ran")
	}
	_ = waiter.Process.Kill() // its CLI, not the command: it goes on in the guest
	_ = waiter.Wait()
	shim, vmm := shimPID(t, e, id), vmmPID(t, id)

	e.must(t, "snapshot", id, "--name", name)
	roundTrip("after the snapshot", "two")
	fork := strings.TrimSpace(e.must(t, "fork", id))
	sandboxes = append(sandboxes, fork)
	roundTrip("after the fork", "three")
	if s, v := shimPID(t, e, id), vmmPID(t, id); s != shim || v != vmm {
		t.Fatalf("shim %d then %d, VMM %d then %d: the source was restarted", shim, s, vmm, v)
	}
	if st := inspect(t, e, id); st.State != "running" {
		t.Fatalf("the source is %q (%s)", st.State, st.Reason)
	}
	// The command goes on in the source and in the fork.
	for _, sb := range []string{id, fork} {
		e.must(t, "exec", sb, "--", "touch", "/tmp/go")
		if !testutil.WaitFor(t, time.Minute, func() bool {
			return strings.Contains(e.must(t, "ps", sb), "exited")
		}) {
			t.Fatalf("the waiting command did not end in %s:\n%s", sb, e.must(t, "ps", sb))
		}
	}
	if out := e.must(t, "events", id, "--type", "proc.audit.gap"); strings.Count(out, `"proc.audit.gap"`) < 2 {
		t.Errorf("the trail has no audit gap for each of the two saves:\n%s", out)
	}
	n := strings.TrimSpace(e.must(t, "create", "--from-snapshot", name))
	sandboxes = append(sandboxes, n)
	// Its copy of the server is there (still serving the host's
	// connection, which the copy's network never had).
	if r := e.run(t, nil, "exec", n, "--", "pgrep", "-f", "python3 /root/echo.py"); r.code != 0 {
		t.Errorf("the sandbox from the snapshot has no echo server: %d %q", r.code, r.stderr)
	}
}

// TestSnapshotCreateFrom: a named snapshot keeps the sandbox running, and
// new sandboxes start from it with its memory and disk.
func TestSnapshotCreateFrom(t *testing.T) {
	e := setup(t)
	// Sandboxes go before the snapshots their disks are backed by, and a
	// snapshot before the ones taken after it: one cleanup, in that order.
	var sandboxes, snapshots []string
	t.Cleanup(func() {
		for _, sb := range sandboxes {
			e.run(t, nil, "rm", sb)
		}
		for i := len(snapshots) - 1; i >= 0; i-- {
			e.run(t, nil, "snapshot", "rm", snapshots[i])
		}
	})
	id := strings.TrimSpace(e.must(t, "create"))
	sandboxes = append(sandboxes, id)
	e.must(t, "code", id, "greeting = 'from the snapshot'\nprint(1)")
	e.must(t, "exec", id, "--", "sh", "-c", "echo saved > /root/state")
	name := "e2e-" + strings.ToLower(id)
	e.must(t, "snapshot", id, "--name", name)
	snapshots = append(snapshots, name)
	if st := inspect(t, e, id); st.State != "running" {
		t.Fatalf("after snapshot the sandbox is %q", st.State)
	}
	e.must(t, "exec", id, "--", "sh", "-c", "echo changed > /root/state")
	n := strings.TrimSpace(e.must(t, "create", "--from-snapshot", name))
	sandboxes = append(sandboxes, n)
	if got := e.must(t, "exec", n, "--", "cat", "/root/state"); got != "saved\n" {
		t.Errorf("from-snapshot disk: %q", got)
	}
	if got := strings.TrimSpace(e.must(t, "code", n, "print(greeting)")); got != "from the snapshot" {
		t.Errorf("from-snapshot memory: %q", got)
	}
	if r := e.run(t, nil, "snapshot", "rm", name); r.code == 0 {
		t.Error("snapshot rm succeeded while a sandbox is backed by it")
	}

	// A corrupt snapshot is refused with a clear error.
	bad := name + "-bad"
	e.must(t, "snapshot", id, "--name", bad)
	snapshots = append(snapshots, bad)
	var snaps []struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	}
	if err := json.Unmarshal([]byte(e.must(t, "snapshot", "ls", "--json")), &snaps); err != nil {
		t.Fatal(err)
	}
	for _, sn := range snaps {
		if sn.Name != bad {
			continue
		}
		state := "state.bin" // QEMU's migration stream
		if onGVisor() {
			state = "pages.img" // runsc's checkpoint: the memory's pages
		}
		f, err := os.OpenFile(e.state+"/snapshots/"+sn.ID+"/state/"+state, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = f.WriteAt([]byte("corrupt!"), 4096)
		f.Close()
	}
	r := e.run(t, nil, "create", "--from-snapshot", bad)
	if r.code == 0 {
		e.run(t, nil, "rm", strings.TrimSpace(r.stdout))
		t.Fatal("a sandbox started from a corrupt snapshot")
	}
	if !strings.Contains(r.stderr, "corrupt") {
		t.Errorf("corrupt snapshot: %q", r.stderr)
	}
}

// TestPauseResumeBackgroundServerAndForce checks the README's pause rules
// for commands: a dev server an exec started in the background does not
// block a pause, serves again after the resume and in a fork; a command
// still running is parked by a pause (its CLI exits 75 saying so) and goes
// on after the resume, in the sandbox and in a fork of it, with its output
// from before the pause; --force ends a running command with a note saying
// the sandbox was paused.
func TestPauseResumeBackgroundServerAndForce(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--lifetime", "10m")
	pid := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c", "python3 -m http.server 8000 >/tmp/http.log 2>&1 & echo $!"))
	serves := func(id string) bool {
		return e.run(t, nil, "exec", id, "--", "curl", "-sf", "-o", "/dev/null", "http://127.0.0.1:8000/").code == 0
	}
	if !testutil.WaitFor(t, 2*time.Minute, func() bool { return serves(id) }) {
		t.Fatal("the background server never answered")
	}
	e.must(t, "pause", id)
	if st := inspect(t, e, id); st.State != "paused" {
		t.Fatalf("after pause: state %q (%s)", st.State, st.Reason)
	}
	if !serves(id) {
		t.Fatal("after the resume the background server does not answer")
	}
	if r := e.run(t, nil, "exec", id, "--", "kill", "-0", pid); r.code != 0 {
		t.Fatalf("the server (pid %s) is gone after the resume: %s", pid, r.stderr)
	}
	fork := strings.TrimSpace(e.must(t, "fork", id))
	t.Cleanup(func() { e.run(t, nil, "rm", fork) })
	if !serves(fork) {
		t.Fatal("the fork's copy of the background server does not answer")
	}

	// A command in the foreground is parked by the pause: its CLI exits
	// 75 and names the exec, which goes on after the resume.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	waiter := []string{"sh", "-c", "echo before; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo after; exit 7"}
	c := e.cmd(ctx, nil, append([]string{"exec", id, "--"}, waiter...)...)
	var stdout, stderr testutil.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, time.Minute, func() bool { return strings.Contains(stdout.String(), "before") }) {
		t.Fatalf("the command never printed; stderr %q", stderr.String())
	}
	e.must(t, "pause", id)
	if st := inspect(t, e, id); st.State != "paused" {
		t.Fatalf("after pausing with a command running: state %q (%s)", st.State, st.Reason)
	}
	err := c.Wait()
	ee, ok := errors.AsType[*exec.ExitError](err)
	m := regexp.MustCompile("airlock attach " + id + " ([a-z2-7]{20})").FindStringSubmatch(stderr.String())
	if !ok || ee.ExitCode() != 75 || m == nil || !strings.Contains(stderr.String(), "was paused while the command ran") {
		t.Fatalf("the exec of a paused sandbox: %v, stderr %q; want exit 75 and how to attach", err, stderr.String())
	}
	execID := m[1]
	running := func(id string) bool { // ps resumes a paused sandbox
		out := e.must(t, "ps", id)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, execID) {
				return strings.Contains(l, "running")
			}
		}
		t.Fatalf("airlock ps %s does not list exec %s:\n%s", id, execID, out)
		return false
	}
	if !running(id) {
		t.Fatal("the parked command is not running after the resume")
	}
	// A fork snapshots the sandbox while it runs: the command goes on in
	// the source and, parked in the snapshot, in the fork.
	fork2 := strings.TrimSpace(e.must(t, "fork", id))
	t.Cleanup(func() { e.run(t, nil, "rm", fork2) })
	for _, sb := range []string{fork2, id} {
		if !running(sb) {
			t.Fatalf("the command is not running in %s after the fork", sb)
		}
		e.must(t, "exec", sb, "--", "touch", "/tmp/go")
		r := e.run(t, nil, "attach", sb, execID)
		if r.code != 7 || r.stdout != "before\nafter\n" {
			t.Fatalf("attach in %s: exit %d, stdout %q, stderr %q; want 7 and the output from before and after the pause", sb, r.code, r.stdout, r.stderr)
		}
	}

	// --force ends a running command.
	c = e.cmd(ctx, nil, "exec", id, "--", "sleep", "1000")
	var stderr2 testutil.Buffer
	c.Stderr = &stderr2
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, time.Minute, func() bool {
		return e.run(t, nil, "exec", id, "--", "pgrep", "-f", "^sleep 1000").code == 0
	}) {
		t.Fatal("sleep 1000 never ran")
	}
	e.must(t, "pause", "--force", id)
	err = c.Wait()
	ee, ok = errors.AsType[*exec.ExitError](err)
	if !ok || ee.ExitCode() != 137 || !strings.Contains(stderr2.String(), "[airlock: the sandbox was paused (force); the process was killed]") {
		t.Fatalf("the forced-out exec: %v, stderr %q; want exit 137 and the pause note", err, stderr2.String())
	}
	if !serves(id) {
		t.Fatal("after the forced pause the background server does not answer")
	}
}
