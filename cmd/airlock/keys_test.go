package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestKeysNetworkLimits: keys create and update set a tenant's outbound
// abuse limits; update changes only the flags given.
func TestKeysNetworkLimits(t *testing.T) {
	dir := t.TempDir()
	cli := func(args ...string) cliResult {
		t.Helper()
		r := execCLI(t, &globals{}, nil, append([]string{"--state-dir", dir}, args...))
		if r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
		return r
	}
	cli("keys", "create", "--tenant", "acme", "--max-sandboxes", "3", "--net-conn-rate", "20", "--net-dests-per-min", "-1")
	list := func() keyJSON {
		t.Helper()
		var keys []keyJSON
		if err := json.Unmarshal([]byte(cli("keys", "ls", "--json").stdout), &keys); err != nil || len(keys) != 1 {
			t.Fatalf("keys ls: %v %v", keys, err)
		}
		return keys[0]
	}
	k := list()
	if k.NetConnRate != 20 || k.NetDestsPerMin != -1 || k.NetUDPRate != 0 || k.MaxSandboxes != 3 {
		t.Fatalf("created %+v", k)
	}
	cli("keys", "update", k.ID, "--net-udp-pps", "500", "--net-conn-rate", "0")
	if k = list(); k.NetConnRate != 0 || k.NetDestsPerMin != -1 || k.NetUDPRate != 500 || k.MaxSandboxes != 3 {
		t.Fatalf("updated %+v", k)
	}
	if r := execCLI(t, &globals{}, nil, []string{"--state-dir", dir, "keys", "update", "0000000000", "--net-udp-pps", "1"}); r.code == 0 || !strings.Contains(r.stderr, "no key") {
		t.Fatalf("update of a missing key: exit %d %s", r.code, r.stderr)
	}
	if r := execCLI(t, &globals{}, nil, []string{"--state-dir", dir, "keys", "update", k.ID, "--net-udp-pps", "70000"}); r.code == 0 {
		t.Fatal("a limit over the maximum was accepted")
	}
}
