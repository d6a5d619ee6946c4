package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ext4IOCResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64).
const ext4IOCResizeFS = 0x40086610

// guestSystem acts on the guest machine. The agent must be PID 1.
type guestSystem struct {
	log        *slog.Logger
	rootDevice string // "" when running from the initramfs
}

func (g guestSystem) SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

func (g guestSystem) AddEntropy(b []byte) error {
	fd, err := unix.Open("/dev/urandom", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open urandom: %w", err)
	}
	defer unix.Close(fd)
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b))
	putInt32(info[0:], int32(len(b)*8))
	putInt32(info[4:], int32(len(b)))
	copy(info[8:], b)
	if err := ioctlPtr(fd, unix.RNDADDENTROPY, unsafe.Pointer(&info[0])); err != nil {
		return fmt.Errorf("RNDADDENTROPY: %w", err)
	}
	if err := ioctlPtr(fd, unix.RNDRESEEDCRNG, nil); err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	return nil
}

func putInt32(b []byte, v int32) {
	*(*int32)(unsafe.Pointer(&b[0])) = v // native endianness, as the kernel reads it
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

func (g guestSystem) SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	// Best effort: the root filesystem may be read-only or odd.
	if err := os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644); err != nil {
		g.log.Debug("write /etc/hostname", "err", err)
	}
	return nil
}

func (g guestSystem) ConfigureNetwork(c netConfig) error {
	if err := configureNIC(c); err != nil {
		return err
	}
	if !c.Enabled {
		return nil
	}
	return netFiles{root: "/"}.apply(c)
}

func (g guestSystem) GrowRoot(want uint64) error {
	if g.rootDevice == "" {
		return errNoRootDisk
	}
	// The host may have just resized the disk: wait (briefly) until the
	// kernel has processed the virtio config change and sees want bytes.
	var size uint64
	for deadline := time.Now().Add(3 * time.Second); ; {
		dev, err := unix.Open(g.rootDevice, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open root device: %w", err)
		}
		err = ioctlPtr(dev, unix.BLKGETSIZE64, unsafe.Pointer(&size))
		unix.Close(dev)
		if err != nil {
			return fmt.Errorf("BLKGETSIZE64: %w", err)
		}
		if size >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return growTo(size, "/")
}

// growTo grows the ext4 filesystem mounted at dir to size bytes (its
// device's size).
func growTo(size uint64, dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Bsize <= 0 {
		return errors.New("statfs: bad block size")
	}
	blocks := size / uint64(st.Bsize)
	// f_blocks excludes ext4's overhead, so it is below the real block
	// count; resizing to the current count is a no-op in the kernel.
	if blocks <= st.Blocks {
		return nil
	}
	d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(d)
	if err := ioctlPtr(d, ext4IOCResizeFS, unsafe.Pointer(&blocks)); err != nil {
		return fmt.Errorf("EXT4_IOC_RESIZE_FS: %w", err)
	}
	return nil
}

func (g guestSystem) RootSize() (uint64, error) { return statfsSize("/") }

func statfsSize(p string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return 0, fmt.Errorf("statfs: %w", err)
	}
	return st.Blocks * uint64(st.Bsize), nil
}

// PowerOff: sync, SIGTERM everything, wait a little, SIGKILL what is left,
// remount / read-only, power off. The reaper keeps reaping meanwhile.
func (g guestSystem) PowerOff() {
	start := time.Now()
	unix.Sync()
	_ = unix.Kill(-1, unix.SIGTERM)
	waitNoProcesses(2 * time.Second)
	_ = unix.Kill(-1, unix.SIGKILL)
	waitNoProcesses(time.Second)
	unix.Sync()
	unmountVolumes(g.rootDevice)
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		g.log.Warn("remount / read-only", "err", err)
	}
	unix.Sync()
	g.log.Info("power off", "took_ms", time.Since(start).Milliseconds())
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Still here: no power-off method. QEMU runs with -no-reboot, so a
	// restart ends it too.
	g.log.Error("power off", "err", err)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_HALT)
	select {} // PID 1 must not exit
}

// waitNoProcesses waits until no user process but the agent is left, or
// for at most d.
func waitNoProcesses(d time.Duration) {
	deadline := time.Now().Add(d)
	for userProcesses() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

// userProcesses counts live processes other than the agent, skipping
// kernel threads and zombies.
func userProcesses() int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session tty_nr tpgid flags ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 7 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		const pfKthread = 0x00200000
		if flags, err := strconv.ParseUint(f[6], 10, 64); err == nil && flags&pfKthread != 0 {
			continue
		}
		n++
	}
	return n
}
