package e2e

import (
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestVaultSecretAddedAndRemovedLive: a value stored in the vault (from
// airlock's environment, never argv) is given to a running sandbox that
// had no secrets; the guest learns the interception CA and its next
// command sees the placeholder, and a loopback TLS server of the test's
// own receives the real value; removed, the secret is injected no more
// (the server sees the placeholder as sent). On qemu the added secret
// survives a pause and resume. The value is nowhere in the state dir in
// clear (catalog, events, logs, a paused guest's state) or in `secret ls`.
func TestVaultSecretAddedAndRemovedLive(t *testing.T) {
	e := setup(t)
	value := "sk-e2e-VAULT-" + rand.Text()
	const name = "E2E_LIVE_TOKEN"
	caPEM, cert := testCA(t, "api.test")
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprintln(w, "ok")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	seenNow := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}

	if r := e.runWith(t, []string{name + "=" + value}, nil, "secret", "set", name, "--hosts", "api.test"); r.code != 0 {
		t.Fatalf("secret set: %s", r.stderr)
	}
	t.Cleanup(func() { e.run(t, nil, "secret", "rm", name) })
	if out := e.must(t, "secret", "ls"); !strings.Contains(out, name) || strings.Contains(out, value) {
		t.Fatalf("secret ls: %q", out)
	}

	dns := testutil.StartDNS(t, map[string][]string{"api.test": {pubC}})
	extra := []string{
		"AIRLOCK_TEST_DIAL_MAP=" + pubC + "=127.0.0.1",
		"AIRLOCK_DNS=" + dns.Addr,
		"AIRLOCK_UPSTREAM_CA_FILE=" + caFile,
	}
	r := e.runWith(t, extra, nil, "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })

	out := e.must(t, "network", "add-secret", id, "vault:"+name)
	if !strings.Contains(out, "added "+name+"; in force now") {
		t.Fatalf("add-secret: %q", out)
	}
	if got := e.must(t, "network", "get", "--json", id); !strings.Contains(got, `"vault": "`+name+`"`) && !strings.Contains(got, `"vault":"`+name+`"`) {
		t.Fatalf("network get: %s", got)
	}
	ph := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c", "printf %s \"$"+name+"\""))
	if !strings.HasPrefix(ph, "airlock-secret-") {
		t.Fatalf("guest $%s = %q after add-secret, want a placeholder", name, ph)
	}
	curl := `curl -sS -m 20 https://api.test:` + port + `/v1 -H "Authorization: Bearer $` + name + `"`
	if r := e.run(t, nil, "exec", id, "--", "sh", "-c", curl); r.code != 0 {
		t.Fatalf("curl after add-secret: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if got := seenNow(); len(got) != 1 || got[0] != "Bearer "+value {
		t.Fatalf("upstream saw %q, want the vault's value injected", got)
	}

	// Across a pause: the resumed sandbox injects the live-added secret
	// again, its sealed values having been rewritten, and the saved state
	// holds no value. The knobs (DNS, dial map) go to the process that
	// resumes it.
	if r := e.runWith(t, extra, nil, "pause", id); r.code != 0 {
		t.Fatalf("pause: %s", r.stderr)
	}
	if p := fileContaining(t, e.state, []byte(value)); p != "" {
		t.Errorf("after the pause, state dir file %s holds the secret value", p)
	}
	if r := e.runWith(t, extra, nil, "exec", id, "--", "sh", "-c", curl); r.code != 0 {
		t.Fatalf("curl after the resume: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if got := seenNow(); len(got) != 2 || got[1] != "Bearer "+value {
		t.Fatalf("upstream saw %q after the resume, want the value injected", got)
	}
	mu.Lock()
	seen = seen[:1]
	mu.Unlock()

	out = e.must(t, "network", "rm-secret", id, name)
	if !strings.Contains(out, "removed "+name) {
		t.Fatalf("rm-secret: %q", out)
	}
	if v := e.must(t, "exec", id, "--", "sh", "-c", "printf %s \"${"+name+":-unset}\""); v != "unset" {
		t.Fatalf("guest $%s = %q after rm-secret, want unset", name, v)
	}
	// The interception CA is gone from the guest too: -k reaches the test's
	// server directly, with the placeholder as sent.
	r = e.run(t, nil, "exec", id, "--", "sh", "-c", `curl -ksS -m 20 https://api.test:`+port+`/v1 -H "Authorization: Bearer `+ph+`"`)
	if r.code != 0 {
		t.Fatalf("curl after rm-secret: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if got := seenNow(); len(got) != 2 || got[1] != "Bearer "+ph {
		t.Fatalf("upstream saw %q after the removal, want the placeholder (no injection)", got)
	}

	evs := e.must(t, "events", "--sandbox", id)
	for _, want := range []string{"sandbox.secret.set", "sandbox.secret.rm", "net.secret.inject"} {
		if !strings.Contains(evs, want) {
			t.Errorf("events lack %s", want)
		}
	}
	if strings.Contains(evs, value) {
		t.Error("the events hold the secret value")
	}
	if p := fileContaining(t, e.state, []byte(value)); p != "" {
		t.Errorf("state dir file %s holds the secret value in clear", p)
	}
}
