package e2e

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// holdListener accepts TCP connections, greets each and keeps it open,
// echoing what it reads, until the peer closes it. It counts the
// connections accepted and those still open.
type holdListener struct {
	port int
	mu   sync.Mutex
	seen int
	open int
}

func listenHold(t *testing.T) *holdListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &holdListener{port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.seen++
			l.open++
			l.mu.Unlock()
			go func() {
				defer func() {
					c.Close()
					l.mu.Lock()
					l.open--
					l.mu.Unlock()
				}()
				_, _ = c.Write([]byte("hello from the host\n"))
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := c.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l
}

func (l *holdListener) counts() (seen, open int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen, l.open
}

// holdScript connects to argv[1]:argv[2], reads the greeting, prints
// "connected", then waits for the connection to end and prints "closed"
// (or "still-open" after 120 s).
const holdScript = `
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.recv(100)
print("connected", flush=True)
s.settimeout(120)
try:
    b = s.recv(100)
    print("closed" if not b else "data", flush=True)
except socket.timeout:
    print("still-open", flush=True)
except OSError as ex:
    print("closed", type(ex).__name__, flush=True)
`

// TestLivePolicyChanges: a running sandbox in deny mode cannot reach a host
// until `network set` allows it, then can; a change that drops the rule
// closes the guest's live connection to it at once (a net.deny event
// that says the policy changed); each change is a sandbox.network event
// with the old and new policy.
func TestLivePolicyChanges(t *testing.T) {
	e := setup(t)
	l := listenHold(t)
	dns := testutil.StartDNS(t, map[string][]string{"live.test": {pubA}})
	extra := []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1", "AIRLOCK_DNS=" + dns.Addr}
	r := e.runWith(t, extra, nil, "create", "--net", "deny")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	port := strconv.Itoa(l.port)

	res := runProbes(t, e, id, []string{"before live.test " + port, "before-raw " + pubA + " " + port})
	if res["before"].ok || res["before-raw"].ok {
		t.Fatalf("deny mode without rules reached the host: %+v", res)
	}

	out := e.must(t, "network", "set", id, "--allow", "live.test")
	if !strings.Contains(out, "egress deny, allow live.test; in force now") {
		t.Fatalf("network set: %q", out)
	}
	if got := e.must(t, "network", "get", "--json", id); !strings.Contains(got, `"live.test"`) {
		t.Fatalf("network get: %s", got)
	}
	res = runProbes(t, e, id, []string{"after live.test " + port})
	if !res["after"].ok {
		t.Fatalf("after the rule: %s", res["after"].detail)
	}

	// A live connection, then the rule removed.
	done := make(chan result, 1)
	go func() {
		done <- e.run(t, nil, "exec", id, "--", "python3", "-c", holdScript, "live.test", port)
	}()
	if !testutil.WaitFor(t, 2*time.Minute, func() bool { _, open := l.counts(); return open == 1 }) {
		t.Fatal("the guest's connection never reached the host")
	}
	start := time.Now()
	out = e.must(t, "network", "set", id, "--net", "deny")
	if !strings.Contains(out, "1 open connection closed") {
		t.Fatalf("network set --net deny: %q", out)
	}
	var got result
	select {
	case got = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the guest's connection was not closed")
	}
	if !strings.Contains(got.stdout, "connected") || !strings.Contains(got.stdout, "closed") {
		t.Fatalf("hold script: exit %d %q %q", got.code, got.stdout, got.stderr)
	}
	t.Logf("the guest saw its connection closed %v after network set returned", time.Since(start).Round(time.Millisecond))
	if !testutil.WaitFor(t, 30*time.Second, func() bool { _, open := l.counts(); return open == 0 }) {
		t.Error("the host side of the closed connection is still open")
	}
	res = runProbes(t, e, id, []string{"removed live.test " + port})
	if res["removed"].ok {
		t.Fatal("the host is reachable after its rule was removed")
	}

	var closes, changes int
	var evs []event
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		evs = events(t, e, id)
		closes, changes = 0, 0
		for _, ev := range evs {
			reason, _ := ev.Detail["reason"].(string)
			switch {
			case ev.Action == "net.deny" && strings.HasPrefix(reason, "closed by a policy change"):
				closes++
			case ev.Action == "sandbox.network" && ev.Detail["old"] != nil && ev.Detail["new"] != nil:
				changes++
			}
		}
		return closes == 1 && changes == 2
	}) {
		t.Fatalf("%d policy-change closes and %d sandbox.network events, want 1 and 2:\n%s", closes, changes, dumpEvents(evs))
	}
}

// TestPauseResumeLivePolicy (qemu: gvisor sandboxes cannot pause): a
// paused sandbox's policy change is stored without resuming it, and the
// resumed sandbox enforces it from its first packet.
func TestPauseResumeLivePolicy(t *testing.T) {
	e := setup(t)
	l := listenHold(t)
	dns := testutil.StartDNS(t, map[string][]string{"live.test": {pubA}})
	// The knobs go to every process that starts the sandbox's shim: the
	// create and the resume.
	extra := []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1", "AIRLOCK_DNS=" + dns.Addr}
	r := e.runWith(t, extra, nil, "create", "--net", "deny")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	port := strconv.Itoa(l.port)

	e.must(t, "pause", id)
	out := e.must(t, "network", "set", id, "--allow", "live.test")
	if !strings.Contains(out, "applies when it resumes") {
		t.Fatalf("network set while paused: %q", out)
	}
	if got := e.must(t, "inspect", id); !strings.Contains(got, `"state": "paused"`) {
		t.Fatalf("the change resumed the sandbox: %s", got)
	}
	if r := e.runWith(t, extra, nil, "resume", id); r.code != 0 {
		t.Fatalf("resume: %s", r.stderr)
	}
	res := runProbes(t, e, id, []string{"resumed live.test " + port})
	if !res["resumed"].ok {
		t.Fatalf("the resumed sandbox does not enforce the stored policy: %s", res["resumed"].detail)
	}
	var applied string
	for _, ev := range events(t, e, id) {
		if ev.Action == "sandbox.network" {
			applied, _ = ev.Detail["applied"].(string)
		}
	}
	if applied != "resume" {
		t.Fatalf("sandbox.network applied %q, want resume", applied)
	}
}
