package boot

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Result is what Guest found and did.
type Result struct {
	// Cmdline holds the airlock.* kernel options.
	Cmdline Cmdline
	// RootDevice is the block device mounted as /, or "" when the guest
	// serves from its initramfs (probe mode, or the root disk failed).
	RootDevice string
	// Modules is how many kernel modules are loaded from /mods.
	Modules int
}

// rootWait bounds the wait for the root block device to appear.
const rootWait = 10 * time.Second

// Guest prepares the guest as its PID 1. It never fails: each step that
// goes wrong is logged and skipped (see the package doc).
func Guest(log *slog.Logger) Result {
	var res Result
	for _, m := range []mount{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	} {
		if err := m.do(); err != nil {
			log.Error("mount", "target", m.target, "err", err)
		}
	}
	res.Modules = LoadModules(log, "/mods")
	_ = os.RemoveAll("/mods") // the initramfs is RAM; nothing needs them again

	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		log.Error("read kernel cmdline", "err", err)
	}
	res.Cmdline = ParseCmdline(string(b))

	if !res.Cmdline.Probe {
		if err := mountRoot(res.Cmdline.Root); err != nil {
			log.Error("root disk: serving from the initramfs", "device", res.Cmdline.Root, "err", err)
		} else {
			res.RootDevice = res.Cmdline.Root
		}
	}
	setupRuntime(log, res.Cmdline.Hostname)
	return res
}

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

func (m mount) do() error {
	if err := os.MkdirAll(m.target, 0o755); err != nil {
		return err
	}
	err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
	if errors.Is(err, unix.EBUSY) {
		return nil // already mounted (e.g. CONFIG_DEVTMPFS_MOUNT)
	}
	return err
}

// mountRoot waits for dev, mounts it ext4 at /newroot and makes it /.
func mountRoot(dev string) error {
	name := filepath.Base(dev)
	deadline := time.Now().Add(rootWait)
	for {
		_, e1 := os.Stat(filepath.Join("/sys/class/block", name))
		_, e2 := os.Stat(dev)
		if e1 == nil && e2 == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no device after %v", rootWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := (mount{dev, "/newroot", "ext4", 0, ""}).do(); err != nil {
		return fmt.Errorf("mount: %w", err)
	}
	if err := switchRoot("/newroot"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	return nil
}

// switchRoot moves /proc, /sys and /dev into newRoot and makes it the root
// (what busybox switch_root does, minus deleting the initramfs: the only
// large file in it is this running binary).
func switchRoot(newRoot string) error {
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(newRoot, d), 0o755); err != nil {
			return err
		}
	}
	for _, m := range []string{"/proc", "/sys", "/dev"} {
		if err := unix.Mount(m, filepath.Join(newRoot, m), "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", m, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// setupRuntime does the rest of the environment, each step best effort.
func setupRuntime(log *slog.Logger, hostname string) {
	for _, m := range []mount{
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777,size=50%"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755,size=20%"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	} {
		if err := m.do(); err != nil {
			log.Error("mount", "target", m.target, "err", err)
		}
	}
	for link, target := range map[string]string{
		"/dev/fd":     "/proc/self/fd",
		"/dev/stdin":  "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1",
		"/dev/stderr": "/proc/self/fd/2",
		"/dev/core":   "/proc/kcore",
	} {
		if err := os.Symlink(target, link); err != nil && !errors.Is(err, os.ErrExist) {
			log.Warn("symlink", "link", link, "err", err)
		}
	}
	// devpts with newinstance: /dev/ptmx must lead to this instance.
	if fi, err := os.Lstat("/dev/ptmx"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		_ = os.Remove("/dev/ptmx")
		if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
			log.Warn("symlink", "link", "/dev/ptmx", "err", err)
		}
	}
	if !ValidHostname(hostname) {
		hostname = DefaultCmdline().Hostname
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		log.Warn("sethostname", "err", err)
	}
	if err := LoopbackUp(); err != nil {
		log.Warn("loopback up", "err", err)
	}
	// The Go runtime remembers the limit it started with and restores it in
	// children unless syscall.Setrlimit is used, so use that.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 65536, Max: 524288}); err != nil {
		log.Warn("rlimit nofile", "err", err)
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0); err != nil {
		log.Warn("oom_score_adj", "err", err)
	}
}

// LoopbackUp sets IFF_UP on lo; the kernel then adds 127.0.0.1/8 and ::1.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
