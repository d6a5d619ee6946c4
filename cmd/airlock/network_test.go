package main

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

func TestNetFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OPENAI_API_KEY": "sk-from-env", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	f := netFlags{
		allow:   []string{"api.github.com", "203.0.113.0/24:443"},
		secrets: []string{"OPENAI_API_KEY@api.openai.com,*.openai.azure.com"},
		publish: []string{"127.0.0.1:8080:8000", "9000"},
		rate:    "10M", maxConns: 100,
	}
	s, vals, err := f.spec(lookup)
	if err != nil {
		t.Fatal(err)
	}
	if s.Mode != "" || len(s.Allow) != 2 || s.RateBytes != 10<<20 || s.MaxConns != 100 || len(s.Ports) != 2 || s.Ports[1].HostPort != 9000 ||
		len(s.Secrets) != 1 || len(s.Secrets[0].Hosts) != 2 || s.Secrets[0].Placeholder != "" || vals["OPENAI_API_KEY"] != "sk-from-env" {
		t.Errorf("spec %+v values %v", s, vals)
	}
	// A secret scoped to one header.
	f = netFlags{secrets: []string{"OPENAI_API_KEY@api.openai.com:authorization"}}
	if s, _, err := f.spec(lookup); err != nil || len(s.Secrets) != 1 || s.Secrets[0].Header != "authorization" {
		t.Errorf("scoped: spec %+v, %v", s, err)
	} else if n := apiNetwork(s, netconf.Values{"OPENAI_API_KEY": "v"}); n.Secrets[0].Header != "authorization" {
		t.Errorf("scoped: API network %+v", n)
	}
	for _, tc := range []struct {
		f    netFlags
		want string
	}{
		{netFlags{mode: "open"}, "--net"},
		{netFlags{mode: "none", allow: []string{"a.example"}}, "--allow"},
		{netFlags{allow: []string{"*.com"}}, "--allow"},
		{netFlags{secrets: []string{"MISSING@a.example"}}, "--secret MISSING: invalid argument: $MISSING is unset or empty"},
		{netFlags{secrets: []string{"EMPTY@a.example"}}, "--secret EMPTY"},
		{netFlags{secrets: []string{"OPENAI_API_KEY=sk-from-env@a.example"}}, "never from the command line"},
		{netFlags{secrets: []string{"OPENAI_API_KEY=sk-from-env"}}, "never from the command line"},
		{netFlags{secrets: []string{"OPENAI_API_KEY"}}, "--secret"},
		{netFlags{secrets: []string{"OPENAI_API_KEY@a.example:443"}}, "--secret"},
		{netFlags{secrets: []string{"OPENAI_API_KEY@a.example:Host"}}, "--secret"},
		{netFlags{secrets: []string{"OPENAI_API_KEY@a.example:"}}, "--secret"},
		{netFlags{mode: "none", secrets: []string{"OPENAI_API_KEY@a.example"}}, "--secret"},
		{netFlags{publish: []string{"80:0"}}, "-p"},
		{netFlags{publish: []string{"nope:80:81"}}, "-p/--publish"},
		{netFlags{rate: "fast"}, "--net-rate"},
		{netFlags{maxConns: -1}, "--max-conns"},
	} {
		_, _, err := tc.f.spec(lookup)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.f, err, tc.want)
		} else if strings.Contains(err.Error(), "sk-from-env") {
			t.Errorf("%+v: the secret value is in %v", tc.f, err)
		}
	}
}

func TestRemoteNetwork(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	env := map[string]string{"OPENAI_API_KEY": "sk-from-env"}
	// The sandbox's shim listens on the published port: a free one.
	port := freePort(t)
	r := runCLIEnv(t, a, env, "create", "--net", "deny", "--allow", "api.github.com", "--allow", "203.0.113.0/24:443",
		"--secret", "OPENAI_API_KEY@api.openai.com", "-p", fmt.Sprintf("127.0.0.1:%d:8000", port), "--net-rate", "1M", "--max-conns", "64")
	if r.code != 0 {
		t.Fatalf("create: %+v", r)
	}
	id := strings.TrimSpace(r.stdout)
	got, _ := json.Marshal(a.creates()[0]["network"])
	want := `{"allow":["api.github.com","203.0.113.0/24:443"],"max_conns":64,"mode":"deny",` +
		fmt.Sprintf(`"ports":[{"guest_port":8000,"host_ip":"127.0.0.1","host_port":%d}],"rate_bytes":1048576,`, port) +
		`"secrets":[{"hosts":["api.openai.com"],"name":"OPENAI_API_KEY","value":"sk-from-env"}]}`
	if string(got) != want {
		t.Errorf("network sent\n got %s\nwant %s", got, want)
	}
	r = runCLIEnv(t, a, env, "inspect", id)
	var v sandboxView
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Network == nil {
		t.Fatalf("inspect: %+v %v", r, err)
	}
	if n := v.Network; n.Mode != "deny" || len(n.Allow) != 2 || n.Secrets["OPENAI_API_KEY"].Hosts[0] != "api.openai.com" ||
		!strings.HasPrefix(n.Secrets["OPENAI_API_KEY"].Placeholder, "airlock-secret-") || len(n.Ports) != 1 || n.Ports[0].GuestPort != 8000 {
		t.Errorf("inspect network %+v", n)
	}
	if strings.Contains(r.stdout, "sk-from-env") {
		t.Error("inspect shows the secret value")
	}
	// No network flags: no "network" in the request (the server's default).
	if r := runCLIEnv(t, a, env, "run", "--", "true"); r.code != 0 {
		t.Fatalf("run: %+v", r)
	}
	// A secret missing from the environment fails before anything is created.
	r = runCLIEnv(t, a, env, "run", "--secret", "GH_TOKEN@api.github.com", "--", "true")
	if r.code != 1 || !strings.Contains(r.stderr, "--secret GH_TOKEN") || !strings.Contains(r.stderr, "unset") {
		t.Errorf("unset secret: %+v", r)
	}
	if creates := a.creates(); len(creates) != 2 || creates[1]["network"] != nil {
		t.Errorf("%d creates; second network %v", len(creates), creates[len(creates)-1]["network"])
	}

	if r := runCLIEnv(t, a, env, "events", id, "--type", "net"); r.code != 0 {
		t.Fatalf("events: %+v", r)
	}
	if r := runCLIEnv(t, a, env, "events", "--sandbox", "other0000000", id); r.code != 1 || !strings.Contains(r.stderr, "--sandbox") {
		t.Errorf("events with two ids: %+v", r)
	}
	if evs := a.requests("GET", "/v1/events"); len(evs) != 1 || !strings.Contains(evs[0].query, "type=net") || !strings.Contains(evs[0].query, "sandbox="+id) {
		t.Errorf("events queries %+v", evs)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
