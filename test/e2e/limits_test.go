package e2e

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestThreat091OutputFlood(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	// 70 MB of output: 64 MiB arrive, then a visible truncation marker.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e.cmd(ctx, nil, "exec", id, "--", "sh", "-c", "head -c 70000000 /dev/zero; echo done >&2")
	var errb strings.Builder
	c.Stderr = &errb
	out, err := c.Output()
	if ee, ok := errors.AsType[*exec.ExitError](err); err != nil && !ok {
		t.Fatal(err)
	} else if ok && ee.ExitCode() != 0 {
		t.Fatalf("exit %d: %s", ee.ExitCode(), errb.String())
	}
	if len(out) != 64<<20 {
		t.Fatalf("got %d bytes of stdout, want the 64 MiB cap", len(out))
	}
	if !strings.Contains(errb.String(), "output truncated") {
		t.Fatalf("no truncation marker on stderr: %q", errb.String())
	}
	// A process limit makes fork fail inside the exec, not the sandbox.
	r := e.run(t, nil, "exec", "--pids-limit", "4", id, "--", "sh", "-c", "for i in 1 2 3 4 5 6 7 8; do sleep 5 & done; wait")
	if r.code == 0 || !strings.Contains(strings.ToLower(r.stderr), "fork") {
		t.Fatalf("pids limit 4: exit %d stderr %q", r.code, r.stderr)
	}
	if got := e.must(t, "exec", id, "--", "echo", "ok"); got != "ok\n" {
		t.Fatalf("after the pids limit: %q", got)
	}
}

func TestConcurrentCreates(t *testing.T) {
	e := setup(t)
	const n = 4
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]string, n)
	for i := range n {
		wg.Go(func() {
			r := e.run(t, nil, "create", "--memory", "384M") // a fresh template: creates race to build it
			if r.code != 0 {
				errs[i] = r.stderr
				return
			}
			ids[i] = strings.TrimSpace(r.stdout)
		})
	}
	wg.Wait()
	for i := range n {
		if ids[i] != "" {
			t.Cleanup(func() { e.run(t, nil, "rm", ids[i]) })
		}
	}
	for i := range n {
		if errs[i] != "" || ids[i] == "" {
			t.Fatalf("create %d failed: %s", i, errs[i])
		}
	}
	for i, id := range ids {
		want := "sandbox-" + id
		e.must(t, "exec", id, "--", "sh", "-c", "echo "+want+" > /root/who")
		for j, other := range ids {
			got := strings.TrimSpace(e.must(t, "exec", other, "--", "sh", "-c", "cat /root/who 2>/dev/null; true"))
			if j == i && got != want {
				t.Fatalf("%s reads %q, want %q", other, got, want)
			}
			if j < i && got == want {
				t.Fatalf("%s sees %s's file", other, id)
			}
		}
	}
}
