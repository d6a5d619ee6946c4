package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestExecSurvivesCLIKill: `kill -9` of `airlock exec` mid-command leaves
// the command running in the sandbox, as one started through the API
// does (TestThreat112KillDaemonDuringExec): it finishes its work, and the API
// lists it as exited with code 0.
func TestExecSurvivesCLIKill(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := e.cmd(ctx, nil, "exec", id, "--", "sh", "-c", "echo started; sleep 3; echo done > /tmp/x")
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// First: the command ran (the kill below must hit a running exec).
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "started\n" {
		_ = c.Process.Kill()
		_ = c.Wait()
		t.Fatalf("first line from the CLI: %q %v", line, err)
	}
	if err := c.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.Wait()
	if c.ProcessState.ExitCode() != -1 {
		t.Fatalf("the CLI ended on its own (exit %d) before the kill", c.ProcessState.ExitCode())
	}

	// The command finishes in the guest.
	var r result
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		r = e.run(t, nil, "exec", id, "--", "cat", "/tmp/x")
		return r.code == 0 && r.stdout == "done\n"
	}) {
		t.Fatalf("/tmp/x after the CLI was killed: exit %d %q %q", r.code, r.stdout, r.stderr)
	}

	// The shim recorded its exit: the API lists it exited with code 0.
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "cli-kill-test", "--admin"))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", strings.Split(key, "_")[1]) })
	s := startServe(t, e)
	s.hc = &http.Client{Timeout: time.Minute}
	code, body := s.do(key, "GET", "/v1/sandboxes/"+id+"/execs", nil)
	var list struct {
		Execs []struct {
			ExecID string `json:"exec_id"`
			Cmd    []string
			State  string
			Exit   *struct{ Code, Signal int }
		}
	}
	if err := json.Unmarshal(body, &list); code != 200 || err != nil {
		t.Fatalf("list execs: %d %s %v", code, body, err)
	}
	found := false
	for _, x := range list.Execs {
		if len(x.Cmd) == 3 && strings.HasPrefix(x.Cmd[2], "echo started") {
			found = true
			if x.State != "exited" || x.Exit == nil || x.Exit.Code != 0 || x.Exit.Signal != 0 {
				t.Fatalf("the killed CLI's exec: %s", body)
			}
		}
	}
	if !found {
		t.Fatalf("the killed CLI's exec is not listed: %s", body)
	}
}
