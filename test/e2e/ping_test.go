package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// pingScript sends one ICMP echo request to each address given and prints
// "ADDR reply" or "ADDR none" (no reply in 3 s). The base image has no ping
// binary: an unprivileged ICMP socket where the guest kernel allows one
// (gVisor), else a raw socket (the qemu guest's root; its
// ping_group_range is the kernel's default, which allows no group).
const pingScript = `
import os, socket, struct, sys, time
def csum(b):
    if len(b) % 2: b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
for i, dst in enumerate(sys.argv[1:]):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP); raw = False
    except OSError:
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); raw = True
    s.settimeout(0.5)
    data = b"airlock-e2e-ping"
    hdr = struct.pack("!BBHHH", 8, 0, 0, 0x4a4a, i + 1)
    s.sendto(struct.pack("!BBHHH", 8, 0, csum(hdr + data), 0x4a4a, i + 1) + data, (dst, 0))
    got, end = "none", time.time() + 3
    while time.time() < end:
        try:
            b, a = s.recvfrom(2048)
        except socket.timeout:
            continue
        if raw: b = b[(b[0] & 15) * 4:]
        if a[0] == dst and b[0] == 0 and struct.unpack("!H", b[6:8])[0] == i + 1 and b[8:] == data:
            got = "reply"; break
    print(dst, got, flush=True)
`

// TestPingAllowedDestination: a guest ping to an address the policy allows
// gets the real echo reply (the shim pings, here 127.0.0.1 through the
// dial-map test hook: nothing leaves the machine); one to an address it
// denies, and one into the floor, get nothing; each is in the audit trail
// as proto icmp.
func TestPingAllowedDestination(t *testing.T) {
	e := setup(t)
	r := e.runWith(t, []string{"AIRLOCK_TEST_DIAL_MAP=" + pubA + "=127.0.0.1"}, nil, "create", "--net", "deny", "--allow", pubA)
	if r.code != 0 {
		t.Fatalf("create: %s", r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	out := e.must(t, "exec", id, "--", "python3", "-c", pingScript, pubA, pubB, "10.0.2.2")
	for _, want := range []string{pubA + " reply", pubB + " none", "10.0.2.2 none"} {
		if !strings.Contains(out, want) {
			t.Fatalf("guest pings: %q, want %q", out, want)
		}
	}
	var evs []event
	testutil.WaitFor(t, 30*time.Second, func() bool {
		evs = events(t, e, id)
		return hasICMP(evs, "net.allow", pubA) && hasICMP(evs, "net.deny", pubB) && hasICMP(evs, "net.deny", "10.0.2.2")
	})
	if !hasICMP(evs, "net.allow", pubA) || !hasICMP(evs, "net.deny", pubB) || !hasICMP(evs, "net.deny", "10.0.2.2") {
		t.Fatalf("icmp events:\n%s", dumpEvents(evs))
	}
}

func hasICMP(evs []event, action, dst string) bool {
	for _, ev := range evs {
		if ev.Action == action && ev.Detail["proto"] == "icmp" && ev.Detail["dst"] == dst {
			return true
		}
	}
	return false
}
