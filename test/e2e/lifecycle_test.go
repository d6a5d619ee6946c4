package e2e

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

type inspected struct {
	State         string  `json:"state"`
	Reason        string  `json:"reason"`
	IdlePauseS    float64 `json:"idle_pause_s"`
	LifetimeLeftS float64 `json:"lifetime_left_s"`
}

func inspect(t *testing.T, e env, id string) inspected {
	t.Helper()
	var in inspected
	if err := json.Unmarshal([]byte(e.must(t, "inspect", id)), &in); err != nil {
		t.Fatal(err)
	}
	return in
}

// vmmRunning reports whether a QEMU process of sandbox id exists.
func vmmRunning(id string) bool {
	for _, pid := range processesMentioning(id) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if strings.Contains(string(b), "-M\x00microvm") {
			return true
		}
	}
	return false
}

// TestPauseResumeKeepsEverything: a Python context's variables and a
// 100 MB numpy array, a background process, and the disk survive a pause
// (which ends the VMM) and a resume.
func TestPauseResumeKeepsEverything(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--timeout", "10m")
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

	// Any call to a paused sandbox resumes it first.
	e.must(t, "pause", id)
	if got := e.must(t, "exec", id, "--", "cat", "/root/marker"); got != "on-disk\n" {
		t.Fatalf("exec on a paused sandbox: %q", got)
	}
	if st := inspect(t, e, id); st.State != "running" {
		t.Fatalf("after an exec on a paused sandbox: %q", st.State)
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
