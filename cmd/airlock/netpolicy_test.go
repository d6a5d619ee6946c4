package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestNetworkSetGet: network set sends the whole new policy (PUT
// .../network) and says what it did, network get prints it; bad rules are
// refused before anything is sent, naming the flag; a paused sandbox's
// change applies on resume; each change is in the audit trail.
func TestNetworkSetGet(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create", "--net", "deny").stdout)

	r := runCLI(t, a, nil, "network", "set", id, "--allow", "pypi.org", "--allow", "*.pythonhosted.org:443")
	if r.code != 0 || r.stdout != id+": egress deny, allow pypi.org *.pythonhosted.org:443; in force now, 0 open connections closed\n" {
		t.Fatalf("set: %+v", r)
	}
	puts := a.requests("PUT", "/network")
	if len(puts) != 1 || puts[0].raw != `{"allow":["pypi.org","*.pythonhosted.org:443"]}` {
		t.Fatalf("sent %+v", puts)
	}
	var v networkView
	if r := runCLI(t, a, nil, "network", "get", "--json", id); r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil ||
		v.Mode != "deny" || len(v.Allow) != 2 {
		t.Fatalf("get --json: %+v", r)
	}
	if r := runCLI(t, a, nil, "network", "get", id); r.code != 0 || !strings.Contains(r.stdout, "mode:      deny\nallow:     pypi.org\n           *.pythonhosted.org:443\n") {
		t.Fatalf("get: %+v", r)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"network", "set", id}, "--net public"},
		{[]string{"network", "set", id, "--allow", "*.com"}, "--allow"},
		{[]string{"network", "set", id, "--net", "sideways"}, "--net"},
	} {
		if r := runCLI(t, a, nil, tc.args...); r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: %+v", tc.args, r)
		}
	}
	if n := len(a.requests("PUT", "/network")); n != 1 {
		t.Fatalf("refused flags sent %d requests", n-1)
	}
	if r := runCLI(t, a, nil, "network", "set", id, "--net", "none"); r.code == 0 || !strings.Contains(r.stderr, "mode none") {
		t.Errorf("set --net none: %+v", r)
	}

	if r := runCLI(t, a, nil, "pause", id); r.code != 0 {
		t.Fatalf("pause: %+v", r)
	}
	if r := runCLI(t, a, nil, "network", "set", id, "--net", "public"); r.code != 0 || !strings.Contains(r.stdout, "applies when it resumes") {
		t.Fatalf("set while paused: %+v", r)
	}
	if r := runCLI(t, a, nil, "inspect", id); !strings.Contains(r.stdout, `"state": "paused"`) {
		t.Fatalf("the change resumed the sandbox: %s", r.stdout)
	}
	evs, err := a.m.Store.ListEvents(t.Context(), store.EventFilter{SandboxID: id, Type: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	var changes []string
	for _, e := range evs {
		if e.Action == "sandbox.network" {
			changes = append(changes, e.Detail["applied"].(string))
		}
	}
	if strings.Join(changes, " ") != "running resume" && strings.Join(changes, " ") != "resume running" {
		t.Fatalf("sandbox.network events applied %v", changes)
	}
}
