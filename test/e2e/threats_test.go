package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestThreat019GuestLearnsNothingAboutHost: what the guest can read of
// its own system (hostname, kernel command line, environment, mounts,
// DMI/CPU strings) holds nothing that names the host: not its hostname,
// not the state dir or any host path of airlock, not a variable of the
// host's environment.
func TestThreat019GuestLearnsNothingAboutHost(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	out := e.must(t, "exec", id, "--", "sh", "-c",
		"echo HOSTNAME=$(hostname); cat /proc/cmdline; env; cat /proc/mounts; "+
			"cat /sys/class/dmi/id/* 2>/dev/null; grep -m1 'model name' /proc/cpuinfo; echo END")
	if !strings.Contains(out, "HOSTNAME=") || !strings.HasSuffix(strings.TrimSpace(out), "END") {
		t.Fatalf("the probe did not run: %q", out)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	bin, _ := filepath.Abs(e.bin)
	needles := []string{"HOSTNAME=" + host + "\n", e.state, filepath.Dir(bin)}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		// Values long and specific enough to mean something if seen.
		if len(v) >= 12 && !slices.Contains([]string{"PATH", "LANG", "TERM", "SHELL", "HOME", "PWD", "OLDPWD", "_"}, k) {
			needles = append(needles, v)
		}
	}
	for _, n := range needles {
		if n != "" && strings.Contains(out, n) {
			t.Errorf("the guest sees %q from the host", n)
		}
	}
}

// TestThreat003NoLeakedHostDescriptors: the VMM (or gVisor's sentry and
// gofer) holds no descriptor of the host's control plane: not the catalog,
// not a shim lock or socket, not another sandbox's files, not the API's
// listener. Read on the host, from /proc/<pid>/fd, for every process of
// the sandbox but its shim.
func TestThreat003NoLeakedHostDescriptors(t *testing.T) {
	e := setup(t)
	a, b := e.create(t), e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", a, b) })
	shim := shimPID(t, e, a)
	var checked int
	for _, pid := range processesMentioning(a) {
		if pid == shim {
			continue
		}
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // exited meanwhile
		}
		checked++
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(dir, fd.Name()))
			if err != nil {
				continue
			}
			bad := strings.Contains(target, "catalog.db") || strings.HasSuffix(target, "shim.lock") ||
				strings.HasSuffix(target, "shim.sock") || strings.Contains(target, b)
			if bad {
				cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
				t.Errorf("pid %d (%.60q) holds %s", pid, cmd, target)
			}
		}
	}
	if checked == 0 {
		t.Fatalf("no VMM process of sandbox %s found to check", a)
	}
}
