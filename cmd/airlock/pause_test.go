package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// TestRemotePauseResumeTouch pauses, resumes and touches a real sandbox
// (the fake runtime saves and restores it); the saved state's size, the
// time it took and the running time left are the server's.
func TestRemotePauseResumeTouch(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create", "--idle-pause", "5m").stdout)
	if got := a.creates()[0]["idle_pause_s"]; got != float64(300) {
		t.Fatalf("create sent idle_pause_s %v", got)
	}
	if r := runCLI(t, a, nil, "create", "--idle-pause", "soon"); r.code == 0 || !strings.Contains(r.stderr, "--idle-pause") {
		t.Errorf("bad --idle-pause: %+v", r)
	}
	if r := runCLI(t, a, nil, "create", "--idle-pause", "0"); r.code != 0 {
		t.Errorf("--idle-pause 0: %+v", r)
	} else if creates := a.creates(); len(creates) != 2 {
		t.Errorf("creates %v", creates)
	} else if _, sent := creates[1]["idle_pause_s"]; sent {
		t.Errorf("--idle-pause 0 sent idle_pause_s: %v", creates[1])
	}

	r := runCLI(t, a, nil, "pause", id)
	if r.code != 0 || !regexp.MustCompile(`^paused `+id+` \(\d+ MiB state, saved in \d+\.\d s\)\n$`).MatchString(r.stdout) {
		t.Fatalf("pause: %+v", r)
	}
	if p := a.requests("POST", "/pause"); p[0].body["force"] != false {
		t.Errorf("pause sent %v", p[0].body)
	}
	if r := runCLI(t, a, nil, "pause", "--force", id); r.code != 0 || !strings.Contains(r.stdout, "already") || a.requests("POST", "/pause")[1].body["force"] != true {
		t.Errorf("second pause: %+v %v", r, a.requests("POST", "/pause")[1].body)
	}
	var v sandboxView
	if r := runCLI(t, a, nil, "inspect", id); json.Unmarshal([]byte(r.stdout), &v) != nil || v.State != "paused" ||
		v.IdlePauseS != 300 || v.PausedAt == nil || v.LifetimeLeftS == nil || *v.LifetimeLeftS <= 0 || *v.LifetimeLeftS > 15*60 {
		t.Fatalf("inspect while paused: %+v", r)
	}
	left := (time.Duration(*v.LifetimeLeftS) * time.Second).String() + " of running time"
	if r := runCLI(t, a, nil, "ls"); !strings.Contains(r.stdout, "paused") || !strings.Contains(r.stdout, left) {
		t.Errorf("ls while paused (%s): %+v", left, r)
	}
	if r := runCLI(t, a, nil, "resume", id); r.code != 0 || !strings.HasPrefix(r.stdout, "resumed "+id+" (in ") {
		t.Errorf("resume: %+v", r)
	}
	if r := runCLI(t, a, nil, "inspect", id); strings.Contains(r.stdout, "lifetime_left_s") || !strings.Contains(r.stdout, "paused_at") {
		t.Errorf("inspect after resume: %+v", r)
	}
	if r := runCLI(t, a, nil, "touch", id); r.code != 0 || len(a.requests("POST", "/keepalive")) != 1 {
		t.Errorf("touch: %+v (%d keepalives)", r, len(a.requests("POST", "/keepalive")))
	}

	// A sandbox running a command is not paused without force.
	busy := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	if _, err := airlock.New(a.srv.URL, a.key).Start(t.Context(), busy, airlock.ExecRequest{Cmd: []string{"sleep", "600"}}); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, a, nil, "pause", busy, "aaaaaaaaaaaa")
	if r.code != 1 || !strings.Contains(r.stderr, "pause "+busy+": failed_precondition") || !strings.Contains(r.stderr, "pause aaaaaaaaaaaa: not_found") {
		t.Errorf("failing pauses: %+v", r)
	}
}
