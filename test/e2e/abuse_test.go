package e2e

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// scanScript connects to every "host port" line of stdin in turn and
// prints one JSON summary: connections made, refused, and the slowest
// refusal.
const scanScript = `
import json, socket, sys, time
ok = refused = other = 0
slowest = 0.0
for line in sys.stdin.read().split("\n"):
    if not line.strip():
        continue
    host, port = line.split()
    t = time.time()
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, int(port)))
        ok += 1
    except ConnectionRefusedError:
        refused += 1
        slowest = max(slowest, time.time() - t)
    except Exception:
        other += 1
    finally:
        s.close()
print(json.dumps({"ok": ok, "refused": refused, "other": other, "slowest": slowest}))
`

// TestThreat098OutboundAbuseThrottled: a guest scanning 1,000 ports of a
// host it may reach (mode public; the test's own listeners behind a
// public-looking address) gets through to at most the default number of
// distinct destinations per minute; the rest are reset at once and leave a
// few aggregated net.limit events, not one per attempt. Mail ports are
// refused in mode public before anything is dialled.
func TestThreat098OutboundAbuseThrottled(t *testing.T) {
	e := setup(t)
	const ports = 1000
	var accepted atomic.Int64
	var targets []string
	for range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		targets = append(targets, pubA+" "+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	dns := testutil.StartDNS(t, nil)
	extra := []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1", "AIRLOCK_DNS=" + dns.Addr}
	r := e.runWith(t, extra, nil, "create")
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })

	// SMTP: refused by the policy, at once, nothing dialled.
	mail := runProbes(t, e, id, []string{"smtp " + pubA + " 25", "smtps " + pubA + " 465", "submission " + pubA + " 587"})
	for _, label := range []string{"smtp", "smtps", "submission"} {
		if p, ok := mail[label]; !ok || p.ok || p.seconds > 1 || !strings.Contains(p.detail, "Refused") {
			t.Errorf("%s: %+v, want refused at once", label, p)
		}
	}

	start := time.Now()
	res := e.run(t, strings.NewReader(strings.Join(targets, "\n")+"\n"), "exec", "-i", id, "--", "python3", "-c", scanScript)
	took := time.Since(start)
	if res.code != 0 {
		t.Fatalf("scan: exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	var scan struct {
		OK, Refused, Other int
		Slowest            float64
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.stdout)), &scan); err != nil {
		t.Fatalf("scan output %q: %v", res.stdout, err)
	}
	t.Logf("scan of %d ports in %v: %+v; listeners accepted %d", ports, took, scan, accepted.Load())
	limit := netconf.DefaultDestsPerMin
	if took < time.Minute && (scan.OK > limit || accepted.Load() > int64(limit)) {
		t.Errorf("%d connections got through (listeners: %d), want at most %d distinct destinations in a minute", scan.OK, accepted.Load(), limit)
	}
	if scan.OK+scan.Refused+scan.Other != ports || scan.Refused < ports-limit || scan.Other != 0 {
		t.Errorf("scan %+v: want at least %d refused, none timed out", scan, ports-limit)
	}
	if scan.Slowest > 1 {
		t.Errorf("slowest refusal %.2fs: over the limit must be a reset, not a timeout", scan.Slowest)
	}

	// The refusals are folded into net.limit events (one per limit and
	// 10 s window), whose counts add up to them.
	var limits []event
	testutil.WaitFor(t, 60*time.Second, func() bool {
		limits = limits[:0]
		var n uint64
		for _, ev := range events(t, e, id) {
			if ev.Action == "net.limit" {
				limits = append(limits, ev)
				c, _ := ev.Detail["count"].(float64)
				n += uint64(c)
			}
		}
		return n >= uint64(scan.Refused)
	})
	if len(limits) == 0 || len(limits) > 6 {
		t.Errorf("%d net.limit events for %d refusals, want a few:\n%s", len(limits), scan.Refused, dumpEvents(limits))
	}
	for _, ev := range limits {
		rule, _ := ev.Detail["rule"].(string)
		samples, _ := ev.Detail["samples"].([]any)
		if (rule != "limit:dests" && rule != "limit:conn_rate") || ev.Detail["aggregated"] != true || len(samples) == 0 || len(samples) > 5 {
			t.Errorf("net.limit event %+v", ev)
		}
	}
	evs := events(t, e, id)
	for _, p := range []string{"25", "465", "587"} {
		found := false
		for _, ev := range evs {
			found = found || ev.Action == "net.deny" && ev.Detail["rule"] == "mail:closed" && ev.Detail["dst"] == pubA+":"+p
		}
		if !found {
			t.Errorf("no mail:closed denial for port %s:\n%s", p, dumpEvents(evs))
		}
	}
}
