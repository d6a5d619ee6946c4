package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
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

// TestThreat017AuditFloodIsBounded: a guest sending UDP to distinct
// private addresses as fast as it can (every packet a new flow, every
// flow a net.deny decision) for 60 s grows the host catalog by less than
// 1 MiB, and the flood is in the audit trail as folded rows with counts
// that add up to what the host decided, not as silence. Measured on the
// host: the catalog's used pages (page_count - freelist_count) and its
// file after a checkpoint, before and after.
func TestThreat017AuditFloodIsBounded(t *testing.T) {
	e := setup(t)
	secs := 60
	if s, err := strconv.Atoi(os.Getenv("AIRLOCK_TEST_FLOOD_SECONDS")); err == nil && s > 0 {
		secs = s // shorter for a quick local run; make test uses 60
	}
	ctx := t.Context()
	catalog := filepath.Join(e.state, "catalog.db")
	st, err := store.Open(ctx, catalog)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	size := func() (used, file int64) {
		t.Helper()
		if used, err = st.UsedBytes(ctx); err != nil {
			t.Fatal(err)
		}
		if err := st.Checkpoint(ctx); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(catalog)
		if err != nil {
			t.Fatal(err)
		}
		return used, fi.Size()
	}
	id := e.create(t, "--net", "deny")
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	used0, file0 := size()
	script := fmt.Sprintf(`
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
n, ok, end = 0, 0, time.time() + %d
while time.time() < end:
    for _ in range(200):
        try:
            s.sendto(b"x", ("10.%%d.%%d.%%d" %% (n >> 16 & 255, n >> 8 & 255, n & 255), 9))
            ok += 1
        except OSError:
            pass  # the guest kernel refused it (a full queue): not sent
        n += 1
print("SENT", ok, "REFUSED", n - ok)
`, secs)
	out := e.must(t, "exec", id, "--", "python3", "-c", script)
	var sent, refused int
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "SENT %d REFUSED %d", &sent, &refused); err != nil || sent < 1000 {
		t.Fatalf("the flood did not run: %q", out)
	}
	e.must(t, "rm", id) // the shim writes its last folded rows as it stops
	used1, file1 := size()
	evs := events(t, e, id)
	var singles, folded, dropped, busy, rows int
	for _, ev := range evs {
		switch {
		case ev.Action == "net.audit.dropped":
			dropped += int(ev.Detail["count"].(float64))
		case ev.Action == "net.busy" && ev.Detail["aggregated"] == true:
			busy += int(ev.Detail["count"].(float64)) // flows the host dropped at its dial caps
		case ev.Action == "net.busy":
			busy++
		case ev.Action == "net.deny" && ev.Detail["aggregated"] == true:
			folded += int(ev.Detail["count"].(float64))
			rows++
		case ev.Action == "net.deny":
			singles++
		}
	}
	t.Logf("%d s flood: guest sent %d packets (its kernel refused %d more); host recorded %d single net.deny rows, %d folded rows counting %d, %d counted as dropped, %d dropped at the dial caps (net.busy); catalog used %+d bytes, file %+d bytes",
		secs, sent, refused, singles, rows, folded, dropped, busy, used1-used0, file1-file0)
	if rows == 0 || folded == 0 {
		t.Fatalf("the flood is not in the audit trail as folded rows:\n%s", tail(dumpEvents(evs), 3000))
	}
	// Every packet to a new address is a new flow, decided (net.deny) or
	// dropped at the host's dial caps (net.busy); the guest's link may shed
	// some before the host sees them, but most must be counted.
	if got := singles + folded + dropped + busy; got < sent/2 {
		t.Errorf("the audit trail counts %d decisions and drops for %d packets sent", got, sent)
	}
	if used1-used0 >= 1<<20 || file1-file0 >= 1<<20 {
		t.Errorf("the catalog grew by %d bytes used, %d bytes on disk in a %d s flood (bound: 1 MiB)", used1-used0, file1-file0, secs)
	}
}

// TestThreat004NoNestedVirtualization: the guest CPU has no SVM or VMX
// (QEMU's qemu64 model advertises SVM, which TCG emulates; with KVM the
// host CPU is passed without them) and no KVM device can be opened, even
// by guest root making the device node itself.
func TestThreat004NoNestedVirtualization(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	out := e.must(t, "exec", id, "--", "python3", "-c", `
import os
flags = [l for l in open("/proc/cpuinfo") if l.startswith("flags")][0].split()
print("FLAGS", len(flags), " ".join(f for f in flags if f in ("vmx", "svm")) or "none")
try:
    os.mknod("/tmp/kvm", 0o600 | 0o020000, os.makedev(10, 232))
    os.open("/tmp/kvm", os.O_RDWR)
    print("KVM opened")
except OSError as err:
    print("KVM refused:", err.strerror)
`)
	var n int
	if _, err := fmt.Sscanf(out, "FLAGS %d", &n); err != nil || n < 5 {
		t.Fatalf("the probe did not read the guest's CPU flags: %q", out)
	}
	if !strings.Contains(out, " none\n") {
		t.Errorf("the guest CPU offers virtualization: %q", out)
	}
	if !strings.Contains(out, "KVM refused:") {
		t.Errorf("guest root opened a KVM device: %q", out)
	}
}

// TestThreat093LargeStdin: 64 MiB on an exec's stdin arrive whole and in
// order (the guest's sha256 is the host's), the shim streams them instead
// of holding them (its peak RSS grows by well under the input), and the
// agent answers the next exec.
func TestThreat093LargeStdin(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	data := make([]byte, 64<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%x", sha256.Sum256(data))
	shim := shimPID(t, e, id)
	hwm0 := peakRSSKiB(t, shim)
	r := e.run(t, bytes.NewReader(data), "exec", "-i", id, "--", "sha256sum")
	if r.code != 0 || !strings.HasPrefix(r.stdout, want) {
		t.Fatalf("exec with 64 MiB of stdin: exit %d, %q (want %s); stderr %s", r.code, r.stdout, want, r.stderr)
	}
	grew := peakRSSKiB(t, shim) - hwm0
	t.Logf("the shim's peak RSS grew by %d KiB for 64 MiB of stdin", grew)
	if grew > 24<<10 {
		t.Errorf("the shim's peak RSS grew by %d KiB for 64 MiB of stdin: it buffers input", grew)
	}
	if out := e.must(t, "exec", id, "--", "echo", "alive"); strings.TrimSpace(out) != "alive" {
		t.Fatalf("the agent does not answer after the large stdin: %q", out)
	}
}

// peakRSSKiB is a process's peak resident set (VmHWM) in KiB.
func peakRSSKiB(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no VmHWM for pid %d", pid)
	return 0
}

// TestThreat031UploadIntoFullDisk: with the guest's disk full (by guest
// root, so the reserved blocks too), an upload fails with an error that
// says so, the file it would have replaced keeps its content, the agent
// answers, and once space is freed the same upload succeeds.
func TestThreat031UploadIntoFullDisk(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	e.must(t, "exec", id, "--", "sh", "-c", "echo precious > /root/keep.txt")
	out := e.must(t, "exec", id, "--", "sh", "-c",
		"fallocate -l $(( $(stat -f -c '%a*%S' /) )) /fill 2>/dev/null; "+
			"dd if=/dev/zero of=/fill2 bs=64k 2>/dev/null; sync; df -k / | tail -1")
	if f := strings.Fields(out); len(f) < 4 || f[3] != "0" {
		t.Fatalf("the disk did not fill: %q", out)
	}
	up := filepath.Join(t.TempDir(), "up.bin")
	if err := os.WriteFile(up, bytes.Repeat([]byte("u"), 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.run(t, nil, "cp", up, id+":/root/keep.txt")
	if r.code == 0 {
		t.Fatalf("an upload into a full disk succeeded: %q", r.stdout)
	}
	if !strings.Contains(strings.ToLower(r.stderr), "no space") {
		t.Errorf("the refusal does not say the disk is full: %q", r.stderr)
	}
	if got := e.must(t, "exec", id, "--", "cat", "/root/keep.txt"); got != "precious\n" {
		t.Errorf("the failed upload changed the file it would have replaced: %q", got)
	}
	e.must(t, "exec", id, "--", "rm", "-f", "/fill", "/fill2")
	e.must(t, "cp", up, id+":/root/keep.txt")
	if got := e.must(t, "exec", id, "--", "sh", "-c", "wc -c < /root/keep.txt"); strings.TrimSpace(got) != strconv.Itoa(4<<20) {
		t.Errorf("after freeing space the upload wrote %q bytes", got)
	}
}

// TestThreat090InodeExhaustion: guest root creating empty files until it
// cannot. On qemu the guest's own filesystem runs out of inodes (ENOSPC),
// an upload then fails saying so, and the agent answers; the host file
// stays within the disk's size. On gVisor the files live in the sentry's
// memory: the sandbox ends at its memory limit with a reason that says
// so, and the host is not touched beyond that limit.
func TestThreat090InodeExhaustion(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	r := e.run(t, nil, "exec", id, "--", "python3", "-c", `
import os
os.mkdir("/f")
n = 0
try:
    while n < 400000:
        os.close(os.open("/f/%d" % n, os.O_CREAT | os.O_WRONLY))
        n += 1
    print("CREATED", n)
except OSError as err:
    print("STOPPED", n, err.strerror)
`)
	t.Logf("exit %d: %s%s", r.code, r.stdout, tail(r.stderr, 300))
	if onGVisor() && r.code != 0 {
		var reason string
		testutil.WaitFor(t, 30*time.Second, func() bool {
			sb := inspect(t, e, id)
			reason = sb.Reason
			return sb.State == "failed"
		})
		if !strings.Contains(reason, "memory limit") {
			t.Fatalf("the sandbox ended without saying it hit its memory limit: %q", reason)
		}
		t.Logf("the sandbox ended: %s", reason)
		return
	}
	var n int
	if _, err := fmt.Sscanf(r.stdout, "STOPPED %d", &n); err != nil || n < 1000 || !strings.Contains(r.stdout, "No space left on device") {
		t.Fatalf("the guest did not run out of inodes: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	up := filepath.Join(t.TempDir(), "new.txt")
	if err := os.WriteFile(up, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if u := e.run(t, nil, "cp", up, id+":/root/new.txt"); u.code == 0 || !strings.Contains(strings.ToLower(u.stderr), "no space") {
		t.Errorf("an upload with no inodes left: exit %d, %q", u.code, u.stderr)
	}
	if out := e.must(t, "exec", id, "--", "echo", "alive"); strings.TrimSpace(out) != "alive" {
		t.Fatalf("the agent does not answer with no inodes left: %q", out)
	}
}

// TestThreat036ConcurrentUploadsDoNotInterleave: eight uploads of
// different 2 MiB files to one path at once leave exactly one of them
// there, whole (the agent writes beside the target and renames), and no
// temporary file behind.
func TestThreat036ConcurrentUploadsDoNotInterleave(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	e.must(t, "exec", id, "--", "mkdir", "/race")
	dir := t.TempDir()
	sums := map[string]int{}
	var files []string
	for i := range 8 {
		p := filepath.Join(dir, strconv.Itoa(i))
		b := bytes.Repeat([]byte{byte('a' + i)}, 2<<20)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sums[fmt.Sprintf("%x", sha256.Sum256(b))] = i
		files = append(files, p)
	}
	errs := make(chan result, len(files))
	for _, p := range files {
		go func() { errs <- e.run(t, nil, "cp", p, id+":/race/target") }()
	}
	ok := 0
	for range files {
		if r := <-errs; r.code == 0 {
			ok++
		} else {
			t.Logf("an upload lost the race: %s", strings.TrimSpace(r.stderr))
		}
	}
	if ok == 0 {
		t.Fatal("no upload succeeded")
	}
	out := e.must(t, "exec", id, "--", "sh", "-c", "sha256sum /race/target; ls -a /race")
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("no target: %q", out)
	}
	i, whole := sums[f[0]]
	if !whole {
		t.Fatalf("the target is none of the uploads whole (interleaved or cut): %q", out)
	}
	if left := strings.Fields(strings.TrimSpace(out[strings.Index(out, "\n")+1:])); len(left) != 3 {
		t.Errorf("files left beside the target: %v", left)
	}
	t.Logf("%d of %d uploads succeeded; upload %d is the one left", ok, len(files), i)
}

// TestThreat097SignalAfterExitHitsNothing: an exec that has exited is
// signalled through the API after another process was started (it tries
// to take the exited exec's pid through ns_last_pid, which the exec
// envelope's read-only /proc/sys refuses, and gVisor ignores): the signal
// is refused with 409 and the other process lives on. The agent signals
// only children it has not reaped, so a pid it signals is never another
// process's (reaper tests).
func TestThreat097SignalAfterExitHitsNothing(t *testing.T) {
	e := setup(t)
	s := startServe(t, e)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-pidreuse"))
	key = key[strings.LastIndex(key, "\n")+1:]
	t.Cleanup(func() { e.run(t, nil, "keys", "revoke", strings.Split(key, "_")[1]) })
	code, body := s.do(key, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(body, &sb)
	t.Cleanup(func() { s.do(key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	base := "/v1/sandboxes/" + sb.ID
	code, body = s.do(key, "POST", base+"/exec", strings.NewReader(`{"cmd":["true"],"background":true}`))
	var a struct {
		ExecID string `json:"exec_id"`
		PID    int    `json:"pid"`
	}
	if code != 202 || json.Unmarshal(body, &a) != nil || a.PID <= 1 {
		t.Fatalf("exec A: %d %s", code, body)
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		_, b := s.do(key, "GET", base+"/execs/"+a.ExecID, nil)
		return strings.Contains(string(b), `"state":"exited"`)
	}) {
		t.Fatal("exec A did not exit")
	}
	// B's background child takes A's pid: the last pid handed out is set
	// to A's minus one just before the fork.
	script := fmt.Sprintf("echo %d > /proc/sys/kernel/ns_last_pid 2>/dev/null; sleep 300 & echo $! > /tmp/b.pid; wait", a.PID-1)
	code, body = s.do(key, "POST", base+"/exec", strings.NewReader(fmt.Sprintf(`{"cmd":["sh","-c",%q],"background":true}`, script)))
	if code != 202 {
		t.Fatalf("exec B: %d %s", code, body)
	}
	var bpid string
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		r := e.run(t, nil, "exec", sb.ID, "--", "cat", "/tmp/b.pid")
		bpid = strings.TrimSpace(r.stdout)
		return r.code == 0 && bpid != ""
	}) {
		t.Fatal("exec B did not start its child")
	}
	if bpid != strconv.Itoa(a.PID) {
		// The exec envelope makes /proc/sys read-only to execs (and gVisor
		// ignores ns_last_pid): the pid is not reused, and what is checked
		// is the refusal and that B lives on. The agent's reaper signals
		// only children it has not reaped (reaper tests).
		t.Logf("B's child got pid %s (A had %d; an exec cannot steer pids): checking the refusal only", bpid, a.PID)
	}
	code, body = s.do(key, "POST", base+"/execs/"+a.ExecID+"/signal", strings.NewReader(`{"signal":9}`))
	if code != 409 || !strings.Contains(string(body), "the exec has exited") {
		t.Errorf("a signal to an exec that has exited: %d %s (want 409, the exec has exited)", code, body)
	}
	t.Logf("signal to exited exec A (pid %d; B's child has %s): %d %s", a.PID, bpid, code, body)
	if r := e.run(t, nil, "exec", sb.ID, "--", "kill", "-0", bpid); r.code != 0 {
		t.Fatalf("the process that reused A's pid was killed: %s", r.stderr)
	}
}

// TestThreat107LocalSocketsAndFiles: another local user (nobody) can
// neither connect to a sandbox's shim or ports socket nor read the catalog,
// its WAL, a shim log or a sandbox's disk; tried as that user.
func TestThreat107LocalSocketsAndFiles(t *testing.T) {
	e := setup(t)
	testutil.RequireRoot(t)
	id := e.create(t)
	t.Cleanup(func() { e.run(t, nil, "rm", id) })
	dir := filepath.Join(e.state, "sandboxes", id)
	var targets []string
	for _, name := range []string{"shim.sock", "ports.sock", "shim.log", "root.qcow2"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			targets = append(targets, filepath.Join(dir, name))
		}
	}
	for _, name := range []string{"catalog.db", "catalog.db-wal", "catalog.db-shm"} {
		if _, err := os.Stat(filepath.Join(e.state, name)); err == nil {
			targets = append(targets, filepath.Join(e.state, name))
		}
	}
	if len(targets) < 4 {
		t.Fatalf("found only %v", targets)
	}
	probe := `
import socket, sys
for p in sys.argv[1:]:
    try:
        if p.endswith(".sock"):
            s = socket.socket(socket.AF_UNIX)
            s.connect(p)
        else:
            open(p, "rb").read(1)
        print("OPENED", p)
    except OSError as err:
        print("REFUSED", p, err.strerror)
`
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", probe}, targets...)...) // Debian's, runnable by nobody
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe as nobody: %v\n%s", err, out)
	}
	t.Logf("as nobody:\n%s", out)
	if n := strings.Count(string(out), "REFUSED"); n != len(targets) || strings.Contains(string(out), "No such file") {
		t.Errorf("as nobody, %d of %d refused:\n%s", n, len(targets), out)
	}
}

// TestThreat012TeardownFollowsNoGuestLink: the guest plants symbolic and
// hard-link-looking names pointing at a host file outside the state dir
// (by its host path) all over its filesystem; removing the sandbox
// removes its directory and leaves the host file as it was.
func TestThreat012TeardownFollowsNoGuestLink(t *testing.T) {
	e := setup(t)
	canaryDir := t.TempDir()
	canary := filepath.Join(canaryDir, "canary")
	if err := os.WriteFile(canary, []byte("host data"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := e.create(t)
	dir := filepath.Join(e.state, "sandboxes", id)
	e.must(t, "exec", id, "--", "sh", "-c", fmt.Sprintf(
		"for d in / /tmp /root /var/tmp; do ln -sf %[1]s $d/canary-link; ln -sf %[2]s $d/canary-dir; done; "+
			"mkdir -p %[2]s && echo guest > %[1]s; ln -sf / /tmp/root-link; test -L /tmp/canary-link", canary, canaryDir))
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("no sandbox dir before rm: %v", err)
	}
	e.must(t, "rm", id)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the sandbox dir survived rm: %v", err)
	}
	b, err := os.ReadFile(canary)
	if err != nil || string(b) != "host data" {
		t.Fatalf("the host file after teardown: %q %v", b, err)
	}
}

// TestThreat089DiskQuotaAndHostReserve: through the API, a tenant asking
// for more disk than its quota gets 429 naming max_disk_mb, one asking for
// more than the host can spare gets 507, and neither leaves anything in
// the state dir; a guest filling its whole disk grows its host file by at
// most its disk size.
func TestThreat089DiskQuotaAndHostReserve(t *testing.T) {
	e := setup(t)
	s := startServe(t, e)
	newKey := func(tenant string, args ...string) string {
		k := strings.TrimSpace(e.must(t, append([]string{"keys", "create", "--tenant", tenant}, args...)...))
		k = k[strings.LastIndex(k, "\n")+1:]
		t.Cleanup(func() { e.run(t, nil, "keys", "revoke", strings.Split(k, "_")[1]) })
		return k
	}
	small := newKey("e2e-disk-small", "--max-disk-mb", "3000")
	big := newKey("e2e-disk-big", "--max-disk-mb", "2000000")
	dirs := func() int {
		ents, err := os.ReadDir(filepath.Join(e.state, "sandboxes"))
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := dirs()
	code, body := s.do(small, "POST", "/v1/sandboxes", strings.NewReader(`{"disk_mb":4096}`))
	if code != 429 || !strings.Contains(string(body), "max_disk_mb") {
		t.Errorf("4 GiB over a 3000 MiB quota: %d %s", code, body)
	}
	code, body = s.do(big, "POST", "/v1/sandboxes", strings.NewReader(`{"disk_mb":1000000}`))
	if code != 507 || !strings.Contains(string(body), `"insufficient_storage"`) {
		t.Errorf("a 976 GiB disk: %d %s", code, body)
	}
	t.Logf("refusal: %s", body)
	if n := dirs(); n != before {
		t.Errorf("refused creates left %d sandbox dirs behind", n-before)
	}
	// Within its quota, a sandbox whose guest fills its disk: the host
	// file stays within the disk's size.
	code, body = s.do(small, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
	if code != 201 {
		t.Fatalf("create within the quota: %d %s", code, body)
	}
	var sb struct {
		ID     string
		DiskMB int `json:"disk_mb"`
	}
	_ = json.Unmarshal(body, &sb)
	t.Cleanup(func() { e.run(t, nil, "rm", sb.ID) })
	out := e.must(t, "exec", sb.ID, "--", "sh", "-c",
		"dd if=/dev/zero of=/fill bs=1M 2>/dev/null; sync; df -k / | tail -1")
	if f := strings.Fields(out); len(f) < 4 || f[3] != "0" {
		t.Fatalf("the guest did not fill its disk: %q", out)
	}
	var grown int64
	_ = filepath.WalkDir(filepath.Join(e.state, "sandboxes", sb.ID), func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				grown += fi.Size()
			}
		}
		return nil
	})
	t.Logf("disk %d MiB full in the guest; the sandbox's host files: %d MiB", sb.DiskMB, grown>>20)
	if grown > int64(sb.DiskMB+64)<<20 {
		t.Errorf("a %d MiB disk took %d MiB on the host", sb.DiskMB, grown>>20)
	}
}
