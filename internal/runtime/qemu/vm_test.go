package qemu

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// vmFixture is what vm-tier tests need: a kernel and initramfs from the
// environment and a Runtime on a temporary state dir.
type vmFixture struct {
	rt             *Runtime
	kernel, initrd string
	scale          time.Duration // timeouts multiply by this under TCG
}

func newVMFixture(t *testing.T) *vmFixture {
	t.Helper()
	testutil.RequireVM(t)
	kernel, initrd := testutil.BootFiles(t)
	if os.Geteuid() != 0 {
		t.Fatal("the qemu runtime runs VMMs as per-instance uids and must run as root")
	}
	// State must be reachable by nothing but root; t.TempDir is 0700.
	rt, err := New(Config{
		StateDir:    t.TempDir(),
		Accel:       testutil.Accel(),
		ProbeKernel: kernel,
		ProbeInitrd: initrd,
		Logger:      slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	caps, err := rt.Probe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("caps: %+v", caps)
	f := &vmFixture{rt: rt, kernel: kernel, initrd: initrd, scale: 1}
	if caps.Accel == "tcg" {
		f.scale = 4
	}
	return f
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// world makes a 0755 directory that VMM uids can traverse (for the qcow2
// backing chain, which QEMU opens by path).
func world(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "airlock-vmtest-") //nolint:usetesting // t.TempDir's parent is 0700: VMM uids could not traverse it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// baseDisk creates an empty ext4 base image (0444) in a world-readable dir.
func baseDisk(t *testing.T, dir string) string {
	t.Helper()
	base := filepath.Join(dir, "base.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "root", base, "64M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if err := os.Chmod(base, 0o444); err != nil {
		t.Fatal(err)
	}
	return base
}

// overlay creates a qcow2 overlay on backing (format bfmt).
func overlay(t *testing.T, path, backing, bfmt string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", bfmt, path).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
}

func (f *vmFixture) spec(t *testing.T, disk string) runtime.Spec {
	return runtime.Spec{
		ID:        strings.ReplaceAll(t.Name(), "/", "-"),
		CPUs:      1,
		MemoryMiB: 256,
		Kernel:    f.kernel,
		Initrd:    f.initrd,
		RootDisk:  disk,
		RunDir:    t.TempDir(),
	}
}

// procStatus returns the named fields of /proc/PID/status.
func procStatus(t *testing.T, pid int, keys ...string) map[string]string {
	t.Helper()
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		for _, want := range keys {
			if k == want {
				out[k] = strings.Join(strings.Fields(v), " ")
			}
		}
	}
	return out
}

// TestThreat001VMMPosture boots a guest, waits for the agent banner, and
// checks how QEMU is confined.
func TestThreat001VMMPosture(t *testing.T) {
	f := newVMFixture(t)
	dir := world(t)
	ov := filepath.Join(t.TempDir(), "root.qcow2")
	overlay(t, ov, baseDisk(t, dir), "raw")
	in, err := f.rt.Create(t.Context(), f.spec(t, ov))
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := in.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	conn, err := in.AgentConn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	errc := make(chan error, 1)
	go func() { errc <- findBanner(conn) }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second * f.scale):
		t.Fatal("no agent banner")
	}
	t.Logf("cold boot to banner: %v", time.Since(t0))

	q := in.(*instance)
	q.mu.Lock()
	pid := q.proc.Pid
	q.mu.Unlock()
	st := procStatus(t, pid, "Uid", "Gid", "Groups", "NSpid", "Seccomp", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs")
	t.Logf("qemu status: %v", st)
	uid := strings.Fields(st["Uid"])[0]
	if uid == "0" || !strings.HasPrefix(st["NSpid"], fmt.Sprint(pid)+" 1") || st["Seccomp"] != "2" ||
		st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" || st["Groups"] != "" ||
		st["CapBnd"] != "0000000000000000" || st["NoNewPrivs"] != "1" {
		t.Errorf("qemu is not confined: %v", st)
	}
	for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts"} {
		a, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		b, _ := os.Readlink("/proc/self/ns/" + ns)
		if a == b {
			t.Errorf("qemu shares the %s namespace", ns)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if err := in.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	es, err := in.Wait(t.Context())
	if err != nil || !es.Requested {
		t.Fatalf("wait = %+v, %v", es, err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Fatal("qemu still running after Stop")
	}
}

// waitBanner reads the agent banner from in's agent channel and returns
// the conn.
func (f *vmFixture) waitBanner(t *testing.T, in runtime.Instance, d time.Duration) (conn interface{ Close() error }) {
	t.Helper()
	c, err := in.AgentConn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- findBanner(c) }()
	select {
	case err := <-errc:
		if err != nil {
			c.Close()
			t.Fatal(err)
		}
	case <-time.After(d * f.scale):
		c.Close()
		<-errc //nolint:errcheck // only waiting for the goroutine to end; its result is not the subject here
		t.Fatal("no agent banner")
	}
	return c
}

// TestVMSnapshotRestore saves a template and measures restores of it.
func TestVMSnapshotRestore(t *testing.T) {
	f := newVMFixture(t)
	dir := world(t)
	tmplDisk := filepath.Join(dir, "tmpl.qcow2")
	overlay(t, tmplDisk, baseDisk(t, dir), "raw")
	spec := f.spec(t, tmplDisk)
	spec.Snapshottable = true
	tmpl, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := tmpl.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tmpl.Kill() }()
	f.waitBanner(t, tmpl, 20*time.Second).Close()
	t.Logf("template boot to banner: %v", time.Since(t0))

	snap := filepath.Join(dir, "snap")
	if err := os.Mkdir(snap, 0o755); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := tmpl.(runtime.Snapshotter).SaveSnapshot(t.Context(), snap); err != nil {
		t.Fatal(err)
	}
	t.Logf("save: %v", time.Since(t1))
	es, _ := tmpl.Wait(t.Context())
	if !es.Requested {
		t.Errorf("template exit %+v", es)
	}
	if err := os.Chmod(tmplDisk, 0o444); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{snapState, snapMem, snapMeta} {
		fi, err := os.Stat(filepath.Join(snap, n))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		t.Logf("%s: %d bytes (%d allocated) mode %v uid %d", n, fi.Size(), st.Blocks*512, fi.Mode(), st.Uid)
		if fi.Mode().Perm() != 0o444 || st.Uid != 0 {
			t.Errorf("%s: mode %v uid %d", n, fi.Mode(), st.Uid)
		}
	}

	var times []time.Duration
	for i := range 7 {
		cs := f.spec(t, filepath.Join(t.TempDir(), "clone.qcow2"))
		cs.ID = fmt.Sprintf("clone-%d", i)
		cs.RestoreFrom = snap
		overlay(t, cs.RootDisk, tmplDisk, "qcow2")
		t2 := time.Now()
		c, err := f.rt.Create(t.Context(), cs)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		started := time.Since(t2)
		conn, err := c.AgentConn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		dctx, dcancel := context.WithTimeout(t.Context(), 10*time.Second*f.scale)
		ac, err := agentapi.Dial(dctx, conn, agentapi.Options{})
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(t2))
		if _, err := ac.Sync(dctx, "clone", 0); err != nil {
			t.Fatal(err)
		}
		dcancel()
		t.Logf("clone %d: running after %v, agent Info answered after %v, Sync done after %v", i, started, times[i], time.Since(t2))
		if i == 0 {
			time.Sleep(2 * time.Second) // idle
			q := c.(*instance)
			q.mu.Lock()
			pid := q.proc.Pid
			q.mu.Unlock()
			st := procStatus(t, pid, "VmRSS", "RssAnon", "RssFile", "RssShmem")
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
			pss := ""
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "Pss:") {
					pss = strings.Join(strings.Fields(l), " ")
				}
			}
			t.Logf("idle clone memory: %v %s", st, pss)
		}
		ac.Close()
		_ = c.Kill()
		if es, _ := c.Wait(t.Context()); !es.Requested {
			t.Errorf("clone exit %+v", es)
		}
	}
	slices.Sort(times)
	t.Logf("restore to agent Info: median %v (min %v, max %v)", times[len(times)/2], times[0], times[len(times)-1])
}

// TestVMProbeGuest boots the probe guest (airlock.probe=1, no root disk)
// under TCG and waits for its banner, then runs the real KVM probe, which
// on a host without usable KVM must fall back to TCG with a reason.
func TestVMProbeGuest(t *testing.T) {
	f := newVMFixture(t)
	t0 := time.Now()
	if err := f.rt.bootProbeGuestWith(t.Context(), "tcg", 15*time.Second*f.scale); err != nil {
		t.Fatalf("probe guest under TCG: %v", err)
	}
	t.Logf("probe guest answered under TCG in %v", time.Since(t0))

	// The KVM path for real: with a device that passes our checks, QEMU
	// itself must open /dev/kvm as the VMM uid.
	dev := filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(dev, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dev, 0o666); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{StateDir: t.TempDir(), ProbeKernel: f.kernel, ProbeInitrd: f.initrd})
	if err != nil {
		t.Fatal(err)
	}
	r.kvmDevice = dev
	t0 = time.Now()
	accel, reason := r.probeKVM(t.Context(), "test")
	t.Logf("KVM probe: %s (%s) in %v", accel, reason, time.Since(t0))
	if accel == "tcg" && !strings.HasSuffix(reason, tcgSuffix) {
		t.Errorf("reason %q", reason)
	}
}

// TestThreat020GuestKernelPanicContained boots a kernel with no usable init: the kernel
// panics, QEMU exits, and Wait's Reason is the panic line.
func TestThreat020GuestKernelPanicContained(t *testing.T) {
	f := newVMFixture(t)
	s := f.spec(t, "")
	s.RootDisk = filepath.Join(t.TempDir(), "unused.qcow2")
	overlay(t, s.RootDisk, baseDisk(t, world(t)), "raw")
	s.KernelArgs = []string{"rdinit=/no-such-init", "init=/no-such-init"}
	in, err := f.rt.Create(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second*f.scale)
	defer cancel()
	st, err := in.Wait(ctx)
	if err != nil {
		_ = in.Kill()
		t.Fatal(err)
	}
	t.Logf("exit: %+v", st)
	if st.Requested || !strings.HasPrefix(st.Reason, "guest kernel panic: VFS") {
		t.Fatalf("exit = %+v, want the panic as Reason", st)
	}
	b, _ := os.ReadFile(filepath.Join(s.RunDir, "console.log"))
	if !strings.Contains(string(b), "Kernel panic") {
		t.Errorf("console.log lacks the panic:\n%s", b)
	}
}
