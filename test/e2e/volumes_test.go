package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// volume creates a volume of size for the test and removes it afterwards
// (cleanups run last-in first-out: after the sandboxes made later).
func (e env) volume(t *testing.T, size string) string {
	t.Helper()
	name := "t-" + statedir.RandomID(8)
	e.must(t, "volume", "create", name, "--size", size)
	t.Cleanup(func() { e.run(t, nil, "volume", "rm", name) })
	return name
}

// volumeImage is the host path of volume name's image.
func (e env) volumeImage(t *testing.T, name string) string {
	t.Helper()
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(e.must(t, "volume", "inspect", name, "--json")), &v); err != nil || v.ID == "" {
		t.Fatalf("volume inspect %s: %v", name, err)
	}
	return filepath.Join(e.state, "volumes", v.ID+".img")
}

// TestVolumes: a file written to a volume in one sandbox is read in a
// second after the first is removed; two read-only mounts see the same
// bytes at once and cannot write, root or not, and leave the image
// unchanged; a mount that would make two writers, or a writer and
// readers, is refused with a clear error, as is removing a mounted
// volume; on qemu a pause and resume keeps the volume.
func TestVolumes(t *testing.T) {
	e := setup(t)
	vol := e.volume(t, "64M")
	w := e.create(t, "-v", vol+":/data")
	e.must(t, "exec", w, "--", "sh", "-c", "mkdir -p /data/d && head -c 100000 /dev/urandom > /data/d/blob && echo one > /data/f") // no sync: rm flushes
	want := strings.Fields(e.must(t, "exec", w, "--", "sha256sum", "/data/d/blob"))[0]

	// Filling the volume fills only it: the write stops at its size, the
	// guest's root disk still takes writes, the image keeps its size.
	img := e.volumeImage(t, vol)
	r := e.run(t, nil, "exec", w, "--", "sh", "-c", "dd if=/dev/zero of=/data/fill bs=1M 2>&1; echo root > /root/after && cat /root/after; rm /data/fill")
	if !strings.Contains(r.stdout, "No space left") || !strings.Contains(r.stdout, "root\n") {
		t.Errorf("filling the volume: %+v", r)
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() != 64<<20 {
		t.Errorf("the image grew past the volume's size: %v %v", fi.Size(), err)
	}

	for _, spec := range []string{vol + ":/x", vol + ":/x:ro"} {
		r := e.run(t, nil, "create", "-v", spec)
		if r.code == 0 {
			e.run(t, nil, "rm", strings.TrimSpace(r.stdout))
			t.Fatalf("create -v %s while %s writes it succeeded", spec, w)
		}
		if !strings.Contains(r.stderr, "mounted read-write by sandbox "+w) {
			t.Errorf("create -v %s: the refusal does not say who holds it: %s", spec, r.stderr)
		}
	}
	if r := e.run(t, nil, "volume", "rm", vol); r.code == 0 || !strings.Contains(r.stderr, w) {
		t.Errorf("volume rm of a mounted volume: exit %d, %s", r.code, r.stderr)
	}
	if r := e.run(t, nil, "snapshot", w, "--name", "s-"+statedir.RandomID(6)); r.code == 0 || !strings.Contains(r.stderr, "volume") {
		t.Errorf("snapshot of a sandbox with a volume: exit %d, %s", r.code, r.stderr)
	}
	e.must(t, "pause", w)
	e.must(t, "resume", w)
	if got := e.must(t, "exec", w, "--", "cat", "/data/f"); got != "one\n" {
		t.Errorf("after pause and resume: %q", got)
	}
	e.must(t, "rm", w)

	before := sha256File(t, img)
	var readers []string
	for range 2 {
		readers = append(readers, e.create(t, "-v", vol+":/ro:ro"))
	}
	for _, r := range readers {
		got := strings.Fields(e.must(t, "exec", r, "--", "sha256sum", "/ro/d/blob"))[0]
		if got != want {
			t.Errorf("reader %s sees %s, the writer wrote %s", r, got, want)
		}
		if res := e.run(t, nil, "exec", r, "--", "sh", "-c", "echo x > /ro/new || exit 1; echo written"); res.code == 0 {
			t.Errorf("reader %s wrote its read-only volume: %+v", r, res)
		}
		e.run(t, nil, "exec", r, "--", "sh", "-c", "mount -o remount,rw /ro; echo x > /ro/new2")
	}
	if r := e.run(t, nil, "create", "-v", vol+":/w"); r.code == 0 || !strings.Contains(r.stderr, "mounted read-only by sandbox") {
		t.Errorf("a writer beside readers: exit %d, %s", r.code, r.stderr)
	}
	var info struct {
		Attachments []struct {
			SandboxID string `json:"sandbox_id"`
			ReadOnly  bool   `json:"read_only"`
		} `json:"attachments"`
	}
	if err := json.Unmarshal([]byte(e.must(t, "volume", "inspect", vol, "--json")), &info); err != nil || len(info.Attachments) != 2 || !info.Attachments[0].ReadOnly {
		t.Errorf("inspect: %+v %v", info, err)
	}
	for _, r := range readers {
		e.must(t, "rm", r)
	}
	if after := sha256File(t, img); after != before {
		t.Errorf("read-only mounts changed the volume's image")
	}
	// Grown while unmounted, the filesystem fills the new size at the
	// next read-write mount, with its files.
	e.must(t, "volume", "resize", vol, "--size", "128M")
	g := e.create(t, "-v", vol+":/data")
	out := e.must(t, "exec", g, "--", "sh", "-c", "cat /data/f; df -k /data | tail -1")
	if f := strings.Fields(out); len(f) < 3 || f[0] != "one" {
		t.Errorf("after the resize: %q", out)
	} else if kb, _ := strconv.Atoi(f[2]); kb < 100<<10 {
		t.Errorf("the filesystem did not grow to the volume's new size: %q", out)
	}
	e.must(t, "rm", g)
	e.must(t, "volume", "rm", vol)
	if _, err := os.Stat(img); !os.IsNotExist(err) {
		t.Errorf("volume rm left the image: %v", err)
	}
}

// TestVolumeDurability kills the VMM (qemu, or gVisor's sentry) while
// the guest appends to a volume and fsyncs after each line: every line
// the guest acknowledged after its fsync is on the volume afterwards.
func TestVolumeDurability(t *testing.T) {
	e := setup(t)
	vol := e.volume(t, "64M")
	id := e.create(t, "-v", vol+":/data")
	const script = `
import os, sys
f = open("/data/log", "a")
for i in range(1, 1000000):
    f.write("line %d\n" % i)
    f.flush()
    os.fsync(f.fileno())
    print(i, flush=True)
`
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e.cmd(ctx, nil, "exec", id, "--", "python3", "-c", script)
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	acked := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		n, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
		if err != nil {
			t.Fatalf("unexpected output %q", sc.Text())
		}
		acked = n
		if acked == 50 {
			if err := syscall.Kill(vmmPID(t, id), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	_ = c.Wait()
	if acked < 50 {
		t.Fatalf("the guest acknowledged only %d writes before its exec ended", acked)
	}
	testutil.WaitFor(t, time.Minute, func() bool { // the sandbox fails
		return strings.Contains(e.must(t, "inspect", id), "failed")
	})
	e.must(t, "rm", id)
	// Read-write, so that the journal of the killed guest is replayed.
	check := e.create(t, "-v", vol+":/data")
	got := e.must(t, "exec", check, "--", "cat", "/data/log")
	have := map[string]bool{}
	for _, l := range strings.Split(got, "\n") {
		have[l] = true
	}
	for i := 1; i <= acked; i++ {
		if !have[fmt.Sprintf("line %d", i)] {
			t.Fatalf("line %d of %d acknowledged is missing after the kill (%d lines present)", i, acked, len(have)-1)
		}
	}
	t.Logf("%d acknowledged writes, all present", acked)
}

// TestHostMounts: a host directory is shared read-only by default (gvisor:
// through the gofer; qemu: virtio-fs), a read-write one needs a nosuid,
// nodev host mount, and on qemu a sandbox with one cannot pause.
func TestHostMounts(t *testing.T) {
	e := setup(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "in.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.run(t, nil, "run", "--mount", dir+":/h", "--", "sh", "-c", "cat /h/in.txt; echo x > /h/new && echo wrote")
	if !strings.Contains(r.stdout, "from the host") || strings.Contains(r.stdout, "wrote") {
		t.Fatalf("read-only host mount: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); err == nil {
		t.Fatal("the guest wrote into a read-only host mount")
	}
	if r := e.run(t, nil, "run", "--mount", dir+":/h:rw", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "nosuid") {
		t.Fatalf("read-write host mount on a suid host mount: exit %d, %s", r.code, r.stderr)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	id := e.create(t, "--mount", dir+":/h:rw")
	e.must(t, "exec", id, "--", "sh", "-c", "echo back > /h/out.txt")
	if b, err := os.ReadFile(filepath.Join(dir, "out.txt")); err != nil || string(b) != "back\n" {
		t.Fatalf("host side of a read-write mount: %q %v", b, err)
	}
	if !onGVisor() {
		if r := e.run(t, nil, "pause", id); r.code == 0 || !strings.Contains(r.stderr, "virtio-fs") {
			t.Errorf("pause of a qemu sandbox with a host mount: exit %d, %s", r.code, r.stderr)
		}
		if got := e.must(t, "exec", id, "--", "cat", "/h/out.txt"); got != "back\n" {
			t.Errorf("after the refused pause: %q", got)
		}
		return
	}
	// gVisor reaches the directory through its gofer, which a restore
	// opens again: the pause keeps the mount, written both ways.
	e.must(t, "pause", id)
	if err := os.WriteFile(filepath.Join(dir, "while-paused.txt"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := e.must(t, "exec", id, "--", "sh", "-c", "cat /h/out.txt /h/while-paused.txt; echo again > /h/out2.txt"); got != "back\nhost\n" {
		t.Errorf("after a pause and resume: %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out2.txt")); err != nil || string(b) != "again\n" {
		t.Errorf("host side after the resume: %q %v", b, err)
	}
}

// TestThreat011HostMountEscapes: through a host mount the guest reaches
// the directory named and nothing outside it, on either runtime (gvisor's
// gofer, qemu's virtio-fs): not through absolute or relative symlinks,
// "..", hard links, device nodes, a symlink swapped in for the directory
// while the sandbox runs, or set-id bits; a read-only mount refuses root's
// writes, remount included (threats 7, 8, 9, 11).
func TestThreat011HostMountEscapes(t *testing.T) {
	e := setup(t)
	parent := t.TempDir()
	ro, rw := filepath.Join(parent, "ro"), filepath.Join(parent, "rw")
	canary := filepath.Join(parent, "canary")
	const secret = "host-canary-5e1d"
	for _, d := range []string{ro, rw} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "in.txt"), []byte("inside\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for name, target := range map[string]string{"abs": canary, "rel": "../canary", "up": ".."} {
			if err := os.Symlink(target, filepath.Join(d, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(canary, []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(rw, rw, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(rw, unix.MNT_DETACH) })
	if err := unix.Mount("", rw, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	id := e.create(t, "--mount", ro+":/ro", "--mount", rw+":/rw:rw")
	if got := e.must(t, "exec", id, "--", "cat", "/ro/in.txt", "/rw/in.txt"); got != "inside\ninside\n" {
		t.Fatalf("the host files: %q", got)
	}
	probe := "for p in /ro/abs /ro/rel /ro/up/canary /ro/../canary /rw/abs /rw/rel /rw/up/canary /rw/../canary; do cat $p 2>/dev/null; done; " +
		"find / -xdev -name canary 2>/dev/null | xargs cat 2>/dev/null; true"
	if out := e.must(t, "exec", id, "--", "sh", "-c", probe); strings.Contains(out, secret) {
		t.Fatalf("the guest read the host canary: %q", out)
	}
	if r := e.run(t, nil, "exec", id, "--", "sh", "-c", "echo x > /ro/new; mount -o remount,rw /ro 2>/dev/null; echo x > /ro/new2; touch /ro/in.txt"); r.code == 0 {
		t.Errorf("writes to a read-only host mount succeeded: %+v", r)
	}
	for _, n := range []string{"new", "new2"} {
		if _, err := os.Lstat(filepath.Join(ro, n)); err == nil {
			t.Errorf("the guest created %s in a read-only host mount", n)
		}
	}
	e.run(t, nil, "exec", id, "--", "sh", "-c", "echo w > /rw/w; ln /etc/passwd /rw/hard; mknod /rw/null c 1 3; mknod /rw/blk b 8 0; mkfifo /rw/fifo; chmod 6755 /rw/w")
	if b, err := os.ReadFile(filepath.Join(rw, "w")); err != nil || string(b) != "w\n" {
		t.Fatalf("the read-write mount did not take the guest's write: %q %v", b, err)
	}
	for _, n := range []string{"hard", "null", "blk"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(rw, n), &st); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR || st.Mode&unix.S_IFMT == unix.S_IFBLK {
			// A node may exist as a file, but never as a device that a
			// host process could open: the host mount is nodev.
			f, err := os.OpenFile(filepath.Join(rw, n), os.O_RDONLY, 0)
			if err == nil {
				f.Close()
				t.Errorf("the guest planted a usable device node %s on the host", n)
			}
		}
		if n == "hard" && st.Nlink > 1 {
			t.Errorf("the guest hard-linked a file from outside the mount into it")
		}
	}
	if fi, err := os.Stat(filepath.Join(rw, "w")); err == nil && fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(rw, &st); err != nil || st.Flags&unix.ST_NOSUID == 0 {
			t.Errorf("a set-id file the guest made is live at the host path: %v", fi.Mode())
		}
	}
	// Swap the read-only directory for a symlink to its parent: the guest
	// keeps the directory it was given.
	if err := os.Rename(ro, ro+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(parent, ro); err != nil {
		t.Fatal(err)
	}
	out := e.must(t, "exec", id, "--", "sh", "-c", "ls /ro; cat /ro/canary 2>/dev/null; true")
	if strings.Contains(out, secret) || !strings.Contains(out, "in.txt") {
		t.Errorf("after the swap the guest sees %q", out)
	}
}
