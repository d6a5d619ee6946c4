package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// runEnveloped starts path/argv as id through a launcher (as the guest
// agent starts an exec: from the launcher's thread, in a new cgroup
// namespace) and returns its stdout, or the start's error.
func runEnveloped(t *testing.T, id identity, path string, argv ...string) (string, error) {
	return runEnvelopedIn(t, id, "", path, argv...)
}

func runEnvelopedIn(t *testing.T, id identity, dir, path string, argv ...string) (string, error) {
	t.Helper()
	l := newLauncher(false)
	defer l.close()
	if l.err != nil {
		t.Fatal(l.err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Files: []uintptr{null.Fd(), outW.Fd(), null.Fd()},
		Sys: &syscall.SysProcAttr{Setsid: true, Unshareflags: syscall.CLONE_NEWCGROUP,
			Credential: &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}},
	}
	pid, err := l.start(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	outW.Close()
	if err != nil {
		return "", err
	}
	defer func() {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, 0, nil)
	}()
	out, err := io.ReadAll(outR)
	if err != nil {
		t.Fatal(err)
	}
	return string(out), nil
}

func keptMask() uint64 {
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	var m uint64
	for c := range keptCaps {
		if c <= last {
			m |= 1 << c
		}
	}
	return m
}

// TestEnvelopeHoldsRoot: a root program started through the envelope has
// only keptCaps in its bounding and effective sets, sees its own cgroup as
// the root (0::/), cannot write to the cgroup tree or mount, and still runs
// as root; as another user it runs as that user with the same bound.
func TestEnvelopeHoldsRoot(t *testing.T) {
	testutil.RequireRoot(t)
	const probe = `id -u; grep -E '^Cap(Bnd|Eff)' /proc/self/status; cat /proc/self/cgroup
echo $$ > /sys/fs/cgroup/cgroup.procs 2>/dev/null && echo ESCAPED:procs || echo held:procs
mkdir /sys/fs/cgroup/x 2>/dev/null && echo ESCAPED:mkdir || echo held:mkdir
mount -t tmpfs none /mnt 2>/dev/null && echo ESCAPED:mount || echo held:mount
(v=$(cat /proc/sys/vm/overcommit_ratio); echo $v > /proc/sys/vm/overcommit_ratio) 2>/dev/null && echo ESCAPED:sysctl || echo held:sysctl
(echo h > /proc/sysrq-trigger) 2>/dev/null && echo ESCAPED:sysrq || echo held:sysrq`
	want := fmt.Sprintf("%016x", keptMask())
	for _, id := range []identity{{uid: 0, gid: 0, groups: []uint32{0}}, {uid: 65534, gid: 65534, groups: []uint32{65534}}} {
		out, err := runEnveloped(t, id, "/bin/sh", "sh", "-c", probe)
		if err != nil {
			t.Fatalf("uid %d: start: %v", id.uid, err)
		}
		if !strings.HasPrefix(out, strconv.Itoa(int(id.uid))+"\n") {
			t.Fatalf("uid %d: the probe did not run as its user: %q", id.uid, out)
		}
		if !strings.Contains(out, "CapBnd:\t"+want+"\n") {
			t.Errorf("uid %d: bounding set is not %s: %q", id.uid, want, out)
		}
		wantEff := want
		if id.uid != 0 {
			wantEff = "0000000000000000"
		}
		if !strings.Contains(out, "CapEff:\t"+wantEff+"\n") {
			t.Errorf("uid %d: effective set is not %s: %q", id.uid, wantEff, out)
		}
		if !strings.Contains(out, "0::/\n") {
			t.Errorf("uid %d: not in its own cgroup namespace: %q", id.uid, out)
		}
		for _, w := range []string{"procs", "mkdir", "mount", "sysctl", "sysrq"} {
			if !strings.Contains(out, "held:"+w+"\n") {
				t.Errorf("uid %d: %s not refused: %q", id.uid, w, out)
			}
		}
	}
}

// TestEnvelopeStartErrors: what cannot be executed comes back as the errno
// of the start, not as an exit status.
func TestEnvelopeStartErrors(t *testing.T) {
	testutil.RequireRoot(t)
	root := identity{uid: 0, gid: 0, groups: []uint32{0}}
	if _, err := runEnveloped(t, root, "/nonexistent/prog", "prog"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("missing program: %v, want ENOENT", err)
	}
	plain := t.TempDir() + "/plain"
	if err := os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runEnveloped(t, root, plain, "plain"); !errors.Is(err, syscall.EACCES) {
		t.Errorf("not executable: %v, want EACCES", err)
	}
	if out, err := runEnveloped(t, root, "/bin/echo", "echo", "ran"); err != nil || out != "ran\n" {
		t.Errorf("a good start: %q, %v", out, err)
	}
	// A working directory only root may enter: root starts there, another
	// user gets EACCES, as with a direct start.
	private := t.TempDir() + "/private"
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := runEnvelopedIn(t, root, private, "/bin/pwd", "pwd"); err != nil || out != private+"\n" {
		t.Errorf("root in %s: %q, %v", private, out, err)
	}
	nobody := identity{uid: 65534, gid: 65534, groups: []uint32{65534}}
	if _, err := runEnvelopedIn(t, nobody, private, "/bin/pwd", "pwd"); !errors.Is(err, syscall.EACCES) {
		t.Errorf("nobody in %s: %v, want EACCES", private, err)
	}
}
