package qemu

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{StateDir: "/var/lib/airlock/qemu"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	bad := []Config{
		{},
		{StateDir: "relative"},
		{StateDir: "/s", Accel: "hvf"},
		{StateDir: "/s", ProbeKernel: "/k"},
		{StateDir: "/s", UIDBase: 10, UIDCount: 5},
		{StateDir: "/s", UIDBase: 60000, UIDCount: 10000},
		{StateDir: "/s", UIDBase: 1 << 31, UIDCount: 1 << 31},
		{StateDir: "/s", TSCkHz: -1},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v, want invalid", c, err)
		}
	}
}

// testRuntime is a Runtime whose QEMU is /bin/true (never booted here):
// enough for the probe logic and for Start's failure path.
func testRuntime(t *testing.T, cfg Config) *Runtime {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	cfg.QEMUPath = "/bin/true"
	if cfg.TSCkHz == 0 {
		cfg.TSCkHz = 2_600_000
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestProbeVerdicts(t *testing.T) {
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initrd")
	if err := os.WriteFile(kernel, []byte("k"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(initrd, []byte("i"), 0o444); err != nil {
		t.Fatal(err)
	}
	worldDev := filepath.Join(dir, "kvm")
	if err := os.WriteFile(worldDev, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(worldDev, 0o666); err != nil {
		t.Fatal(err)
	}

	t.Run("no device", func(t *testing.T) {
		r := testRuntime(t, Config{ProbeKernel: kernel, ProbeInitrd: initrd})
		r.kvmDevice = filepath.Join(dir, "absent")
		r.bootProbe = func(context.Context) error { t.Fatal("booted without /dev/kvm"); return nil }
		accel, reason := r.probeKVM(t.Context(), "7.2")
		if accel != "tcg" || !strings.Contains(reason, "no usable") {
			t.Fatalf("%s: %s", accel, reason)
		}
	})
	t.Run("root only device", func(t *testing.T) {
		testutil.NeedRoot(t) // to open a 0600 root-owned file
		dev := filepath.Join(dir, "kvm0600")
		if err := os.WriteFile(dev, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		r := testRuntime(t, Config{ProbeKernel: kernel, ProbeInitrd: initrd})
		r.kvmDevice = dev
		accel, reason := r.probeKVM(t.Context(), "7.2")
		if accel != "tcg" || !strings.Contains(reason, "not usable by unprivileged") {
			t.Fatalf("%s: %s", accel, reason)
		}
	})
	t.Run("no probe kernel", func(t *testing.T) {
		r := testRuntime(t, Config{})
		r.kvmDevice = worldDev
		if accel, reason := r.probeKVM(t.Context(), "7.2"); accel != "tcg" || !strings.Contains(reason, "no probe kernel") {
			t.Fatalf("%s: %s", accel, reason)
		}
	})
	t.Run("boots then cached", func(t *testing.T) {
		state := t.TempDir()
		boots := 0
		for range 2 {
			r := testRuntime(t, Config{StateDir: state, ProbeKernel: kernel, ProbeInitrd: initrd})
			r.kvmDevice = worldDev
			r.bootProbe = func(context.Context) error { boots++; return nil }
			caps, err := r.Probe(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if caps.Accel != "kvm" || !caps.Snapshots || caps.VMMVersion == "" {
				t.Fatalf("caps = %+v", caps)
			}
		}
		if boots != 1 {
			t.Fatalf("probe guest booted %d times, want 1 (cached)", boots)
		}
		// A new probe kernel invalidates the verdict.
		if err := os.WriteFile(kernel, []byte("k2"), 0o444); err != nil {
			t.Fatal(err)
		}
		r := testRuntime(t, Config{StateDir: state, ProbeKernel: kernel, ProbeInitrd: initrd})
		r.kvmDevice = worldDev
		r.bootProbe = func(context.Context) error { boots++; return probeError("KVM guest did not boot within 3s") }
		caps, _ := r.Probe(t.Context())
		if boots != 2 || caps.Accel != "tcg" || caps.AccelReason != "KVM guest did not boot within 3s; using TCG (slow)" {
			t.Fatalf("boots %d caps %+v", boots, caps)
		}
	})
	t.Run("interrupted is not cached", func(t *testing.T) {
		state := t.TempDir()
		r := testRuntime(t, Config{StateDir: state, ProbeKernel: kernel, ProbeInitrd: initrd})
		r.kvmDevice = worldDev
		ctx, cancel := context.WithCancel(t.Context())
		r.bootProbe = func(context.Context) error { cancel(); return errors.New("x") }
		if accel, _ := r.probeKVM(ctx, "7.2"); accel != "tcg" {
			t.Fatal(accel)
		}
		if _, err := os.Stat(filepath.Join(state, "probe.json")); err == nil {
			t.Fatal("interrupted probe was cached")
		}
	})
	t.Run("configured", func(t *testing.T) {
		r := testRuntime(t, Config{Accel: "tcg"})
		caps, err := r.Probe(t.Context())
		if err != nil || caps.Accel != "tcg" {
			t.Fatalf("%+v %v", caps, err)
		}
	})
}

func TestKVMGroup(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "dev")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o666, true}, {0o660, false}, {0o600, false}} {
		if err := os.Chmod(p, c.mode); err != nil {
			t.Fatal(err)
		}
		gid, err := kvmGroup(p)
		// 0660 is usable only with a non-root group; t.TempDir files
		// belong to our group, which is root's when run as root.
		if c.mode == 0o660 && os.Getegid() != 0 {
			if err != nil || gid != os.Getegid() {
				t.Errorf("0660: gid %d, %v", gid, err)
			}
			continue
		}
		if (err == nil) != c.ok || (c.ok && gid != -1) {
			t.Errorf("%o: gid %d, %v", c.mode, gid, err)
		}
	}
}

func validSpec(t *testing.T) runtime.Spec {
	return runtime.Spec{ID: "x", CPUs: 1, MemoryMiB: 128, Kernel: "/k", Initrd: "/i", RootDisk: "/d", RunDir: t.TempDir()}
}

func TestValidateSpec(t *testing.T) {
	s := validSpec(t)
	if err := validateSpec(s); err != nil {
		t.Fatal(err)
	}
	for _, mut := range []func(*runtime.Spec){
		func(s *runtime.Spec) { s.CPUs = 0 },
		func(s *runtime.Spec) { s.KernelArgs = []string{"a b"} },
		func(s *runtime.Spec) { s.KernelArgs = []string{"a\nb"} },
		func(s *runtime.Spec) { s.KernelArgs = []string{""} },
	} {
		s := validSpec(t)
		mut(&s)
		if err := validateSpec(s); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: %v", s, err)
		}
	}
}

func TestSnapshotMetaCheck(t *testing.T) {
	dir := t.TempDir()
	s := validSpec(t)
	s.RestoreFrom = dir
	if _, err := checkSnapshotMeta(s, "tcg"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("no meta: %v", err)
	}
	const base = `"version":1,"accel":"tcg","cpus":1,"memory_mib":128,"kernel":"/k","initrd":"/i","root_disk_format":"qcow2"`
	writeMeta := func(extra string) {
		t.Helper()
		p := filepath.Join(dir, snapMeta)
		os.Remove(p)
		if err := os.WriteFile(p, []byte("{"+base+extra+"}"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	// A meta from before kinds existed is a template.
	writeMeta("")
	if m, err := checkSnapshotMeta(s, "tcg"); err != nil || m.Kind != kindTemplate || m.Machine != "" {
		t.Fatalf("old meta: %+v, %v", m, err)
	}
	if _, err := checkSnapshotMeta(s, "kvm"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("accel mismatch: %v", err)
	}
	s.Snapshottable = true
	if _, err := checkSnapshotMeta(s, "tcg"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Snapshottable restore of a template: %v", err)
	}
	writeMeta(`,"kind":"full"`)
	if m, err := checkSnapshotMeta(s, "tcg"); err != nil || m.Kind != kindFull {
		t.Errorf("Snapshottable restore of a full snapshot: %+v, %v", m, err)
	}
	s.Snapshottable = false
	for _, c := range []struct {
		name string
		mut  func(*runtime.Spec)
	}{
		{"memory", func(s *runtime.Spec) { s.MemoryMiB = 256 }},
		{"cpus", func(s *runtime.Spec) { s.CPUs = 2 }},
		{"kernel", func(s *runtime.Spec) { s.Kernel = "/k2" }},
		{"initrd", func(s *runtime.Spec) { s.Initrd = "/i2" }},
		{"disk format", func(s *runtime.Spec) { s.RootDiskFormat = "raw" }},
		{"network", func(s *runtime.Spec) { s.Network = true }},
	} {
		s2 := s
		c.mut(&s2)
		if _, err := checkSnapshotMeta(s2, "tcg"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s mismatch: %v", c.name, err)
		}
	}
	writeMeta(`,"kind":"weird"`)
	if _, err := checkSnapshotMeta(s, "tcg"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown kind: %v", err)
	}
	// The machine profile travels to the restore; an unknown one (a newer
	// airlock's) is refused.
	writeMeta(`,"kind":"full","machine":"` + machineV2 + `"`)
	if m, err := checkSnapshotMeta(s, "tcg"); err != nil || m.Machine != machineV2 {
		t.Errorf("machine profile: %+v, %v", m, err)
	}
	writeMeta(`,"kind":"full","machine":"99"`)
	if _, err := checkSnapshotMeta(s, "tcg"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("unknown machine profile: %v", err)
	}
}

// SaveState refuses bad options and non-running instances before touching
// QEMU.
func TestSaveStateArgs(t *testing.T) {
	r := testRuntime(t, Config{Accel: "tcg", UIDBase: 5000, UIDCount: 1})
	in := r.newInstance(validSpec(t), "tcg", false)
	if err := in.SaveState(t.Context(), t.TempDir(), runtime.SaveOptions{KeepRunning: true}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("KeepRunning without NewRootDisk: %v", err)
	}
	if err := in.SaveState(t.Context(), t.TempDir(), runtime.SaveOptions{}); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("not started: %v", err)
	}
}

func TestSealedCopyIsReadOnlyAndSparse(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "mem.raw")
	f, _ := os.Create(p)
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("page at 1M"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("page at 40M"), 40<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()

	var c memCache
	defer c.closeAll()
	m, err := c.get(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	fi, _ := m.Stat()
	if fi.Size() != 64<<20 {
		t.Fatalf("size %d", fi.Size())
	}
	buf := make([]byte, 11)
	if _, err := m.ReadAt(buf, 40<<20); err != nil {
		t.Fatal(err)
	}
	if string(buf) != "page at 40M" {
		t.Fatalf("read %q", buf)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Blocks*512 > 1<<20 {
		t.Errorf("copy is not sparse: %d bytes allocated", st.Blocks*512)
	}
	seals, _, e := syscall.Syscall(syscall.SYS_FCNTL, m.Fd(), fGetSeals, 0)
	if e != 0 || seals != sealedMemfdSeals {
		t.Fatalf("seals %x %v", seals, e)
	}
	// Reopened read-write through /proc, as QEMU does: writes fail,
	// a private writable mapping works and does not change the copy.
	rw, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(m.Fd())), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	if _, err := rw.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("write to sealed copy: %v", err)
	}
	if err := rw.Truncate(1); err == nil {
		t.Fatal("truncate of sealed copy succeeded")
	}
	if _, err := syscall.Mmap(int(rw.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err == nil {
		t.Fatal("shared writable mapping of sealed copy succeeded")
	}
	mem, err := syscall.Mmap(int(rw.Fd()), 0, 2<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem[1<<20:], "changed")
	_ = syscall.Munmap(mem)
	if _, err := m.ReadAt(buf[:10], 1<<20); err != nil {
		t.Fatal(err)
	}
	if string(buf[:10]) != "page at 1M" {
		t.Fatalf("private write leaked into the copy: %q", buf[:10])
	}

	// A second get shares the copy; a changed source makes a new one.
	m2, _ := c.get(p)
	defer m2.Close()
	var a, b syscall.Stat_t
	if err := syscall.Fstat(int(m.Fd()), &a); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fstat(int(m2.Fd()), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino {
		t.Error("second get made a new copy")
	}
	before, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, bytes.Repeat([]byte{1}, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	// The cache keys on mtime among others: make the change visible
	// whatever the filesystem's timestamp granularity, without a sleep.
	later := before.ModTime().Add(time.Second)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	m3, err := c.get(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m3.Close()
	if err := syscall.Fstat(int(m3.Fd()), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino == b.Ino {
		t.Error("changed source reused the old copy")
	}
}

// TestFailedStartReleases starts a "QEMU" that exits at once (/bin/true):
// Start must fail, Wait return at once, and the uid lock and descriptors
// be released.
func TestFailedStartReleases(t *testing.T) {
	r := testRuntime(t, Config{Accel: "tcg", UIDBase: 5000, UIDCount: 1})
	s := validSpec(t)
	disk := filepath.Join(t.TempDir(), "d")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s.RootDisk = disk
	fdsBefore := countFDs(t)
	in, err := r.Create(t.Context(), s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := in.Start(ctx); err == nil {
		t.Fatal("start succeeded")
	} else {
		t.Logf("start: %v", err)
	}
	st, err := in.Wait(ctx)
	if err != nil || st.Requested || st.Reason == "" {
		t.Fatalf("wait = %+v, %v", st, err)
	}
	// The single uid is free again.
	l, err := acquireUID(r.cfg.StateDir, 5000, 1)
	if err != nil {
		t.Fatalf("uid not released: %v", err)
	}
	_ = l.Release()
	if after := countFDs(t); after > fdsBefore {
		t.Errorf("descriptors: %d before, %d after", fdsBefore, after)
	}
	if err := in.Start(ctx); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("restart: %v", err)
	}
}

func TestStopKillBeforeStart(t *testing.T) {
	r := testRuntime(t, Config{Accel: "tcg"})
	for _, stop := range []bool{true, false} {
		in, err := r.Create(t.Context(), validSpec(t))
		if err != nil {
			t.Fatal(err)
		}
		if stop {
			err = in.Stop(t.Context())
		} else {
			err = in.Kill()
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := in.Wait(t.Context())
		if err != nil || !st.Requested {
			t.Fatalf("wait = %+v, %v", st, err)
		}
		if err := in.Start(t.Context()); !errors.Is(err, runtime.ErrNotRunning) {
			t.Fatalf("start after stop: %v", err)
		}
		if _, err := in.AgentConn(t.Context()); !errors.Is(err, runtime.ErrNotRunning) {
			t.Fatalf("agent conn: %v", err)
		}
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src, _ := os.Create(filepath.Join(dir, "src"))
	if err := src.Truncate(10 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := src.WriteAt([]byte("hello"), 5<<20); err != nil {
		t.Fatal(err)
	}
	dst, _ := os.Create(filepath.Join(dir, "dst"))
	if err := copySparse(dst, src); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := dst.ReadAt(b, 5<<20); err != nil {
		t.Fatal(err)
	}
	fi, _ := dst.Stat()
	if string(b) != "hello" || fi.Size() != 10<<20 {
		t.Fatalf("%q %d", b, fi.Size())
	}
	src.Close()
	dst.Close()
}

func TestUseSnapshotRAM(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, snapMem), bytes.Repeat([]byte{7}, 8192), 0o444); err != nil {
		t.Fatal(err)
	}
	r := testRuntime(t, Config{Accel: "tcg"})
	defer r.Close()
	m, err := SealSnapshotRAM(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := r.UseSnapshotRAM(dir, m); err != nil {
		t.Fatal(err)
	}
	got, err := r.mems.get(filepath.Join(dir, snapMem))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	var a, b syscall.Stat_t
	if err := syscall.Fstat(int(m.Fd()), &a); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Fstat(int(got.Fd()), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino {
		t.Fatal("runtime made its own copy")
	}
	// An unsealed file is refused.
	plain, _ := os.Open(filepath.Join(dir, snapMem))
	defer plain.Close()
	if err := r.UseSnapshotRAM(dir, plain); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unsealed: %v", err)
	}
}
