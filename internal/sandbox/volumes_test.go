package sandbox

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// newVolumeManager is a manager on an empty state dir and catalog, with no
// free-space reserve (the test machine's disk is not under test).
func newVolumeManager(t *testing.T) *Manager {
	t.Helper()
	root := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &Manager{L: statedir.Layout{Root: root}, Store: st, DiskReserve: -1}
}

// TestVolumeLifecycle: create makes a real ext4 image of the size asked
// for, list and get see it, another tenant does not, remove deletes the
// image; each change is audited.
func TestVolumeLifecycle(t *testing.T) {
	t.Parallel()
	m := newVolumeManager(t)
	ctx := t.Context()
	v, err := m.CreateVolume(ctx, alice, "data", 32)
	if err != nil {
		t.Fatal(err)
	}
	img := m.L.VolumeImage(v.ID)
	fi, err := os.Stat(img)
	if err != nil || fi.Size() != 32<<20 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("image: %v %v", fi, err)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	magic := make([]byte, 2)
	_, err = f.ReadAt(magic, 1024+0x38) // the ext4 superblock's s_magic
	f.Close()
	if err != nil || binary.LittleEndian.Uint16(magic) != 0xEF53 {
		t.Fatalf("not an ext4 image: %x %v", magic, err)
	}
	for _, tc := range []struct {
		name string
		size int
		want error
	}{
		{"data", 32, errdefs.ErrConflict},
		{"Data", 32, errdefs.ErrInvalid},
		{"-x", 32, errdefs.ErrInvalid},
		{"small", MinVolumeMiB - 1, errdefs.ErrInvalid},
		{"huge", MaxDiskMiB + 1, errdefs.ErrInvalid},
	} {
		if _, err := m.CreateVolume(ctx, alice, tc.name, tc.size); !errors.Is(err, tc.want) {
			t.Errorf("create %q %d MiB: %v, want %v", tc.name, tc.size, err, tc.want)
		}
	}
	info, err := m.GetVolume(ctx, alice, "", "data")
	if err != nil || info.ID != v.ID || info.AllocatedBytes <= 0 || info.AllocatedBytes >= 32<<20 || len(info.Attachments) != 0 {
		t.Fatalf("get: %+v %v (a fresh image is sparse)", info, err)
	}
	// Bob neither sees nor touches it, even naming alice as the tenant;
	// an admin does.
	if _, err := m.GetVolume(ctx, bob, "alice", "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob's get: %v", err)
	}
	if err := m.RemoveVolume(ctx, bob, "alice", "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob's remove: %v", err)
	}
	if _, err := m.ResizeVolume(ctx, bob, "alice", "data", 64); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob's resize: %v", err)
	}
	if vs, err := m.ListVolumes(ctx, bob, "alice", true); err != nil || len(vs) != 0 {
		t.Fatalf("bob's list: %+v %v", vs, err)
	}
	if vs, err := m.ListVolumes(ctx, admin, "", true); err != nil || len(vs) != 1 || vs[0].Tenant != "alice" {
		t.Fatalf("admin's list: %+v %v", vs, err)
	}
	if _, err := m.GetVolume(ctx, admin, "alice", "data"); err != nil {
		t.Fatalf("admin's get: %v", err)
	}
	if got, err := m.ResizeVolume(ctx, alice, "", "data", 48); err != nil || got.SizeMiB != 48 {
		t.Fatalf("resize: %+v %v", got, err)
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() != 48<<20 {
		t.Fatalf("image after resize: %v %v", fi, err)
	}
	if _, err := m.ResizeVolume(ctx, alice, "", "data", 32); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("shrink: %v", err)
	}
	if err := m.RemoveVolume(ctx, alice, "", "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("image after remove: %v", err)
	}
	evs, err := m.Store.ListEvents(ctx, store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		got = append(got, e.Action+" "+e.Tenant)
	}
	slices.Sort(got)
	if want := []string{"volume.create alice", "volume.delete alice", "volume.resize alice"}; !slices.Equal(got, want) {
		t.Fatalf("audit trail %q, want %q", got, want)
	}
}

// TestVolumeQuotas: max_volumes counts a tenant's volumes; max_disk_mb
// counts their full sizes with the sandboxes' disks, for volume creates
// and resizes and for sandbox creates.
func TestVolumeQuotas(t *testing.T) {
	t.Parallel()
	m := newVolumeManager(t)
	ctx := t.Context()
	c := Caller{Tenant: "alice", KeyID: "ka", Limits: Limits{MaxVolumes: 2, MaxDiskMiB: 100}}
	for _, name := range []string{"a", "b"} {
		if _, err := m.CreateVolume(ctx, c, name, 32); err != nil {
			t.Fatal(err)
		}
	}
	quota := func(err error) string {
		if q, ok := errors.AsType[*QuotaError](err); ok && errors.Is(err, errdefs.ErrResourceExhausted) {
			return q.Quota
		}
		return "no quota error: " + errString(err)
	}
	if got := quota(func() error { _, err := m.CreateVolume(ctx, c, "c", 16); return err }()); got != "max_volumes" {
		t.Fatalf("a third volume: %s", got)
	}
	c.Limits.MaxVolumes = 10
	if got := quota(func() error { _, err := m.CreateVolume(ctx, c, "c", 64); return err }()); got != "max_disk_mb" {
		t.Fatalf("64 MiB more over 100: %s", got)
	}
	if _, err := m.CreateVolume(ctx, c, "c", 32); err != nil {
		t.Fatalf("32 MiB more within 100: %v", err)
	}
	if got := quota(func() error { _, err := m.ResizeVolume(ctx, c, "", "a", 40); return err }()); got != "max_disk_mb" {
		t.Fatalf("growing past the quota: %s", got)
	}
	if _, err := m.ResizeVolume(ctx, c, "", "a", 36); err != nil {
		t.Fatalf("growing within the quota: %v", err)
	}
	// A sandbox's disk counts with the volumes (100 used of 100).
	if _, err := m.reserve(ctx, c, "alice", 1, 1, 128, 1); quota(err) != "max_disk_mb" {
		t.Fatalf("a sandbox disk over the volumes: %v", err)
	}
	// Another tenant's volumes do not count against alice.
	if _, err := m.CreateVolume(ctx, Caller{Tenant: "bob", KeyID: "kb"}, "a", 1024); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveVolume(ctx, c, "", "c"); err != nil {
		t.Fatal(err)
	}
	rel, err := m.reserve(ctx, c, "alice", 1, 1, 128, 32)
	if err != nil {
		t.Fatalf("a sandbox disk within the quota: %v", err)
	}
	rel()
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func TestValidateGuestPath(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"/data", "/mnt/a/b", "/home/user/work", "/procx", "/device", "/srv/.hidden", "/a b"} {
		if err := ValidateGuestPath(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{"", "data", "./data", "/", "/data/", "/a//b", "/a/./b", "/a/../b", "/..",
		"/proc", "/proc/x", "/sys", "/sys/fs", "/dev", "/dev/shm", "/.airlock-agent", "/.airlock-agent/x",
		"/a,b", "/a:b", "/a\\b", "/a\nb", "/a\x00b", "/" + strings.Repeat("a", 1024)} {
		if err := ValidateGuestPath(p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q accepted: %v", p, err)
		}
	}
}

// TestHostMountChecks: host paths are absolute, clean, real directories
// with no symlink anywhere, away from the state dir; the local user may
// mount any, an API caller only under Manager.HostMountRoots.
func TestHostMountChecks(t *testing.T) {
	t.Parallel()
	m := newVolumeManager(t)
	ctx := t.Context()
	dir := filepath.Dir(m.L.Root)
	share := filepath.Join(dir, "share")
	for _, d := range []string{filepath.Join(share, "sub"), filepath.Join(dir, "other"), filepath.Join(dir, "sharex"), filepath.Join(m.L.Root, "inside")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(share, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "other"), filepath.Join(share, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(share, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	local := Local()
	check := func(c Caller, p string) error {
		_, err := m.resolveMounts(ctx, c, nil, []HostMount{{HostPath: p, Path: "/x"}})
		return err
	}
	for _, tc := range []struct {
		name string
		c    Caller
		path string
		want error // nil: allowed
	}{
		{"local, any directory", local, filepath.Join(dir, "other"), nil},
		{"relative", local, "share", errdefs.ErrInvalid},
		{"not clean", local, share + "/../share", errdefs.ErrInvalid},
		{"trailing slash", local, share + "/", errdefs.ErrInvalid},
		{"symlink as the last component", local, filepath.Join(dir, "link"), errdefs.ErrInvalid},
		{"symlink as a middle component", local, filepath.Join(dir, "link", "sub"), errdefs.ErrInvalid},
		{"symlink out of a root", local, filepath.Join(share, "escape"), errdefs.ErrInvalid},
		{"a file", local, filepath.Join(share, "file"), errdefs.ErrInvalid},
		{"missing", local, filepath.Join(dir, "missing"), errdefs.ErrInvalid},
		{"the state dir", local, m.L.Root, errdefs.ErrInvalid},
		{"inside the state dir", local, filepath.Join(m.L.Root, "inside"), errdefs.ErrInvalid},
		{"around the state dir", local, dir, errdefs.ErrInvalid},
		{"the root", local, "/", errdefs.ErrInvalid},
		{"API caller, no roots", alice, share, errdefs.ErrPermissionDenied},
		{"admin API caller, no roots", admin, share, errdefs.ErrPermissionDenied},
	} {
		if err := check(tc.c, tc.path); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s (%s): %v, want %v", tc.name, tc.path, err, tc.want)
		}
	}

	m.HostMountRoots = []string{share}
	for _, tc := range []struct {
		name string
		path string
		want error
	}{
		{"the root itself", share, nil},
		{"under the root", filepath.Join(share, "sub"), nil},
		{"outside the roots", filepath.Join(dir, "other"), errdefs.ErrPermissionDenied},
		{"a sibling sharing the root's prefix", filepath.Join(dir, "sharex"), errdefs.ErrPermissionDenied},
		{"a symlink under the root", filepath.Join(share, "escape"), errdefs.ErrInvalid},
		{"dot-dot out of the root", share + "/../other", errdefs.ErrInvalid},
	} {
		if err := check(alice, tc.path); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s (%s): %v, want %v", tc.name, tc.path, err, tc.want)
		}
	}

	// Read-write needs a nosuid, nodev host mount (threat 9).
	if _, err := m.resolveMounts(ctx, alice, nil, []HostMount{{HostPath: share, Path: "/rw", ReadWrite: true}}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "nosuid") {
		t.Fatalf("read-write on a suid mount: %v", err)
	}
	testutil.RequireRoot(t) // the rest needs a nosuid bind mount
	sub := filepath.Join(share, "sub")
	if err := unix.Mount(sub, sub, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	if err := unix.Mount("", sub, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	// Host mounts are read-only unless asked for read-write.
	ms, err := m.resolveMounts(ctx, alice, nil, []HostMount{{HostPath: share, Path: "/ro"}, {HostPath: sub, Path: "/rw", ReadWrite: true}})
	if err != nil || len(ms) != 2 || !ms[0].ReadOnly || ms[1].ReadOnly || ms[0].HostPath != share {
		t.Fatalf("modes: %+v %v", ms, err)
	}
}

// TestResolveVolumeMounts: volumes are found in the caller's tenant only;
// paths are checked, may not overlap, and a sandbox has at most MaxMounts.
func TestResolveVolumeMounts(t *testing.T) {
	t.Parallel()
	m := newVolumeManager(t)
	ctx := t.Context()
	v, err := m.CreateVolume(ctx, alice, "data", 16)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := m.resolveMounts(ctx, alice, []VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}, nil)
	if err != nil || len(ms) != 1 || ms[0] != (store.Mount{VolumeID: v.ID, VolumeName: "data", Path: "/data", ReadOnly: true}) {
		t.Fatalf("alice: %+v %v", ms, err)
	}
	// Tenant B cannot mount tenant A's volume: it is not found.
	if _, err := m.resolveMounts(ctx, bob, []VolumeMount{{Name: "data", Path: "/data"}}, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob: %v", err)
	}
	for name, vols := range map[string][]VolumeMount{
		"bad path":  {{Name: "data", Path: "data"}},
		"bad name":  {{Name: "../x", Path: "/data"}},
		"same path": {{Name: "data", Path: "/d", ReadOnly: true}, {Name: "data", Path: "/d", ReadOnly: true}},
		"nested":    {{Name: "data", Path: "/d", ReadOnly: true}, {Name: "data", Path: "/d/e", ReadOnly: true}},
		"too many":  slices.Repeat([]VolumeMount{{Name: "data", Path: "/d", ReadOnly: true}}, MaxMounts+1),
	} {
		if _, err := m.resolveMounts(ctx, alice, vols, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A volume and a host mount may not nest either.
	if _, err := m.resolveMounts(ctx, Local(), nil, []HostMount{{HostPath: t.TempDir(), Path: "/srv"}, {HostPath: t.TempDir(), Path: "/srv/x"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("nested host mounts: %v", err)
	}
	// Prefix-sharing paths that do not nest are fine.
	if _, err := m.resolveMounts(ctx, alice, []VolumeMount{{Name: "data", Path: "/d", ReadOnly: true}, {Name: "data", Path: "/de", ReadOnly: true}}, nil); err != nil {
		t.Fatalf("/d and /de: %v", err)
	}
}

// TestCreateWithVolumes drives the manager's create with mounts on the
// fake runtime: one writer or many readers across sandboxes, a qemu
// read-write mount marks the volume guest-written, which gvisor then
// refuses; host mounts work on qemu too; a sandbox with mounts is never
// snapshotted or forked; its volume is free again once it is removed.
func TestCreateWithVolumes(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx := t.Context()
	c := Caller{Tenant: "alice", KeyID: "ka", Via: "api", Limits: Limits{MaxSandboxes: 10, MaxVCPUs: 10, MaxMemoryMiB: 8192}}
	if _, err := r.m.CreateVolume(ctx, c, "data", 16); err != nil {
		t.Fatal(err)
	}
	rt := "gvisor"
	r.m.Runtime = func(context.Context) (string, error) { return rt, nil }

	w, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatalf("create with a volume: %v", err)
	}
	if len(w.Mounts) != 1 || w.Mounts[0].VolumeName != "data" || w.Mounts[0].ReadOnly {
		t.Fatalf("mounts: %+v", w.Mounts)
	}
	for _, ro := range []bool{false, true} {
		if _, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "data", Path: "/data", ReadOnly: ro}}}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("second mount (read-only %v) while written: %v", ro, err)
		}
	}
	// No snapshot or fork of a sandbox with mounts.
	if _, err := r.m.Snapshot(ctx, c, w.ID, "snap", false); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "snapshots and forks") {
		t.Fatalf("snapshot: %v", err)
	}
	if _, err := r.m.Fork(ctx, c, w.ID, ForkOptions{Count: 1}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fork: %v", err)
	}
	if sb, err := r.m.Get(ctx, c, w.ID); err != nil || sb.State != store.StateRunning {
		t.Fatalf("after the refused snapshot and fork: %+v %v", sb, err)
	}
	if err := r.m.RemoveVolume(ctx, c, "", "data"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("remove while mounted: %v", err)
	}
	if err := r.m.Remove(ctx, c, w.ID); err != nil {
		t.Fatal(err)
	}
	// Readers, many of them, once the writer is gone.
	var readers []string
	for range 2 {
		sb, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}})
		if err != nil {
			t.Fatalf("reader: %v", err)
		}
		readers = append(readers, sb.ID)
	}
	info, err := r.m.GetVolume(ctx, c, "", "data")
	if err != nil || len(info.Attachments) != 2 || info.GuestWritten {
		t.Fatalf("attachments: %+v %v", info, err)
	}
	for _, id := range readers {
		if err := r.m.Remove(ctx, c, id); err != nil {
			t.Fatal(err)
		}
	}
	// A host mount on qemu (virtio-fs) is recorded like one on gvisor.
	rt = "qemu"
	hm, err := r.m.Create(ctx, Local(), CreateOptions{MemoryMiB: 256, HostMounts: []HostMount{{HostPath: t.TempDir(), Path: "/src"}}})
	if err != nil || len(hm.Mounts) != 1 || !hm.Mounts[0].ReadOnly || hm.Mounts[0].HostPath == "" {
		t.Fatalf("a host mount on qemu: %+v %v", hm.Mounts, err)
	}
	if err := r.m.Remove(ctx, Local(), hm.ID); err != nil {
		t.Fatal(err)
	}
	// A qemu writer marks the volume guest-written; gvisor then refuses it.
	q, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatalf("qemu writer: %v", err)
	}
	if info, _ := r.m.GetVolume(ctx, c, "", "data"); !info.GuestWritten {
		t.Fatal("a qemu read-write mount did not mark the volume guest-written")
	}
	// A qemu writer refused because the volume is mounted elsewhere does
	// not mark the volume it never got.
	if _, err := r.m.CreateVolume(ctx, c, "other", 16); err != nil {
		t.Fatal(err)
	}
	rt = "gvisor"
	g, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "other", Path: "/o", ReadOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	rt = "qemu"
	if _, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "other", Path: "/o"}}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("qemu writer of a volume a reader has: %v", err)
	}
	if info, _ := r.m.GetVolume(ctx, c, "", "other"); info.GuestWritten {
		t.Fatal("a refused qemu create marked the volume guest-written")
	}
	if err := r.m.Remove(ctx, c, g.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Remove(ctx, c, q.ID); err != nil {
		t.Fatal(err)
	}
	rt = "gvisor"
	if _, err := r.m.Create(ctx, c, CreateOptions{MemoryMiB: 256, Volumes: []VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("gvisor mount of a guest-written volume: %v", err)
	}
	if err := r.m.RemoveVolume(ctx, c, "", "data"); err != nil {
		t.Fatalf("remove once unmounted: %v", err)
	}
}

// TestSnapshotRefusedWithHostMount: a sandbox with only a host mount is
// refused a snapshot too.
func TestSnapshotRefusedWithHostMount(t *testing.T) {
	r := newRunning(t)
	dir := t.TempDir()
	id := r.start(t, "alice", func(sb *store.Sandbox, _ *shim.Config) {
		sb.Mounts = []store.Mount{{HostPath: dir, Path: "/src", ReadOnly: true}}
	})
	_, err := r.m.Snapshot(t.Context(), alice, id, "snap", true)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "host directory") {
		t.Fatalf("snapshot: %v", err)
	}
}
