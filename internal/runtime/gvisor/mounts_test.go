package gvisor

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// mkVolume makes an ext4 image of 32 MiB, as the manager does.
func mkVolume(t *testing.T) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "vol.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 32<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}

// hostTree is a host directory to share, with a canary beside it that the
// guest must never read, and links inside that point at it.
type hostTree struct {
	parent, dir, canary string
}

const canaryText = "host-canary-7f3a"

func newHostTree(t *testing.T) hostTree {
	t.Helper()
	parent := t.TempDir()
	h := hostTree{parent: parent, dir: filepath.Join(parent, "share"), canary: filepath.Join(parent, "canary")}
	if err := os.Mkdir(h.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"in.txt": "inside\n", h.canary: canaryText + "\n"} {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(h.dir, name)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"abs": h.canary, "rel": "../canary", "up": ".."} {
		if err := os.Symlink(target, filepath.Join(h.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// TestMountsVolume: a volume image mounted read-write keeps what the guest
// wrote after the instance ends; mounted read-only in two instances at
// once, both read it and neither can write it, root or not.
func TestMountsVolume(t *testing.T) {
	f := newFixture(t)
	img := mkVolume(t)
	spec := f.spec(t)
	spec.Mounts = []runtime.Mount{{Image: img, Target: "/data"}}
	in, c := bootMounts(t, f, spec)
	if r := run(t, c, "", "sh", "-c", "echo kept > /data/f && sync && cat /data/f"); r.code != 0 || r.stdout != "kept\n" {
		t.Fatalf("write the volume: %+v", r)
	}
	mounts := filepath.Join(spec.RunDir, "mounts")
	if _, err := os.Stat(filepath.Join(mounts, "0", "f")); err != nil {
		t.Fatalf("the host mount point does not hold the guest's file: %v", err)
	}
	_ = in.Kill()
	if _, err := in.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mounts); !os.IsNotExist(err) {
		t.Fatalf("mount points left after exit: %v", err)
	}

	var cs []*execClient
	for range 2 {
		s := f.spec(t)
		s.Mounts = []runtime.Mount{{Image: img, Target: "/ro", ReadOnly: true}}
		_, c := bootMounts(t, f, s)
		cs = append(cs, &execClient{t, c})
	}
	for i, c := range cs {
		if r := c.run("cat", "/ro/f"); r.code != 0 || r.stdout != "kept\n" {
			t.Errorf("reader %d: %+v", i, r)
		}
		if r := c.run("sh", "-c", "echo no > /ro/g"); r.code == 0 {
			t.Errorf("reader %d wrote a read-only volume: %+v", i, r)
		}
		if r := c.run("sh", "-c", "mount -o remount,rw /ro && echo no > /ro/g"); r.code == 0 {
			t.Errorf("reader %d remounted a read-only volume read-write and wrote it: %+v", i, r)
		}
	}
}

// TestMountsHostDir: a host directory mount shows the directory named, and
// nothing outside it: not through absolute or relative symlinks, "..",
// hard links, a symlink swapped in for the directory after the start, or
// device nodes; read-only ones refuse writes from root.
func TestMountsHostDir(t *testing.T) {
	f := newFixture(t)
	ro, rw := newHostTree(t), newHostTree(t)
	nosuid(t, rw.dir)
	// A host Unix socket in the shared directory stays inert (threat 7).
	ln, err := net.Listen("unix", filepath.Join(rw.dir, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	spec := f.spec(t)
	spec.Mounts = []runtime.Mount{{Dir: ro.dir, Target: "/ro", ReadOnly: true}, {Dir: rw.dir, Target: "/rw"}}
	_, cl := bootMounts(t, f, spec)
	c := &execClient{t, cl}
	if r := c.run("cat", "/ro/in.txt", "/rw/in.txt"); r.stdout != "inside\ninside\n" {
		t.Fatalf("host files: %+v", r)
	}
	// The staging paths show nothing once the mounts are moved.
	if r := c.run("ls", "-A", "/.airlock-mounts/"); r.code != 0 || strings.TrimSpace(r.stdout) != "" {
		t.Errorf("the staging paths still show %+v", r)
	}
	// Links resolve in the guest's own view: none reaches the canary.
	for _, p := range []string{"/ro/abs", "/ro/rel", "/ro/up/canary", "/ro/../canary", "/rw/abs", "/rw/rel", "/rw/up/canary"} {
		if r := c.run("cat", p); strings.Contains(r.stdout, canaryText) {
			t.Errorf("cat %s read the host canary", p)
		}
	}
	if r := c.run("sh", "-c", "cat /ro/up/*/canary /rw/up/*/canary 2>/dev/null; find / -xdev -name canary 2>/dev/null"); strings.Contains(r.stdout, canaryText) {
		t.Errorf("the guest found the host canary: %q", r.stdout)
	}
	// Writes: refused on the read-only mount, even for root and after a
	// remount; kept on the read-write one.
	if r := c.run("sh", "-c", "echo x > /ro/new; mount -o remount,rw /ro; echo x > /ro/new2; touch /ro/in.txt"); r.code == 0 {
		t.Errorf("writes to a read-only host mount succeeded: %+v", r)
	}
	for _, n := range []string{"new", "new2"} {
		if _, err := os.Lstat(filepath.Join(ro.dir, n)); err == nil {
			t.Errorf("the guest created %s in a read-only host mount", n)
		}
	}
	if r := c.run("sh", "-c", "echo w > /rw/new && cat /rw/new"); r.stdout != "w\n" {
		t.Fatalf("write to the read-write mount: %+v", r)
	}
	if b, err := os.ReadFile(filepath.Join(rw.dir, "new")); err != nil || string(b) != "w\n" {
		t.Fatalf("host side of the write: %q, %v", b, err)
	}
	// Hard links to files outside the mount cannot be made, and device
	// nodes made inside it are not devices on the host.
	c.run("sh", "-c", "ln /etc/passwd /rw/hard; mknod /rw/null c 1 3; mknod /rw/blk b 8 0; chmod 4755 /rw/new")
	for _, n := range []string{"hard", "null", "blk"} {
		fi, err := os.Lstat(filepath.Join(rw.dir, n))
		if err != nil {
			continue
		}
		if fi.Mode()&(os.ModeDevice|os.ModeCharDevice) != 0 {
			t.Errorf("the guest planted a device node %s on the host: %v", n, fi.Mode())
		}
		var st unix.Stat_t
		if n == "hard" && unix.Lstat(filepath.Join(rw.dir, n), &st) == nil && st.Nlink > 1 {
			t.Errorf("the guest made a hard link on the host to a file outside the mount")
		}
	}
	// A set-id bit the guest set is never live at the host path.
	if fi, err := os.Stat(filepath.Join(rw.dir, "new")); err == nil && fi.Mode()&os.ModeSetuid != 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(filepath.Join(rw.dir, "new"), &st); err != nil || st.Flags&unix.ST_NOSUID == 0 {
			t.Errorf("a set-id file the guest made is live on the host: %v %v", fi.Mode(), err)
		}
	}
	c.run("sh", "-c", "cat /rw/sock; echo x > /rw/sock; nc -U /rw/sock </dev/null")
	if r := c.run("ls", "-l", "/rw/sock"); r.code != 0 {
		t.Errorf("the guest does not see the socket file, so the check proves nothing: %+v", r)
	}
	select {
	case <-accepted:
		t.Error("the guest connected to a host Unix socket in a host mount")
	default:
	}
	// Swap the shared directory for a symlink to the canary's directory:
	// the guest keeps the directory it was given.
	if err := os.Rename(ro.dir, ro.dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ro.parent, ro.dir); err != nil {
		t.Fatal(err)
	}
	if r := c.run("sh", "-c", "ls /ro; cat /ro/canary"); strings.Contains(r.stdout, canaryText) || !strings.Contains(r.stdout, "in.txt") {
		t.Errorf("after the swap the guest sees %q", r.stdout)
	}
}

// nosuid makes dir a nosuid, nodev bind mount of itself for the test.
func nosuid(t *testing.T, dir string) {
	t.Helper()
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
}

// TestMountsRefuseSetidHostDir: a read-write host mount of a directory
// whose host mount lets set-id bits take effect is refused.
func TestMountsRefuseSetidHostDir(t *testing.T) {
	f := newFixture(t)
	h := newHostTree(t)
	spec := f.spec(t)
	spec.Mounts = []runtime.Mount{{Dir: h.dir, Target: "/h"}}
	ri, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := ri.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "nosuid") {
		t.Fatalf("start with a read-write host dir on a suid mount: %v", err)
	}
}

// TestMountsRefuseSymlinkedDir: a host directory whose path has a symlink
// is refused before anything starts.
func TestMountsRefuseSymlinkedDir(t *testing.T) {
	f := newFixture(t)
	h := newHostTree(t)
	link := filepath.Join(h.parent, "link")
	if err := os.Symlink(h.dir, link); err != nil {
		t.Fatal(err)
	}
	spec := f.spec(t)
	spec.Mounts = []runtime.Mount{{Dir: link, Target: "/h", ReadOnly: true}}
	ri, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	err = ri.Start(t.Context())
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("start with a symlinked host dir: %v", err)
	}
}

// bootMounts boots spec and has the agent move its mounts to their
// targets, as the shim does.
func bootMounts(t *testing.T, f *fixture, spec runtime.Spec) (*instance, *agentapi.Client) {
	t.Helper()
	in, c := boot(t, f, spec)
	var vols []*agentv1.VolumeMount
	for i, m := range spec.Mounts {
		vols = append(vols, &agentv1.VolumeMount{Staged: in.StagedMountPath(i), Path: m.Target, ReadOnly: m.ReadOnly})
	}
	if _, err := c.SyncWith(t.Context(), agentapi.SyncOptions{Volumes: vols}); err != nil {
		t.Fatalf("sync volumes: %v", err)
	}
	return in, c
}

type execClient struct {
	t *testing.T
	c *agentapi.Client
}

func (e *execClient) run(argv ...string) execResult {
	e.t.Helper()
	return run(e.t, e.c, "", argv...)
}
