package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// maxVolumes bounds one Sync's volumes (a microVM has few device slots).
const maxVolumes = 8

var (
	volumeSerial = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^airlock-vol[0-9]$`) })
	volumeStaged = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^/\.airlock-mounts/[0-9]$`) })
	volumeTag    = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^airlock-fs[0-9]$`) })
)

// volumeMount is a checked agentv1.VolumeMount: serial or staged is set.
type volumeMount struct {
	serial   string
	path     string
	readOnly bool
	staged   string
	tag      string // virtio-fs
}

// parseVolumes checks the host's volume list: known serials, each once;
// clean absolute paths outside the guest's system filesystems, each once.
func parseVolumes(in []*agentv1.VolumeMount) ([]volumeMount, error) {
	if len(in) > maxVolumes {
		return nil, invalidf("at most %d volumes", maxVolumes)
	}
	seen := map[string]bool{}
	out := make([]volumeMount, 0, len(in))
	for _, v := range in {
		set := 0
		for _, f := range []string{v.GetSerial(), v.GetStaged(), v.GetTag()} {
			if f != "" {
				set++
			}
		}
		switch {
		case set != 1:
			return nil, invalidf("a volume has exactly one of a serial, a staging path and a tag")
		case v.GetStaged() != "" && !volumeStaged().MatchString(v.GetStaged()):
			return nil, invalidf("volume staging path %q is not /.airlock-mounts/ and a digit", v.GetStaged())
		case v.GetTag() != "" && !volumeTag().MatchString(v.GetTag()):
			return nil, invalidf("volume tag %q is not airlock-fs and a digit", v.GetTag())
		case v.GetSerial() != "" && !volumeSerial().MatchString(v.GetSerial()):
			return nil, invalidf("volume serial %q is not airlock-vol and a digit", v.GetSerial())
		}
		p := v.GetPath()
		if err := checkPath(p); err != nil {
			return nil, err
		}
		if p == "/" || p == "/proc" || p == "/sys" || p == "/dev" || strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/") || strings.HasPrefix(p, "/dev/") {
			return nil, invalidf("volume path %q is a system filesystem", p)
		}
		src := v.GetSerial() + v.GetStaged() + v.GetTag()
		if seen[src] || seen[p] {
			return nil, invalidf("volume %q or path %q given twice", src, p)
		}
		seen[src], seen[p] = true, true
		out = append(out, volumeMount{serial: v.GetSerial(), path: p, readOnly: v.GetReadOnly(), staged: v.GetStaged(), tag: v.GetTag()})
	}
	return out, nil
}

// findBlockBySerial returns /dev/<name> of the virtio-blk disk whose
// serial is serial, waiting briefly for it to appear.
func findBlockBySerial(serial string) (string, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		names, _ := filepath.Glob("/sys/block/vd*")
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(n, "serial"))
			if err == nil && strings.TrimSpace(string(b)) == serial {
				return "/dev/" + filepath.Base(n), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk with serial %s", serial)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mountVolumes mounts each volume (ext4, nosuid, nodev); a read-write one
// then grows to fill its device (the host may have grown the image).
func (g guestSystem) MountVolumes(vols []volumeMount) error {
	staged := false
	for _, v := range vols {
		if v.staged != "" {
			if err := moveStaged(v); err != nil {
				return err
			}
			staged = true
			continue
		}
		if v.tag != "" {
			if err := mountVirtiofs(v); err != nil {
				return err
			}
			continue
		}
		dev, err := findBlockBySerial(v.serial)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(v.path, 0o755); err != nil {
			return fmt.Errorf("volume %s: %w", v.path, err)
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		data := ""
		if v.readOnly {
			// The device is read-only: a journal left by a writer that
			// crashed cannot be replayed, so it is not loaded.
			flags |= unix.MS_RDONLY
			data = "noload"
		}
		if err := unix.Mount(dev, v.path, "ext4", flags, data); err != nil {
			return fmt.Errorf("mount volume at %s: %w", v.path, err)
		}
		if !v.readOnly {
			if err := growMounted(dev, v.path); err != nil {
				g.log.Warn("grow volume", "path", v.path, "err", err)
			}
		}
	}
	if staged {
		// The runtime's own mounts still show through the root at the
		// staging paths (gVisor's gofer made them there): cover them
		// with an empty read-only tmpfs.
		if err := unix.Mount("tmpfs", stageDir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0755"); err != nil {
			return fmt.Errorf("cover %s: %w", stageDir, err)
		}
	}
	return nil
}

// stageDir holds the staging paths of VolumeMount.staged.
const stageDir = "/.airlock-mounts"

// mountVirtiofs mounts the host directory shared as virtio-fs tag v.tag
// (nosuid, nodev; read-only if asked: the host side is read-only too).
func mountVirtiofs(v volumeMount) error {
	if err := os.MkdirAll(v.path, 0o755); err != nil {
		return fmt.Errorf("host directory %s: %w", v.path, err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if v.readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(v.tag, v.path, "virtiofs", flags, ""); err != nil {
		return fmt.Errorf("mount host directory at %s: %w", v.path, err)
	}
	return nil
}

// moveStaged binds the mount the runtime made at v.staged to v.path
// (read-only if asked: the host side is read-only too) and takes it off
// the staging path.
func moveStaged(v volumeMount) error {
	if err := os.MkdirAll(v.path, 0o755); err != nil {
		return fmt.Errorf("volume %s: %w", v.path, err)
	}
	if err := unix.Mount(v.staged, v.path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind volume at %s: %w", v.path, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if v.readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", v.path, "", flags, ""); err != nil {
		return fmt.Errorf("remount volume at %s: %w", v.path, err)
	}
	if err := unix.Unmount(v.staged, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", v.staged, err)
	}
	return nil
}

// growMounted grows the ext4 filesystem mounted at dir to fill dev.
func growMounted(dev, dir string) error {
	var size uint64
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = ioctlPtr(fd, unix.BLKGETSIZE64, unsafe.Pointer(&size))
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("BLKGETSIZE64: %w", err)
	}
	return growTo(size, dir)
}

// unmountVolumes unmounts the filesystems on virtio disks other than the
// root's (volumes), so their journals are clean at power off.
func unmountVolumes(rootDevice string) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.HasPrefix(f[0], "/dev/vd") || f[0] == rootDevice {
			continue
		}
		_ = unix.Unmount(f[1], 0)
	}
}
