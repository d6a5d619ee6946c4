package mcp

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestNetworkSet: sandbox_network_set replaces a sandbox's egress policy
// through the manager's SetNetwork; a rule that opens the platform floor
// is refused to the session (not an admin) with the create's reason, a bad
// rule names itself, and another session's or a missing sandbox is not
// found.
func TestNetworkSet(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()
	txt, res := call(t, cs, "sandbox_create", map[string]any{"network": "deny"})
	if res.IsError {
		t.Fatalf("create: %s", txt)
	}
	var sb sandboxView
	if err := json.Unmarshal([]byte(txt), &sb); err != nil {
		t.Fatal(err)
	}
	txt, res = call(t, cs, "sandbox_network_set", map[string]any{"sandbox_id": sb.ID, "allow": []string{"pypi.org", "files.pythonhosted.org:443"}})
	if res.IsError {
		t.Fatalf("set: %s", txt)
	}
	var out struct {
		Network string   `json:"network"`
		Allow   []string `json:"allow"`
		Applied string   `json:"applied"`
	}
	if err := json.Unmarshal([]byte(txt), &out); err != nil || out.Network != "deny" || out.Applied != "running" ||
		!slices.Equal(out.Allow, []string{"pypi.org", "files.pythonhosted.org:443"}) {
		t.Fatalf("set: %s (%v)", txt, err)
	}
	f.mu.Lock()
	stored := f.sbs[sb.ID].Network
	f.mu.Unlock()
	if stored.Mode != "deny" || len(stored.Allow) != 2 {
		t.Fatalf("stored network %+v", stored)
	}
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"sandbox_id": sb.ID, "allow": []string{"169.254.169.254"}}, "admin key"},
		{map[string]any{"sandbox_id": sb.ID, "allow": []string{"*.com"}}, "*.com"},
		{map[string]any{"sandbox_id": sb.ID, "network": "none"}, "mode none"},
		{map[string]any{"sandbox_id": "nosuchsandboxaaaaaaa", "network": "public"}, "not found"},
	} {
		if txt, res := call(t, cs, "sandbox_network_set", tc.args); !res.IsError || !strings.Contains(txt, tc.want) {
			t.Errorf("%v: %q, want an error with %q", tc.args, txt, tc.want)
		}
	}
}
