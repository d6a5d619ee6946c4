package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// pause: a sandbox with metadata busy=1 is refused without force.
func (f *fakeAPI) pause(w http.ResponseWriter, r *http.Request, sb map[string]any) {
	var in map[string]any
	_ = json.NewDecoder(r.Body).Decode(&in)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pauses = append(f.pauses, in)
	if md, _ := sb["metadata"].(map[string]any); md["busy"] == "1" && in["force"] != true {
		apiError(w, 412, "failed_precondition", "sandbox has running commands; pause with force to end them")
		return
	}
	out := map[string]any{"pause": map[string]any{"state_bytes": 0, "save_ms": 0}}
	if sb["state"] != "paused" {
		sb["state"], sb["paused_at"], sb["lifetime_left_s"] = "paused", time.Now().UTC(), 600
		out["pause"] = map[string]any{"state_bytes": 123 << 20, "save_ms": 800}
	}
	for k, v := range sb {
		out[k] = v
	}
	writeJSONResp(w, 200, out)
}

func (f *fakeAPI) resume(w http.ResponseWriter, _ *http.Request, sb map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb["state"] = "running"
	delete(sb, "lifetime_left_s")
	writeJSONResp(w, 200, sb)
}

func TestRemotePauseResumeTouch(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	id := strings.TrimSpace(runCLI(t, srv, nil, "create", "--idle-pause", "5m").stdout)
	if got := f.creates[0]["idle_pause_s"]; got != float64(300) {
		t.Fatalf("create sent idle_pause_s %v", got)
	}
	if r := runCLI(t, srv, nil, "create", "--idle-pause", "soon"); r.code == 0 || !strings.Contains(r.stderr, "--idle-pause") {
		t.Errorf("bad --idle-pause: %+v", r)
	}
	if r := runCLI(t, srv, nil, "create", "--idle-pause", "0"); r.code != 0 {
		t.Errorf("--idle-pause 0: %+v", r)
	} else if _, sent := f.creates[len(f.creates)-1]["idle_pause_s"]; sent {
		t.Errorf("--idle-pause 0 sent idle_pause_s: %v", f.creates[len(f.creates)-1])
	}

	r := runCLI(t, srv, nil, "pause", id)
	if r.code != 0 || r.stdout != "paused "+id+" (123 MiB state, saved in 0.8 s)\n" {
		t.Fatalf("pause: %+v", r)
	}
	if f.pauses[0]["force"] != false {
		t.Errorf("pause sent %v", f.pauses[0])
	}
	if r := runCLI(t, srv, nil, "pause", "--force", id); r.code != 0 || !strings.Contains(r.stdout, "already") || f.pauses[1]["force"] != true {
		t.Errorf("second pause: %+v %v", r, f.pauses[1])
	}
	if r := runCLI(t, srv, nil, "ls"); !strings.Contains(r.stdout, "paused") || !strings.Contains(r.stdout, "10m0s of running time") {
		t.Errorf("ls while paused: %+v", r)
	}
	var v sandboxView
	if r := runCLI(t, srv, nil, "inspect", id); json.Unmarshal([]byte(r.stdout), &v) != nil || v.State != "paused" ||
		v.IdlePauseS != 300 || v.PausedAt == nil || v.LifetimeLeftS == nil || *v.LifetimeLeftS != 600 {
		t.Errorf("inspect while paused: %+v", r)
	}
	if r := runCLI(t, srv, nil, "resume", id); r.code != 0 || !strings.HasPrefix(r.stdout, "resumed "+id+" (in ") {
		t.Errorf("resume: %+v", r)
	}
	if r := runCLI(t, srv, nil, "inspect", id); strings.Contains(r.stdout, "lifetime_left_s") || !strings.Contains(r.stdout, "paused_at") {
		t.Errorf("inspect after resume: %+v", r)
	}
	if r := runCLI(t, srv, nil, "touch", id); r.code != 0 || f.keepalives != 1 {
		t.Errorf("touch: %+v (%d keepalives)", r, f.keepalives)
	}

	busy := strings.TrimSpace(runCLI(t, srv, nil, "create", "--meta", "busy=1").stdout)
	r = runCLI(t, srv, nil, "pause", busy, "aaaaaaaaaaaa")
	if r.code != 1 || !strings.Contains(r.stderr, "pause "+busy+": failed_precondition") || !strings.Contains(r.stderr, "pause aaaaaaaaaaaa: not_found") {
		t.Errorf("failing pauses: %+v", r)
	}
}
