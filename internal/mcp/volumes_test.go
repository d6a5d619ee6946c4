package mcp

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestCreateWithVolumes: sandbox_create mounts volumes (read-write unless
// read_only) and shows them; a volume mounted elsewhere is a clear error.
// Host directories are not offered.
func TestCreateWithVolumes(t *testing.T) {
	h := newHandler(t, newFake(), nil)
	cs, end := connect(t, h)
	defer end()
	txt, res := call(t, cs, "sandbox_create", map[string]any{"volumes": []map[string]any{
		{"name": "data", "path": "/data"}, {"name": "ref", "path": "/ref", "read_only": true},
	}})
	if res.IsError {
		t.Fatalf("create: %s", txt)
	}
	var sb sandboxView
	if err := json.Unmarshal([]byte(txt), &sb); err != nil {
		t.Fatal(err)
	}
	if want := []mountView{{Volume: "data", Path: "/data"}, {Volume: "ref", Path: "/ref", ReadOnly: true}}; len(sb.Mounts) != 2 || sb.Mounts[0] != want[0] || sb.Mounts[1] != want[1] {
		t.Fatalf("mounts: %+v", sb.Mounts)
	}
	txt, res = call(t, cs, "sandbox_create", map[string]any{"volumes": []map[string]any{{"name": "busy", "path": "/data"}}})
	if !res.IsError || !strings.Contains(txt, "read-write by one sandbox at a time") {
		t.Fatalf("busy volume: %s", txt)
	}
	txt, res = call(t, cs, "sandbox_create", map[string]any{"mounts": []map[string]any{{"host_path": "/etc", "path": "/x"}}})
	if !res.IsError {
		t.Fatalf("a host mount over MCP was accepted: %s", txt)
	}
}
