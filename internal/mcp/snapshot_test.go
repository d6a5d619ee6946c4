package mcp

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestSnapshotAndForkTools(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)

	txt, res := call(t, cs, "sandbox_create", map[string]any{"cpus": 2})
	var src sandboxView
	if res.IsError || json.Unmarshal([]byte(txt), &src) != nil {
		t.Fatalf("create: %s", txt)
	}
	txt, res = call(t, cs, "sandbox_snapshot", map[string]any{"sandbox_id": src.ID, "name": "after-setup"})
	var sn snapshotView
	if res.IsError || json.Unmarshal([]byte(txt), &sn) != nil || sn.Name != "after-setup" || sn.SandboxID != src.ID || sn.CPUs != 2 || sn.SizeBytes != 32<<20 {
		t.Fatalf("snapshot: %s", txt)
	}
	if strings.Contains(txt, "env") {
		t.Fatalf("snapshot shows env: %s", txt)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"sandbox_snapshot", map[string]any{"sandbox_id": src.ID, "name": "after-setup"}, "exists"},
		{"sandbox_snapshot", map[string]any{"sandbox_id": src.ID, "name": "-x"}, "snapshot name"},
		{"sandbox_snapshot", map[string]any{"sandbox_id": src.ID, "name": "_fork-x"}, "reserved"},
		{"sandbox_snapshot", map[string]any{"sandbox_id": "nope", "name": "y"}, "not found"},
		{"sandbox_fork", map[string]any{"sandbox_id": src.ID, "count": 17}, "count"},
		{"sandbox_fork", map[string]any{"sandbox_id": "nope"}, "not found"},
		{"sandbox_create", map[string]any{"from_snapshot": "nope"}, "not found"},
		{"sandbox_create", map[string]any{"from_snapshot": "after-setup", "network": "none"}, "from_snapshot"},
	} {
		if txt, res := call(t, cs, tc.tool, tc.args); !res.IsError || !strings.Contains(txt, tc.want) {
			t.Errorf("%s %v: %s", tc.tool, tc.args, txt)
		}
	}

	txt, res = call(t, cs, "sandbox_create", map[string]any{"from_snapshot": "after-setup"})
	var from sandboxView
	if res.IsError || json.Unmarshal([]byte(txt), &from) != nil || from.Source != "snapshot:after-setup" || from.CPUs != 2 {
		t.Fatalf("create from snapshot: %s", txt)
	}
	txt, res = call(t, cs, "sandbox_fork", map[string]any{"sandbox_id": src.ID, "count": 3})
	var forks struct{ Sandboxes []sandboxView }
	if res.IsError || json.Unmarshal([]byte(txt), &forks) != nil || len(forks.Sandboxes) != 3 || forks.Sandboxes[0].Source != "fork:"+src.ID {
		t.Fatalf("fork: %s", txt)
	}
	// The copies are the session's: listed as such, removed when it ends.
	txt, _ = call(t, cs, "sandbox_list", nil)
	if n := strings.Count(txt, "created_by_this_session"); n != 5 {
		t.Fatalf("list marks %d of 5 as the session's: %s", n, txt)
	}
	// The session may create at most 10: 5 more copies are refused.
	if txt, res := call(t, cs, "sandbox_fork", map[string]any{"sandbox_id": src.ID, "count": 6}); !res.IsError || !strings.Contains(txt, "at most") {
		t.Fatalf("fork over the session's limit: %s", txt)
	}
	acts := strings.Join(f.actions(), " ")
	for _, a := range []string{"snapshot.create:", "sandbox.fork:"} {
		if !strings.Contains(acts, a) {
			t.Errorf("audit lacks %s: %s", a, acts)
		}
	}
	end()
	if ids := f.ids(); len(ids) != 0 {
		t.Fatalf("left after the session: %v", ids)
	}
}
