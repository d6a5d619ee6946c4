package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestRemoteSnapshotFork snapshots and forks real sandboxes (the fake
// runtime saves and restores them): the snapshots' ids and sizes are the
// server's. A snapshot's name stays taken, and the snapshot in use, while
// the sandbox it was taken of lives: the second snapshot is another
// sandbox's, and the first one's sandbox is removed before the snapshot.
func TestRemoteSnapshotFork(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	src := strings.TrimSpace(runCLI(t, a, nil, "create", "--cpus", "2", "--memory", "1G").stdout)
	other := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	line := func(name string) *regexp.Regexp { return regexp.MustCompile(`^` + name + ` ([0-9a-f]+) (\S+)\n$`) }
	res := runCLI(t, a, nil, "snapshot", src, "--name", "after-setup")
	m := line("after-setup").FindStringSubmatch(res.stdout)
	if m == nil {
		t.Fatalf("snapshot printed %+v", res)
	}
	if res := runCLI(t, a, nil, "snapshot", "create", other, "--name", "second", "--force"); !line("second").MatchString(res.stdout) {
		t.Errorf("snapshot create printed %+v", res)
	}
	res = runCLI(t, a, nil, "snapshot", "ls")
	if !strings.Contains(res.stdout, "NAME") || !strings.Contains(res.stdout, "after-setup") || !strings.Contains(res.stdout, src) || !strings.Contains(res.stdout, m[2]) {
		t.Errorf("snapshot ls: %q", res.stdout)
	}
	var snaps []struct {
		Name, ID  string
		SizeBytes int64 `json:"size_bytes"`
	}
	res = runCLI(t, a, nil, "snapshot", "ls", "--json")
	if err := json.Unmarshal([]byte(res.stdout), &snaps); err != nil || len(snaps) != 2 {
		t.Fatalf("snapshot ls --json: %q", res.stdout)
	}
	for _, sn := range snaps {
		if sn.Name == "after-setup" && (!strings.Contains(res.stdout, fmt.Sprintf(`"size_bytes": %d`, sn.SizeBytes)) || humanBytes(sn.SizeBytes) != m[2] || sn.ID != m[1]) {
			t.Errorf("snapshot ls --json: %q, want %s of %s", res.stdout, m[1], m[2])
		}
	}
	if err := a.m.Remove(t.Context(), sandbox.Local(), src); err != nil {
		t.Fatal(err)
	}
	if res := runCLI(t, a, nil, "snapshot", "rm", "after-setup", "nope"); res.stdout != "after-setup\n" || !strings.Contains(res.stderr, "snapshot rm nope") || res.code != 1 {
		t.Errorf("snapshot rm: %+v", res)
	}
	if res := runCLI(t, a, nil, "snapshot", "prune"); !regexp.MustCompile(`^freed \S+ \(\d+ bytes\)\n$`).MatchString(res.stdout) {
		t.Errorf("snapshot prune: %+v", res)
	}
	res = runCLI(t, a, nil, "fork", other, "--count", "2")
	forks := strings.Fields(res.stdout)
	if res.code != 0 || len(forks) != 2 || res.stdout != forks[0]+"\n"+forks[1]+"\n" {
		t.Errorf("fork: %+v", res)
	}
	for _, id := range forks {
		if sb, err := a.env.Store.GetSandbox(t.Context(), id); err != nil || sb.Source != "fork:"+other || sb.State != "running" {
			t.Errorf("fork %s: %+v %v", id, sb, err)
		}
	}
	for _, args := range [][]string{{"snapshot", other}, {"snapshot", other, "--name", "_fork-x"}, {"snapshot", other, "--name", "a b"}} {
		if res := runCLI(t, a, nil, args...); res.code == 0 {
			t.Errorf("%v: accepted", args)
		}
	}
	var reqs []string
	a.mu.Lock()
	for _, r := range a.reqs {
		if strings.HasSuffix(r.path, "/snapshot") || strings.HasSuffix(r.path, "/fork") || strings.HasPrefix(r.path, "/v1/snapshots") {
			reqs = append(reqs, r.method+" "+r.path+" "+r.raw)
		}
	}
	a.mu.Unlock()
	want := strings.Join([]string{
		`POST /v1/sandboxes/` + src + `/snapshot {"name":"after-setup","force":false}`,
		`POST /v1/sandboxes/` + other + `/snapshot {"name":"second","force":true}`,
		"GET /v1/snapshots ", "GET /v1/snapshots ",
		"DELETE /v1/snapshots/after-setup ", "DELETE /v1/snapshots/nope ",
		"POST /v1/snapshots/prune ",
		`POST /v1/sandboxes/` + other + `/fork {"count":2,"force":false}`,
	}, "\n")
	if got := strings.Join(reqs, "\n"); got != want {
		t.Errorf("requests:\n%s\nwant:\n%s", got, want)
	}
}

func TestRemoteCreateFromSnapshot(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	src := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	if res := runCLI(t, a, nil, "snapshot", src, "--name", "after-setup"); res.code != 0 {
		t.Fatalf("snapshot: %+v", res)
	}
	if res := runCLI(t, a, nil, "create", "--from-snapshot", "after-setup", "--lifetime", "1m"); res.code != 0 {
		t.Fatalf("create: %+v", res)
	}
	creates := a.creates()
	in := creates[len(creates)-1]
	if in["from_snapshot"] != "after-setup" || in["cpus"] != nil || in["memory_mb"] != nil || in["image"] != nil || in["timeout_s"] != float64(60) {
		t.Errorf("create request %v", in)
	}
	if res := runCLI(t, a, nil, "create", "--from-snapshot", "after-setup", "--net", "none"); res.code == 0 || !strings.Contains(res.stderr, "--net") {
		t.Errorf("create --from-snapshot --net: %+v", res)
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0K", 1536: "1.5K", 5 << 20: "5.0M", 3 << 30: "3.0G"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
