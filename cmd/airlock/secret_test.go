package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// TestSecretFlagForms: --secret takes NAME@host (the value from $NAME) or
// vault:NAME[@host,...] (the vault's value, resolved by the server).
func TestSecretFlagForms(t *testing.T) {
	t.Parallel()
	lookup := func(k string) (string, bool) { return map[string]string{"A": "value-a"}[k], k == "A" }
	f := netFlags{secrets: []string{"A@a.example", "vault:GH", "vault:NPM@registry.npmjs.org,*.npmjs.com"}}
	s, vals, err := f.spec(lookup)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Secrets) != 3 || vals["A"] != "value-a" || len(vals) != 1 {
		t.Fatalf("spec %+v, %d values", s.Secrets, len(vals))
	}
	if gh := s.Secrets[1]; gh.Name != "GH" || gh.Vault != "GH" || len(gh.Hosts) != 0 {
		t.Errorf("vault:GH parsed as %+v", gh)
	}
	if npm := s.Secrets[2]; npm.Vault != "NPM" || len(npm.Hosts) != 2 {
		t.Errorf("vault:NPM@... parsed as %+v", npm)
	}
	n := apiNetwork(s, vals)
	if n.Secrets[1].Vault != "GH" || n.Secrets[1].Value != "" || n.Secrets[0].Value != "value-a" {
		t.Errorf("API network %+v", n.Secrets)
	}
	for _, bad := range []string{"vault:", "vault:GH@", "vault:1X", "vault:A", "vault:GH=x@a.example"} {
		f := netFlags{secrets: []string{"A@a.example", bad}}
		if _, _, err := f.spec(lookup); err == nil || !strings.Contains(err.Error(), "--secret") {
			t.Errorf("%q: %v, want an error naming --secret", bad, err)
		}
	}
	if _, err := netconf.ParseSecretFlag("vault:GH@a.example,b.example"); err != nil {
		t.Error(err)
	}
}

// TestSecretCommands: secret set (value from $NAME or stdin, never argv),
// ls and rm drive the vault routes; create --secret vault:NAME and network
// add-secret / rm-secret reference it; no value is echoed.
func TestSecretCommands(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	const value = "cli-vault-value-0c7e"
	if r := runCLIEnv(t, a, map[string]string{"GH": value}, "secret", "set", "GH", "--hosts", "api.github.com"); r.code != 0 || r.stdout != "GH\n" {
		t.Fatalf("set from env: %+v", r)
	}
	if puts := a.requests("PUT", "/v1/secrets/GH"); len(puts) != 1 || puts[0].body["value"] != value {
		t.Fatalf("sent %+v", puts)
	}
	if r := runCLI(t, a, strings.NewReader("stdin-value-77\n"), "secret", "set", "NPM", "--stdin"); r.code != 0 {
		t.Fatalf("set from stdin: %+v", r)
	}
	if puts := a.requests("PUT", "/v1/secrets/NPM"); len(puts) != 1 || puts[0].body["value"] != "stdin-value-77" {
		t.Fatalf("sent %+v", puts)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"secret", "set", "MISSING"}, "$MISSING is unset"},
		{[]string{"secret", "set", "GH=" + value}, "never from the command line"},
		{[]string{"secret", "set", "1BAD"}, "must be letters"},
	} {
		r := runCLI(t, a, nil, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, value) {
			t.Errorf("%v: %+v", tc.args, r)
		}
	}
	r := runCLI(t, a, nil, "secret", "ls", "--json")
	var list []struct {
		Name  string
		Hosts []string
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 2 || list[0].Name != "GH" || strings.Contains(r.stdout, value) {
		t.Fatalf("ls --json: %+v", r)
	}
	if r := runCLI(t, a, nil, "secret", "ls"); r.code != 0 || !strings.Contains(r.stdout, "api.github.com") || !strings.Contains(r.stdout, "NPM") {
		t.Fatalf("ls: %+v", r)
	}

	id := strings.TrimSpace(runCLI(t, a, nil, "create", "--secret", "vault:GH").stdout)
	if id == "" {
		t.Fatal("create --secret vault:GH made no sandbox")
	}
	var v networkView
	if r := runCLI(t, a, nil, "network", "get", "--json", id); r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || v.Secrets["GH"].Vault != "GH" || v.Secrets["GH"].Hosts[0] != "api.github.com" {
		t.Fatalf("network after create: %+v", r)
	}
	if r := runCLI(t, a, nil, "network", "add-secret", id, "vault:NPM@registry.npmjs.org"); r.code != 0 || !strings.Contains(r.stdout, "added NPM; in force now") {
		t.Fatalf("add-secret: %+v", r)
	}
	if r := runCLIEnv(t, a, map[string]string{"TOKEN": "env-value-41"}, "network", "add-secret", id, "TOKEN@api.example.com"); r.code != 0 {
		t.Fatalf("add-secret from env: %+v", r)
	}
	if puts := a.requests("PUT", "/secrets/TOKEN"); len(puts) != 1 || puts[0].body["value"] != "env-value-41" {
		t.Fatalf("sent %+v", puts)
	}
	if r := runCLI(t, a, nil, "network", "add-secret", id, "UNSET@api.example.com"); r.code == 0 || !strings.Contains(r.stderr, "$UNSET is unset") {
		t.Fatalf("add-secret without a value: %+v", r)
	}
	if r := runCLI(t, a, nil, "network", "rm-secret", id, "TOKEN"); r.code != 0 || !strings.Contains(r.stdout, "removed TOKEN") {
		t.Fatalf("rm-secret: %+v", r)
	}
	if r := runCLI(t, a, nil, "network", "get", "--json", id); r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || len(v.Secrets) != 2 {
		t.Fatalf("network after the changes: %+v", r)
	}
	if r := runCLI(t, a, nil, "secret", "rm", "GH", "NPM"); r.code != 0 {
		t.Fatalf("rm: %+v", r)
	}
	if r := runCLI(t, a, nil, "secret", "rm", "GH"); r.code == 0 {
		t.Fatalf("rm of a removed secret: %+v", r)
	}
	if r := runCLI(t, a, nil, "rm", id); r.code != 0 {
		t.Fatalf("rm sandbox: %+v", r)
	}
}
