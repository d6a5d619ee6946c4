package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Volumes (threats 8, 11, 32, 34, 38). A volume is one ext4 image file in
// the state dir, of a fixed size (a guest that fills it fills only it),
// owned by a tenant and counted in its disk quota. A sandbox mounts it at
// create, read-write or read-only, for its whole life:
//   - qemu attaches the image as a virtio-blk disk and the guest kernel
//     mounts it: its blocks are then guest-written, and the host never
//     mounts such an image itself;
//   - gvisor has the host kernel mount the image (a loop device) and binds
//     it into the sandbox: the guest reaches it through gVisor's gofer,
//     never its blocks. A volume a microVM guest has written cannot be
//     attached to a gvisor sandbox (store.Volume.GuestWritten).
// One kernel at a time may write an ext4 filesystem: a volume is mounted
// read-write by one sandbox, or read-only by any number, never both
// (store.attachVolumes).

const (
	// MinVolumeMiB is the smallest volume (ext4 and its journal need room).
	MinVolumeMiB = 16
	// MaxMounts bounds a sandbox's volumes and host mounts together.
	MaxMounts = runtime.MaxMounts
)

var volumeName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`) })

// ValidateVolumeName checks a user-given volume name.
func ValidateVolumeName(name string) error {
	if !volumeName().MatchString(name) {
		return fmt.Errorf("%w: volume name %q: 1-63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit", errdefs.ErrInvalid, name)
	}
	return nil
}

// ErrHostMountSetid refuses a read-write host mount whose host mount lets
// set-id bits take effect (runtime.CheckWritableHostDir). It is an
// ErrFailedPrecondition.
var ErrHostMountSetid = fmt.Errorf("%w: read-write host mount", errdefs.ErrFailedPrecondition)

// VolumeInfo is a volume with what the catalog and the host know of it.
type VolumeInfo struct {
	store.Volume
	// AllocatedBytes is what its image takes on the host's disk: the
	// blocks its filesystem has written (a guest's fstrim gives freed
	// ones back).
	AllocatedBytes int64
	Attachments    []store.Attachment
}

// volumeTenant is whose volumes c acts on: c's tenant, or for an admin the
// tenant asked for, if any.
func (c Caller) volumeTenant(tenant string) string { return c.snapshotTenant(tenant) }

// CreateVolume makes an empty ext4 volume of sizeMiB for c's tenant within
// its quotas (max_volumes, and max_disk_mb counting its full size), and
// audits volume.create.
func (m *Manager) CreateVolume(ctx context.Context, c Caller, name string, sizeMiB int) (store.Volume, error) {
	if err := ValidateVolumeName(name); err != nil {
		return store.Volume{}, err
	}
	if sizeMiB < MinVolumeMiB || sizeMiB > MaxDiskMiB {
		return store.Volume{}, fmt.Errorf("%w: a volume's size must be between %d MiB and 1 TiB", errdefs.ErrInvalid, MinVolumeMiB)
	}
	if c.Tenant != "" {
		vols, err := m.tenantVolumes(ctx, c.Tenant)
		if err != nil {
			return store.Volume{}, err
		}
		lim := c.Limits.Or(DefaultLimits)
		if len(vols)+1 > lim.MaxVolumes {
			return store.Volume{}, &QuotaError{Quota: "max_volumes", Used: len(vols), Need: 1, Max: lim.MaxVolumes, What: "this volume"}
		}
		used, err := m.tenantDiskMiB(ctx, c.Tenant)
		if err != nil {
			return store.Volume{}, err
		}
		if used+sizeMiB > lim.MaxDiskMiB {
			return store.Volume{}, &QuotaError{Quota: "max_disk_mb", Used: used, Need: sizeMiB, Max: lim.MaxDiskMiB, Unit: " MiB", What: "this volume"}
		}
	}
	if err := m.CheckSpace(ctx, fmt.Sprintf("volume %q (%d MiB)", name, sizeMiB), int64(sizeMiB)<<20); err != nil {
		return store.Volume{}, err
	}
	if _, err := m.Store.GetVolume(ctx, c.Tenant, name); err == nil {
		return store.Volume{}, fmt.Errorf("%w: volume %q exists", errdefs.ErrConflict, name)
	}
	v := store.Volume{ID: statedir.NewVolumeID(), Tenant: c.Tenant, Name: name, SizeMiB: sizeMiB, Created: time.Now()}
	img := m.L.VolumeImage(v.ID)
	if err := makeVolumeImage(ctx, img, sizeMiB); err != nil {
		return store.Volume{}, err
	}
	if err := m.Store.CreateVolume(ctx, v); err != nil {
		_ = os.Remove(img)
		return store.Volume{}, err
	}
	m.audit(ctx, c, "", "volume.create", map[string]any{"name": name, "volume_id": v.ID, "size_mib": sizeMiB})
	return v, nil
}

// makeVolumeImage writes a sparse ext4 image of sizeMiB at img.
func makeVolumeImage(ctx context.Context, img string, sizeMiB int) error {
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	err = f.Truncate(int64(sizeMiB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// No reserved blocks (the volume is the user's), lazy inode
		// table and journal initialization (sparse until used), root
		// directory owned by root.
		out, merr := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
			"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", img).CombinedOutput()
		if merr != nil {
			err = fmt.Errorf("mkfs.ext4: %w: %s", merr, strings.TrimSpace(string(out)))
		}
	}
	if err != nil {
		_ = os.Remove(img)
		return fmt.Errorf("create volume: %w", err)
	}
	return nil
}

// tenantVolumes lists one tenant's volumes.
func (m *Manager) tenantVolumes(ctx context.Context, tenant string) ([]store.Volume, error) {
	all, err := m.Store.ListVolumes(ctx)
	if err != nil {
		return nil, err
	}
	var out []store.Volume
	for _, v := range all {
		if v.Tenant == tenant {
			out = append(out, v)
		}
	}
	return out, nil
}

// ListVolumes returns c's tenant's volumes (tenant's for an admin who
// names one; every tenant's with all, admins only).
func (m *Manager) ListVolumes(ctx context.Context, c Caller, tenant string, all bool) ([]VolumeInfo, error) {
	var vols []store.Volume
	var err error
	if all && c.Admin {
		vols, err = m.Store.ListVolumes(ctx)
	} else {
		vols, err = m.tenantVolumes(ctx, c.volumeTenant(tenant))
	}
	if err != nil {
		return nil, err
	}
	out := make([]VolumeInfo, 0, len(vols))
	for _, v := range vols {
		info, err := m.volumeInfo(ctx, v)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// GetVolume returns volume name of c's tenant (of tenant for an admin who
// names one); ErrNotFound if there is none.
func (m *Manager) GetVolume(ctx context.Context, c Caller, tenant, name string) (VolumeInfo, error) {
	v, err := m.Store.GetVolume(ctx, c.volumeTenant(tenant), name)
	if err != nil {
		return VolumeInfo{}, err
	}
	return m.volumeInfo(ctx, v)
}

func (m *Manager) volumeInfo(ctx context.Context, v store.Volume) (VolumeInfo, error) {
	info := VolumeInfo{Volume: v}
	var st unix.Stat_t
	if err := statedir.ValidateVolumeID(v.ID); err == nil && unix.Stat(m.L.VolumeImage(v.ID), &st) == nil {
		info.AllocatedBytes = st.Blocks * 512
	}
	var err error
	info.Attachments, err = m.Store.Attachments(ctx, v.ID)
	return info, err
}

// RemoveVolume deletes volume name of c's tenant (of tenant for an admin
// who names one) and its data, unless a sandbox has it mounted
// (ErrConflict), and audits volume.delete.
func (m *Manager) RemoveVolume(ctx context.Context, c Caller, tenant, name string) error {
	v, err := m.Store.DeleteVolume(ctx, c.volumeTenant(tenant), name)
	if err != nil {
		return err
	}
	if err := statedir.ValidateVolumeID(v.ID); err != nil {
		return err
	}
	if err := os.Remove(m.L.VolumeImage(v.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove volume %q's image: %w", name, err)
	}
	m.audit(ctx, c, "", "volume.delete", map[string]any{"name": v.Name, "volume_id": v.ID})
	return nil
}

// ResizeVolume grows volume name of c's tenant (of tenant for an admin who
// names one) to sizeMiB while no sandbox has it mounted (ErrConflict);
// its filesystem grows to fill the new size when a sandbox next mounts
// it. Audited as volume.resize.
func (m *Manager) ResizeVolume(ctx context.Context, c Caller, tenant, name string, sizeMiB int) (store.Volume, error) {
	if sizeMiB > MaxDiskMiB {
		return store.Volume{}, fmt.Errorf("%w: a volume's size must be at most 1 TiB", errdefs.ErrInvalid)
	}
	tenant = c.volumeTenant(tenant)
	old, err := m.Store.GetVolume(ctx, tenant, name)
	if err != nil {
		return store.Volume{}, err
	}
	grow := sizeMiB - old.SizeMiB
	if c.Tenant != "" && grow > 0 {
		used, err := m.tenantDiskMiB(ctx, tenant)
		if err != nil {
			return store.Volume{}, err
		}
		if lim := c.Limits.Or(DefaultLimits).MaxDiskMiB; used+grow > lim {
			return store.Volume{}, &QuotaError{Quota: "max_disk_mb", Used: used, Need: grow, Max: lim, Unit: " MiB", What: "this resize"}
		}
	}
	if grow > 0 {
		if err := m.CheckSpace(ctx, fmt.Sprintf("growing volume %q by %d MiB", name, grow), int64(grow)<<20); err != nil {
			return store.Volume{}, err
		}
	}
	v, err := m.Store.ResizeVolume(ctx, tenant, name, sizeMiB, func(v store.Volume) error {
		if err := statedir.ValidateVolumeID(v.ID); err != nil {
			return err
		}
		if err := os.Truncate(m.L.VolumeImage(v.ID), int64(v.SizeMiB)<<20); err != nil {
			return fmt.Errorf("resize volume %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return v, err
	}
	m.audit(ctx, c, "", "volume.resize", map[string]any{"name": v.Name, "volume_id": v.ID, "size_mib": v.SizeMiB, "old_size_mib": old.SizeMiB})
	return v, nil
}

// volumeMiB is the size of a tenant's volumes, in MiB.
func (m *Manager) volumeMiB(ctx context.Context, tenant string) (int, error) {
	vols, err := m.tenantVolumes(ctx, tenant)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, v := range vols {
		n += v.SizeMiB
	}
	return n, nil
}

// VolumeMount asks for volume Name at guest path Path.
type VolumeMount struct {
	Name     string
	Path     string
	ReadOnly bool
}

// HostMount asks for host directory HostPath at guest path Path.
type HostMount struct {
	HostPath string
	Path     string
	// ReadWrite must be asked for: host mounts are read-only by default.
	ReadWrite bool
}

// reservedGuestPaths are where a mount may not go: the guest's own
// filesystems and the agent.
var reservedGuestPaths = []string{"/proc", "/sys", "/dev", "/.airlock-agent"}

// ValidateGuestPath checks a mount's guest path: absolute, clean, not
// the root, not in the guest's system filesystems.
func ValidateGuestPath(p string) error {
	switch {
	case p == "" || !strings.HasPrefix(p, "/"):
		return fmt.Errorf("%w: mount path %q must be absolute", errdefs.ErrInvalid, p)
	case len(p) > 1024 || strings.ContainsAny(p, "\x00\n\r,:\\"):
		return fmt.Errorf("%w: mount path %q is too long or has NUL, a newline, ',', ':' or '\\'", errdefs.ErrInvalid, p)
	case path.Clean(p) != p:
		return fmt.Errorf("%w: mount path %q is not clean (no '..', '.', '//' or trailing '/')", errdefs.ErrInvalid, p)
	case p == "/":
		return fmt.Errorf("%w: a mount cannot replace the guest's root", errdefs.ErrInvalid)
	}
	for _, r := range reservedGuestPaths {
		if p == r || strings.HasPrefix(p, r+"/") {
			return fmt.Errorf("%w: mount path %q is in the guest's %s", errdefs.ErrInvalid, p, r)
		}
	}
	return nil
}

// resolveMounts checks a create's volumes and host mounts for c and
// returns them as the sandbox's mounts: volumes by id, of c's tenant
// (another tenant's is not found); host directories only for the local
// user or, for API callers, under Manager.HostMountRoots.
func (m *Manager) resolveMounts(ctx context.Context, c Caller, vols []VolumeMount, hosts []HostMount) ([]store.Mount, error) {
	if n := len(vols) + len(hosts); n > MaxMounts {
		return nil, fmt.Errorf("%w: a sandbox has at most %d volumes and host mounts (asked for %d)", errdefs.ErrInvalid, MaxMounts, n)
	}
	var out []store.Mount
	for _, vm := range vols {
		if err := ValidateVolumeName(vm.Name); err != nil {
			return nil, err
		}
		if err := ValidateGuestPath(vm.Path); err != nil {
			return nil, err
		}
		v, err := m.Store.GetVolume(ctx, c.Tenant, vm.Name)
		if err != nil {
			return nil, err
		}
		if err := statedir.ValidateVolumeID(v.ID); err != nil {
			return nil, err
		}
		out = append(out, store.Mount{VolumeID: v.ID, VolumeName: v.Name, Path: vm.Path, ReadOnly: vm.ReadOnly})
	}
	for _, hm := range hosts {
		if err := ValidateGuestPath(hm.Path); err != nil {
			return nil, err
		}
		real, err := m.checkHostMount(c, hm.HostPath, hm.ReadWrite)
		if err != nil {
			return nil, err
		}
		out = append(out, store.Mount{HostPath: real, Path: hm.Path, ReadOnly: !hm.ReadWrite})
	}
	for i, a := range out {
		for _, b := range out[i+1:] {
			if a.Path == b.Path || strings.HasPrefix(b.Path, a.Path+"/") || strings.HasPrefix(a.Path, b.Path+"/") {
				return nil, fmt.Errorf("%w: mounts at %q and %q overlap", errdefs.ErrInvalid, a.Path, b.Path)
			}
		}
	}
	return out, nil
}

// checkHostMount resolves host directory p for c: absolute, every
// component a real directory (no symlink anywhere: the path shared is the
// path named), not the state dir or around it, for an API caller under
// one of Manager.HostMountRoots, and if rw on a nosuid, nodev mount.
func (m *Manager) checkHostMount(c Caller, p string, rw bool) (string, error) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", fmt.Errorf("%w: host path %q must be absolute and clean", errdefs.ErrInvalid, p)
	}
	if !c.Local() && !underAny(p, m.HostMountRoots) {
		if len(m.HostMountRoots) == 0 {
			return "", fmt.Errorf("%w: host mounts are not allowed on this server for API callers (an admin enables them under a directory with `airlock serve --allow-host-mount DIR`)", errdefs.ErrPermissionDenied)
		}
		return "", fmt.Errorf("%w: host path %q is not under a directory this server allows (%s)", errdefs.ErrPermissionDenied, p, strings.Join(m.HostMountRoots, ", "))
	}
	fd, err := runtime.OpenDirNoSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("%w: host path %q: %v", errdefs.ErrInvalid, p, err)
	}
	if rw {
		err = runtime.CheckWritableHostDir(fd)
	}
	unix.Close(fd)
	if err != nil {
		return "", fmt.Errorf("%w: host path %q: %v", ErrHostMountSetid, p, err)
	}
	root := filepath.Clean(m.L.Root)
	if p == root || strings.HasPrefix(p, root+"/") || strings.HasPrefix(root, p+"/") || p == "/" {
		return "", fmt.Errorf("%w: host path %q holds or is inside airlock's state dir", errdefs.ErrInvalid, p)
	}
	return p, nil
}

func underAny(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, strings.TrimSuffix(r, "/")+"/") {
			return true
		}
	}
	return false
}

// checkMountsFor checks o's mounts against runtime rt: gvisor mounts a
// volume's image on the host, so never one a microVM guest has written;
// a qemu read-write mount marks the volume guest-written before the guest
// can touch it.
func (m *Manager) checkMountsFor(ctx context.Context, rt string, o CreateOptions) error {
	for _, mt := range o.mounts {
		if mt.VolumeID == "" {
			continue
		}
		v, err := m.Store.GetVolume(ctx, o.Tenant, mt.VolumeName)
		if err != nil {
			return err
		}
		switch {
		case rt == "gvisor" && v.GuestWritten:
			return fmt.Errorf("%w: volume %q has been written by a microVM's guest kernel, and airlock never mounts a guest-written filesystem on the host, which a gvisor sandbox needs; mount it in qemu sandboxes", errdefs.ErrFailedPrecondition, v.Name)
		case rt == "qemu" && !mt.ReadOnly && !v.GuestWritten:
			// A create the catalog will refuse (the volume is mounted
			// elsewhere) must not mark it: the mark is for good.
			att, err := m.Store.Attachments(ctx, v.ID)
			if err != nil {
				return err
			}
			if len(att) > 0 {
				return fmt.Errorf("%w: volume %q is mounted by sandbox %s: a read-write mount needs it mounted nowhere else", errdefs.ErrConflict, v.Name, att[0].SandboxID)
			}
			if err := m.Store.MarkGuestWritten(ctx, v.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// mountWhat names a mount for messages: `volume "data"` or `host directory "/srv"`.
func mountWhat(mt store.Mount) string {
	if mt.VolumeID != "" {
		return fmt.Sprintf("volume %q", mt.VolumeName)
	}
	return fmt.Sprintf("host directory %q", mt.HostPath)
}
