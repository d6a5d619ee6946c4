package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// balloon allocates 16 MiB at a time, touching every page, until the OOM
// killer stops it; it prints how far it got.
const balloon = `import sys
b = []
while True:
    b.append(bytearray(16 << 20))
    print(len(b) * 16, flush=True)
`

// TestThreat086MemoryBalloonIsReportedAsOOM: an exec that allocates past
// the guest's memory is killed by the guest kernel's OOM killer and that is
// what every surface says: the local CLI (exit 137, "out of memory" on
// stderr), the API's exit line (signal 9, oom_killed true) and the remote
// CLI through the Go SDK; the sandbox and its agent survive and answer the
// next exec. An exec that ends normally is not oom_killed. Under gVisor the
// guest never counts the kill (the host's OOM killer ends the systrap stub
// behind the balloon in runsc's cgroup): the shim reads the host's count.
func TestThreat086MemoryBalloonIsReportedAsOOM(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--memory", "256M")
	r := e.run(t, nil, "exec", id, "--", "python3", "-c", balloon)
	if !strings.Contains(r.stdout, "16\n") {
		t.Fatalf("the balloon did not run: exit %d stdout %q stderr %q", r.code, tail(r.stdout, 200), tail(r.stderr, 2000))
	}
	if r.code != 137 {
		t.Fatalf("local CLI: exit %d stderr %q, want 137 (SIGKILL)", r.code, tail(r.stderr, 2000))
	}
	if got := e.must(t, "exec", id, "--", "echo", "alive"); got != "alive\n" {
		t.Fatalf("the agent did not answer after the balloon: %q", got)
	}
	if !strings.Contains(r.stderr, "airlock: out of memory") {
		t.Fatalf("local CLI: stderr %q, want out of memory", tail(r.stderr, 2000))
	}

	s := startServe(t, e)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-oom"))
	r = remoteRun(t, e, s, key, nil, "create", "--memory", "256M")
	if r.code != 0 {
		t.Fatalf("create: exit %d: %s", r.code, r.stderr)
	}
	rid := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { remoteRun(t, e, s, key, nil, "rm", rid) })

	body, _ := json.Marshal(map[string]any{"cmd": []string{"python3", "-c", balloon}})
	code, b := s.do(key, "POST", "/v1/sandboxes/"+rid+"/exec", bytes.NewReader(body))
	if code != 200 {
		t.Fatalf("exec: %d %s", code, b)
	}
	var exit struct {
		Code, Signal int
		OOMKilled    bool `json:"oom_killed"`
	}
	var sawOut, sawExit bool
	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		var l struct{ Type, Data string }
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch l.Type {
		case "stdout":
			sawOut = true
		case "exit":
			sawExit = true
			if err := json.Unmarshal(sc.Bytes(), &exit); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !sawOut || !sawExit || exit.Code != -1 || exit.Signal != 9 || !exit.OOMKilled {
		t.Fatalf("API: output %v exit line %v %+v, want signal 9 and oom_killed", sawOut, sawExit, exit)
	}
	// The Go SDK (the remote CLI is built on it).
	r = remoteRun(t, e, s, key, nil, "exec", rid, "--", "python3", "-c", balloon)
	if r.code != 137 || !strings.Contains(r.stderr, "airlock: out of memory") {
		t.Fatalf("remote CLI: exit %d stderr %q, want 137 and out of memory", r.code, tail(r.stderr, 2000))
	}
	code, b = s.do(key, "POST", "/v1/sandboxes/"+rid+"/exec", strings.NewReader(`{"cmd":["echo","alive"]}`))
	if code != 200 || !strings.Contains(string(b), `"oom_killed":false`) || !strings.Contains(string(b), "alive") {
		t.Fatalf("after the balloons: %d %s", code, b)
	}
}
