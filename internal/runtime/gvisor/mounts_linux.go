package gvisor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Spec.Mounts under gVisor. Each becomes a mount point of the instance's
// own under RunDir/mounts/<i>, made by this process before runsc starts,
// and an OCI bind mount of it at StagePath(i), which the agent moves to
// its target: runsc's gofer serves it to the sandbox, so
// the guest reaches files through the gofer's syscalls, never blocks or
// host paths, and resolves symlinks and ".." in its own view (threat 11).
//   - A volume image is attached to a loop device (autoclear, read-only
//     for a read-only mount) and mounted by the host kernel: only gVisor
//     sandboxes write through it, so its blocks are the host kernel's own
//     (the manager refuses an image a microVM guest has written).
//   - A host directory is opened without following symlinks and bind
//     mounted from that descriptor, so a link swapped in after the check
//     changes nothing.
// Both are nosuid and nodev on the host side, and read-only ones are
// read-only mounts.

// StagedMountPath: the agent finds Spec.Mounts[i] at StagePath(i) and
// moves it to its target (runtime.MountStager).
func (in *instance) StagedMountPath(i int) string { return StagePath(i) }

// mountsDir holds the instance's mount points.
func (in *instance) mountsDir() string { return filepath.Join(in.spec.RunDir, "mounts") }

// prepareMounts makes the host mounts of Spec.Mounts and returns their OCI
// mounts. On error what it made is undone by releaseMounts.
func (in *instance) prepareMounts() ([]ociMount, error) {
	if len(in.spec.Mounts) == 0 {
		return nil, nil
	}
	if err := os.Mkdir(in.mountsDir(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("mounts dir: %w", err)
	}
	var out []ociMount
	for i, m := range in.spec.Mounts {
		point := filepath.Join(in.mountsDir(), strconv.Itoa(i))
		if err := os.Mkdir(point, 0o700); err != nil {
			return nil, fmt.Errorf("mount point: %w", err)
		}
		var err error
		if m.Image != "" {
			err = mountImage(m.Image, point, m.ReadOnly)
		} else {
			err = runtime.BindHostDir(m.Dir, point, m.ReadOnly)
		}
		if err != nil {
			return nil, fmt.Errorf("mount at %s: %w", m.Target, err)
		}
		opts := []string{"rbind", "nosuid", "nodev", "rw"}
		if m.ReadOnly {
			opts[3] = "ro"
		}
		out = append(out, ociMount{Destination: StagePath(i), Type: "bind", Source: point, Options: opts})
	}
	return out, nil
}

// releaseMounts unmounts the instance's mount points and removes them
// (runtime.ReleaseMountPoints).
func (in *instance) releaseMounts() error { return runtime.ReleaseMountPoints(in.mountsDir()) }

// mountImage attaches ext4 image img to a free loop device and mounts it
// at point; a read-write one first grows to fill the image.
func mountImage(img, point string, ro bool) error {
	flag := unix.O_RDWR
	if ro {
		flag = unix.O_RDONLY
	}
	if !ro {
		if err := growImage(img); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(img, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("volume image: %w", err)
	}
	defer f.Close()
	loop, err := attachLoop(f, ro)
	if err != nil {
		return err
	}
	defer loop.Close() // autoclear: the device goes with the last mount
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	data := ""
	if ro {
		flags |= unix.MS_RDONLY
		data = "noload"
	}
	if err := unix.Mount(loop.Name(), point, "ext4", flags, data); err != nil {
		return fmt.Errorf("mount %s: %w", loop.Name(), err)
	}
	return nil
}

// attachLoop binds f to a free loop device, retrying when another process
// takes the same one first.
func attachLoop(f *os.File, ro bool) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("loop control: %w", err)
	}
	defer ctl.Close()
	cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	if ro {
		cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
	}
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("loop device: %w", err)
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		if !errors.Is(err, unix.EBUSY) || try == 20 {
			return nil, fmt.Errorf("LOOP_CONFIGURE: %w", err)
		}
		time.Sleep(time.Duration(try+1) * time.Millisecond)
	}
}

// growImage grows the ext4 filesystem in img, unmounted, to fill img (a
// volume resized while detached). The image is one the host kernel wrote
// (see above), so the host's e2fsprogs may read it. The online resize
// ioctl is not used: it needs CAP_SYS_RESOURCE, which some hosts' root
// lacks.
func growImage(img string) error {
	blocks, bsize, err := ext4Blocks(img)
	if err != nil {
		return err
	}
	fi, err := os.Stat(img)
	if err != nil {
		return err
	}
	if uint64(fi.Size())/bsize <= blocks {
		return nil
	}
	for _, argv := range [][]string{{"e2fsck", "-f", "-p", img}, {"resize2fs", img}} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("grow volume: %s: %w: %s", argv[0], err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// ext4Blocks reads the block count and size from img's ext4 superblock.
func ext4Blocks(img string) (blocks, bsize uint64, err error) {
	f, err := os.Open(img)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return 0, 0, fmt.Errorf("read superblock: %w", err)
	}
	le := binary.LittleEndian
	if le.Uint16(sb[0x38:]) != 0xEF53 {
		return 0, 0, errors.New("not an ext4 image")
	}
	blocks = uint64(le.Uint32(sb[0x4:]))
	if le.Uint32(sb[0x60:])&0x80 != 0 { // INCOMPAT_64BIT
		blocks |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	logSize := le.Uint32(sb[0x18:])
	if logSize > 6 {
		return 0, 0, errors.New("bad ext4 block size")
	}
	return blocks, 1024 << logSize, nil
}
