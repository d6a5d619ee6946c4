package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// envelopeProbe runs as root inside an exec with --pids-limit 20: every
// attempt to leave the exec's cgroup envelope prints ESCAPED:<what>, every
// refusal held:<what>; then it starts 100 sleeps, reports how many started, and kills every process
// it can (kill -9 -1).
const envelopeProbe = `
echo uid=$(id -u)
echo cgroup=$(cat /proc/self/cgroup)
t() { name=$1; shift; if "$@" 2>/dev/null; then echo ESCAPED:$name; else echo held:$name; fi; }
t procs sh -c 'echo $$ > /sys/fs/cgroup/cgroup.procs'
t rootprocs sh -c 'echo $$ > /proc/1/root/sys/fs/cgroup/cgroup.procs'
t sibling mkdir /sys/fs/cgroup/sibling
t pidsmax sh -c 'echo max > /sys/fs/cgroup/pids.max'
t remount mount -o remount,rw /sys/fs/cgroup
t mountcg mount -t cgroup2 none /mnt
t nsenter nsenter -t 1 -C -m true
t unshare unshare --cgroup --mount true
t sysctl sh -c 'v=$(cat /proc/sys/vm/overcommit_ratio); echo $v > /proc/sys/vm/overcommit_ratio'
t sysrq sh -c 'test -e /proc/sysrq-trigger || exit 1; echo h > /proc/sysrq-trigger'
grep -E '^Cap(Eff|Bnd)' /proc/self/status
python3 -c '
import subprocess
n = 0
for i in range(100):
    try:
        subprocess.Popen(["sleep", "60"])
        n += 1
    except OSError:
        pass
print("sleeps=%d" % n)'
kill -9 -1
echo END
`

// TestThreat018GuestRootStaysInItsExec: root in an exec cannot leave its
// exec cgroup (writing its pid to the root cgroup.procs, directly or
// through /proc/1/root, creating a sibling cgroup, raising its pids.max,
// remounting or mounting cgroupfs, entering PID 1's namespaces or unsharing
// new ones all fail), so --pids-limit 20 holds against 100 starts; kill -9
// -1 does not take the agent down, and the next exec runs. A root exec
// still does what root in a sandbox is for: write /etc, chown, bind a port
// below 1024.
func TestThreat018GuestRootStaysInItsExec(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	r := e.run(t, nil, "exec", "--pids-limit", "20", id, "--", "sh", "-c", envelopeProbe)
	out := r.stdout
	if !strings.Contains(out, "uid=0\n") || !strings.Contains(out, "END") {
		t.Fatalf("the probe did not run as root to its end: exit %d\nstdout: %s\nstderr: %s", r.code, out, tail(r.stderr, 2000))
	}
	t.Logf("probe output:\n%s", out)
	for _, what := range []string{"procs", "rootprocs", "sibling", "pidsmax", "remount", "mountcg", "nsenter", "unshare", "sysctl", "sysrq"} {
		if !strings.Contains(out, "held:"+what+"\n") {
			t.Errorf("%s: not refused (ESCAPED or not run)", what)
		}
	}
	if !strings.Contains(out, "cgroup=0::/\n") {
		t.Errorf("the exec sees more than its own cgroup: %q", out)
	}
	var sleeps int
	for line := range strings.SplitSeq(out, "\n") {
		if v, ok := strings.CutPrefix(line, "sleeps="); ok {
			sleeps, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	// The shell, python and the sleeps share 20 tasks.
	if sleeps == 0 || sleeps >= 20 {
		t.Errorf("%d sleeps ran under --pids-limit 20 (want between 1 and 19)", sleeps)
	}
	if got := e.must(t, "exec", id, "--", "echo", "alive"); got != "alive\n" {
		t.Fatalf("the agent did not answer after the attack: %q", got)
	}
	// The exec is forked into its cgroup as one task, so even a limit of
	// one task lets it start.
	if got := e.must(t, "exec", "--pids-limit", "1", id, "--", "echo", "one"); got != "one\n" {
		t.Fatalf("--pids-limit 1: %q", got)
	}
	root := e.must(t, "exec", id, "--", "sh", "-c",
		"echo x > /etc/airlock-probe && chown 1000:1000 /etc/airlock-probe && stat -c %u /etc/airlock-probe && "+
			"python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 80)); print(\"bound\")'")
	if root != "1000\nbound\n" {
		t.Fatalf("root in an exec cannot do what root is for: %q", root)
	}
}

// TestExecCgroupGoesWithItsLastProcess: an exec whose background child
// outlives it keeps its cgroup until that child ends; then the agent
// removes it, told by the kernel (a change of the cgroup's cgroup.events)
// where the guest kernel reports it, else by a sweep every 5 s while
// released cgroups remain. An idle guest polls for neither.
func TestExecCgroupGoesWithItsLastProcess(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	// The newest exec cgroup is this exec's own (nothing else runs); its
	// child outlives it by 10 s.
	cg := strings.TrimSpace(e.must(t, "exec", id, "--", "sh", "-c",
		`ls -d /sys/fs/cgroup/airlock/exec-* | sort -t- -k2 -n | tail -1; setsid sleep 10 </dev/null >/dev/null 2>&1 &`))
	if !strings.HasPrefix(cg, "/sys/fs/cgroup/airlock/exec-") {
		t.Fatalf("no exec cgroup found: %q", cg)
	}
	if r := e.run(t, nil, "exec", id, "--", "test", "-d", cg); r.code != 0 {
		t.Fatalf("%s is gone while its background child still runs (exit %d): %s", cg, r.code, r.stderr)
	}
	if !testutil.WaitFor(t, time.Minute, func() bool {
		return e.run(t, nil, "exec", id, "--", "test", "-d", cg).code == 1
	}) {
		t.Fatalf("%s was not removed after its last process ended", cg)
	}
}
