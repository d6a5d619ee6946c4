package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/hostcg"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// cgRead reads a cgroup file of controller ctrl (v1) at cgroup path rel;
// on v2 the v2 name is used.
func cgRead(t *testing.T, ctrl, rel, v1, v2 string) string {
	t.Helper()
	p := path.Join("/sys/fs/cgroup", ctrl, rel, v1)
	if hostcg.Version() == "v2" {
		p = path.Join("/sys/fs/cgroup", rel, v2)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// cgroupsOf returns pid's cgroup path per controller ("" for v2's).
func cgroupsOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	cgs, err := hostcg.Of(strconv.Itoa(pid))
	if err != nil {
		t.Fatal(err)
	}
	return cgs
}

// envelopeCPU is the CPU time the envelope rel has used.
func envelopeCPU(t *testing.T, rel string) time.Duration {
	t.Helper()
	if hostcg.Version() == "v2" {
		for line := range strings.SplitSeq(cgRead(t, "", rel, "", "cpu.stat"), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(n) * time.Microsecond
			}
		}
		t.Fatal("no usage_usec in cpu.stat")
	}
	n, err := strconv.ParseInt(cgRead(t, "cpuacct", rel, "cpuacct.usage", ""), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(n)
}

// TestThreat088HostEnvelope: a sandbox's shim and its VMM (qemu) or sentry
// (gVisor) run in the sandbox's host cgroup, /airlock/<id>, whose memory
// and pids limits come from its size, in no CPU group of airlock's (see
// internal/hostcg); a guest burning 4 processes on 1 vCPU uses at most
// about one core of the host (its vCPU thread, or runsc's quota), counted
// in its envelope; the envelope goes with the sandbox; --host-cgroups off
// makes none.
func TestThreat088HostEnvelope(t *testing.T) {
	e := setup(t)
	if err := hostcg.Check(); err != nil {
		t.Fatalf("the vm tier needs writable memory and pids cgroups on the host: %v", err)
	}
	id := e.create(t, "--cpus", "1", "--memory", "256M")
	rel := path.Join(hostcg.DefaultParent, id)

	// Placement: the shim in the shim leaf, every process of the sandbox
	// (VMM, or runsc's sandbox and gofer) below the envelope; on v1 the
	// shim is in no CPU group of airlock's.
	ctrls := []string{"memory", "pids"}
	if hostcg.Version() == "v2" {
		ctrls = []string{""}
	}
	shim := shimPID(t, e, id)
	for _, c := range ctrls {
		if got := cgroupsOf(t, shim)[c]; got != rel+"/shim" {
			t.Errorf("shim %d is in %s cgroup %q, want %s/shim", shim, c, got, rel)
		}
	}
	if hostcg.Version() == "v1" {
		if got := cgroupsOf(t, shim)["cpu"]; strings.HasPrefix(got, hostcg.DefaultParent) {
			t.Errorf("shim %d is in cpu cgroup %q: the envelope must not group CPU", shim, got)
		}
	}
	var inside int
	for _, pid := range processesMentioning(id) {
		if pid == shim {
			continue
		}
		for _, c := range ctrls {
			if got := cgroupsOf(t, pid)[c]; !strings.HasPrefix(got, rel+"/") {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				t.Errorf("process %d (%s) is in %s cgroup %q, outside %s", pid, strings.ReplaceAll(string(b), "\x00", " "), c, got, rel)
			}
		}
		inside++
	}
	if inside == 0 {
		t.Fatal("found no VMM or sentry process of the sandbox")
	}

	// Limits from the size.
	want := hostcg.For(256)
	if got := cgRead(t, "memory", rel, "memory.limit_in_bytes", "memory.max"); got != strconv.FormatInt(want.MemoryBytes, 10) {
		t.Errorf("memory limit %s, want %d", got, want.MemoryBytes)
	}
	if got := cgRead(t, "pids", rel, "pids.max", "pids.max"); got != strconv.FormatInt(want.Pids, 10) {
		t.Errorf("pids.max %s, want %d", got, want.Pids)
	}

	// A guest burning 4 processes for 3 s on its 1 vCPU: the host gives
	// it about one core (its vCPU thread, or runsc's quota), plus its I/O
	// threads and shim, counted in the envelope where cpuacct is per
	// envelope (v1 with cpuacct apart, v2).
	counted := hostcg.Version() == "v2" || cgroupsOf(t, shim)["cpuacct"] == rel+"/shim"
	var before time.Duration
	if counted {
		before = envelopeCPU(t, rel)
	}
	t0 := time.Now()
	e.must(t, "exec", id, "--", "sh", "-c", "for i in 1 2 3 4; do (end=$(($(date +%s)+3)); while [ $(date +%s) -lt $end ]; do :; done) & done; wait")
	wall := time.Since(t0)
	if counted {
		used := envelopeCPU(t, rel) - before
		t.Logf("4 burning guest processes on 1 vCPU for %v used %v of host CPU", wall.Round(time.Millisecond), used.Round(time.Millisecond))
		if used < time.Second {
			t.Fatalf("the envelope counted only %v of CPU for 3 s of burning: the sandbox's processes are not in it", used)
		}
		if limit := wall * 3 / 2; used > limit {
			t.Fatalf("1 vCPU used %v of host CPU in %v (more than 1.5 cores)", used, wall)
		}
	}

	// Gone with the sandbox.
	e.must(t, "rm", id)
	for _, c := range ctrls {
		if _, err := os.Stat(path.Join("/sys/fs/cgroup", c, rel)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s cgroup %s outlived its sandbox (%v)", c, rel, err)
		}
	}

	// --host-cgroups off: no envelope.
	off := strings.TrimSpace(e.must(t, "--host-cgroups", "off", "create", "--memory", "256M"))
	t.Cleanup(func() { e.run(t, nil, "rm", off) })
	if got := cgroupsOf(t, shimPID(t, e, off))[ctrls[len(ctrls)-1]]; strings.HasPrefix(got, hostcg.DefaultParent+"/") {
		t.Errorf("--host-cgroups off: the shim is in %s", got)
	}
	if _, err := os.Stat(path.Join("/sys/fs/cgroup", ctrls[0], hostcg.DefaultParent, off)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("--host-cgroups off made an envelope (%v)", err)
	}
}

// TestThreat088HostOOMIsReported: when the host's OOM killer ends a
// sandbox's VMM at its envelope's memory limit, the sandbox fails saying
// "out of memory" and the audit trail's sandbox.fail event says
// oom_killed; under gVisor it ends the guest process's stub instead, and
// the exec says out of memory. The test plays a host administrator who lowers the
// envelope's limit to just above what the sandbox uses now, then has the
// guest touch 300 MiB.
func TestThreat088HostOOMIsReported(t *testing.T) {
	e := setup(t)
	if err := hostcg.Check(); err != nil {
		t.Fatalf("the vm tier needs writable memory and pids cgroups on the host: %v", err)
	}
	id := e.create(t, "--memory", "512M")
	rel := path.Join(hostcg.DefaultParent, id)
	used, err := strconv.ParseInt(cgRead(t, "memory", rel, "memory.usage_in_bytes", "memory.current"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	limit := used + 64<<20
	file := path.Join("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes")
	if hostcg.Version() == "v2" {
		file = path.Join("/sys/fs/cgroup", rel, "memory.max")
	}
	if err := os.WriteFile(file, []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		t.Fatal(err)
	}
	r := e.run(t, nil, "exec", id, "--", "python3", "-c", "b = bytearray(300 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived')")
	if strings.Contains(r.stdout, "survived") {
		t.Fatalf("the guest touched 300 MiB under a host envelope of %d MiB and the VMM lived", limit>>20)
	}
	if onGVisor() {
		// Under gVisor each guest address space is a systrap stub process
		// in the envelope, raised to the host OOM killer's first choice
		// (runtime/gvisor raiseStubs): the host ends the balloon's stub,
		// not the sentry, so the exec is the one out of memory and the
		// sandbox lives on (a QEMU guest's memory is the VMM's: there the
		// VMM is the only victim, below).
		if r.code != 137 || !strings.Contains(r.stderr, "airlock: out of memory") {
			t.Fatalf("gvisor: exec under the host's OOM: exit %d stderr %q, want 137 and out of memory", r.code, tail(r.stderr, 500))
		}
		if got := e.must(t, "exec", id, "--", "echo", "alive"); got != "alive\n" {
			t.Fatalf("gvisor: the sandbox did not answer after its process was OOM-killed: %q", got)
		}
		return
	}
	var info struct{ State, Reason string }
	testutil.WaitFor(t, 30*time.Second, func() bool {
		_ = json.Unmarshal([]byte(e.must(t, "inspect", id)), &info)
		return info.State == "failed"
	})
	if info.State != "failed" || !strings.HasPrefix(info.Reason, "out of memory: the host killed") {
		t.Fatalf("after the host OOM kill: %+v (exec: exit %d, %s)", info, r.code, tail(r.stderr, 500))
	}
	type event struct {
		Action string         `json:"action"`
		Detail map[string]any `json:"detail"`
	}
	var evs []event
	out := e.must(t, "events", "--sandbox", id, "--type", "sandbox.fail")
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		var ev event
		if json.Unmarshal([]byte(line), &ev) == nil {
			evs = append(evs, ev)
		}
	}
	if len(evs) != 1 || evs[0].Detail["oom_killed"] != true {
		t.Fatalf("sandbox.fail events: %+v (raw %q)", evs, out)
	}
}
