package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// maxVolumes bounds one Sync's volumes (a microVM has few device slots).
const maxVolumes = 8

var volumeSerial = regexp.MustCompile(`^airlock-vol[0-9]$`)

// volumeMount is a checked agentv1.VolumeMount.
type volumeMount struct {
	serial   string
	path     string
	readOnly bool
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
		if !volumeSerial.MatchString(v.GetSerial()) {
			return nil, invalidf("volume serial %q is not airlock-vol and a digit", v.GetSerial())
		}
		p := v.GetPath()
		if err := checkPath(p); err != nil {
			return nil, err
		}
		if p == "/" || p == "/proc" || p == "/sys" || p == "/dev" || strings.HasPrefix(p, "/proc/") || strings.HasPrefix(p, "/sys/") || strings.HasPrefix(p, "/dev/") {
			return nil, invalidf("volume path %q is a system filesystem", p)
		}
		if seen[v.GetSerial()] || seen[p] {
			return nil, invalidf("volume %q or path %q given twice", v.GetSerial(), p)
		}
		seen[v.GetSerial()], seen[p] = true, true
		out = append(out, volumeMount{serial: v.GetSerial(), path: p, readOnly: v.GetReadOnly()})
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
	for _, v := range vols {
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
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Bsize <= 0 {
		return errors.New("statfs: bad block size")
	}
	blocks := size / uint64(st.Bsize)
	if blocks <= st.Blocks {
		return nil
	}
	d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	if err := ioctlPtr(d, ext4IOCResizeFS, unsafe.Pointer(&blocks)); err != nil {
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: %w", err)
	}
	return nil
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
