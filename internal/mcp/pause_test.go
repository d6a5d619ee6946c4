package mcp

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestPausedDefaultSandboxIsReused checks that run_code and exec on a
// paused sandbox just work: the session keeps its default sandbox (the
// manager resumes it) instead of replacing it.
func TestPausedDefaultSandboxIsReused(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()

	if txt, res := call(t, cs, "run_code", map[string]any{"code": "x = 1"}); res.IsError {
		t.Fatalf("run_code: %s", txt)
	}
	def := f.ids()[0]
	txt, res := call(t, cs, "sandbox_pause", map[string]any{"sandbox_id": def})
	if res.IsError {
		t.Fatalf("pause: %s", txt)
	}
	var out struct {
		Sandbox    sandboxView `json:"sandbox"`
		StateBytes int64       `json:"state_bytes"`
		SaveMs     int64       `json:"save_ms"`
	}
	if err := json.Unmarshal([]byte(txt), &out); err != nil || out.Sandbox.State != "paused" || out.StateBytes != 64<<20 ||
		out.SaveMs != 300 || out.Sandbox.PausedAt == nil || out.Sandbox.LifetimeLeftS == nil {
		t.Fatalf("pause: %s (%v)", txt, err)
	}
	if txt, res := call(t, cs, "run_code", map[string]any{"code": "x"}); res.IsError || !strings.Contains(txt, "42") {
		t.Fatalf("run_code on the paused sandbox: %s", txt)
	}
	if ids := f.ids(); len(ids) != 1 || ids[0] != def {
		t.Fatalf("sandboxes = %v; the paused default %s was not reused", ids, def)
	}
	if txt, res := call(t, cs, "sandbox_pause", map[string]any{"sandbox_id": def}); res.IsError {
		t.Fatalf("second pause: %s", txt)
	}
	if txt, res := call(t, cs, "exec", map[string]any{"cmd": []string{"echo", "hi"}}); res.IsError || !strings.Contains(txt, "echo hi") {
		t.Fatalf("exec on the paused sandbox: %s", txt)
	}
	f.mu.Lock()
	resumes := slices.Clone(f.resumes)
	f.mu.Unlock()
	if len(resumes) != 2 || f.ids()[0] != def || len(f.ids()) != 1 {
		t.Fatalf("resumes %v, sandboxes %v", resumes, f.ids())
	}

	if _, res := call(t, cs, "sandbox_pause", map[string]any{"sandbox_id": def}); res.IsError {
		t.Fatal("third pause failed")
	}
	txt, res = call(t, cs, "sandbox_resume", map[string]any{"sandbox_id": def})
	var sb sandboxView
	if res.IsError || json.Unmarshal([]byte(txt), &sb) != nil || sb.State != "running" || sb.LifetimeLeftS != nil {
		t.Fatalf("resume: %s", txt)
	}
	acts := strings.Join(f.actions(), " ")
	if !strings.Contains(acts, "sandbox.pause:mcp:") || !strings.Contains(acts, "sandbox.resume:mcp:") {
		t.Errorf("audit: %s", acts)
	}
}

func TestPauseTools(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()

	txt, res := call(t, cs, "sandbox_create", map[string]any{"idle_pause_s": 300, "metadata": map[string]string{"busy": "1"}})
	var sb sandboxView
	if res.IsError || json.Unmarshal([]byte(txt), &sb) != nil || sb.IdlePauseS != 300 {
		t.Fatalf("create: %s", txt)
	}
	if txt, res := call(t, cs, "sandbox_pause", map[string]any{"sandbox_id": sb.ID}); !res.IsError || !strings.Contains(txt, "force") {
		t.Errorf("pause of a busy sandbox: %s", txt)
	}
	if txt, res := call(t, cs, "sandbox_pause", map[string]any{"sandbox_id": sb.ID, "force": true}); res.IsError {
		t.Errorf("forced pause: %s", txt)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"sandbox_pause", map[string]any{"sandbox_id": "nope"}, "not found"},
		{"sandbox_resume", map[string]any{"sandbox_id": "nope"}, "not found"},
		{"sandbox_create", map[string]any{"idle_pause_s": 604801}, "idle_pause_s"},
		{"sandbox_create", map[string]any{"idle_pause_s": -1}, "idle_pause_s"},
	} {
		if txt, res := call(t, cs, tc.tool, tc.args); !res.IsError || !strings.Contains(txt, tc.want) {
			t.Errorf("%s %v: %s", tc.tool, tc.args, txt)
		}
	}
}
