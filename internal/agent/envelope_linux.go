package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroupMount is where the agent mounts the guest's cgroup2 tree.
const cgroupMount = "/sys/fs/cgroup"

// keptCaps is the capability bounding set of an exec: what Docker grants a
// container's root by default. Everything else (CAP_SYS_ADMIN: mounts,
// setns, unshare; CAP_SYS_PTRACE; CAP_SYS_RESOURCE; CAP_NET_ADMIN;
// CAP_SYS_MODULE; CAP_SYS_BOOT; ...) is dropped before the exec's program
// runs, so root in an exec cannot undo its envelope.
var keptCaps = map[int]bool{
	unix.CAP_CHOWN: true, unix.CAP_DAC_OVERRIDE: true, unix.CAP_FSETID: true,
	unix.CAP_FOWNER: true, unix.CAP_MKNOD: true, unix.CAP_NET_RAW: true,
	unix.CAP_SETGID: true, unix.CAP_SETUID: true, unix.CAP_SETFCAP: true,
	unix.CAP_SETPCAP: true, unix.CAP_NET_BIND_SERVICE: true,
	unix.CAP_SYS_CHROOT: true, unix.CAP_KILL: true, unix.CAP_AUDIT_WRITE: true,
}

// readOnlyCgroups replaces the launcher's view of the cgroup tree with a
// read-only cgroup2 mount, or, where that mount is refused, makes the
// inherited mount read-only.
func readOnlyCgroups() error {
	const flags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("cgroup2", cgroupMount, "cgroup2", flags, ""); err == nil {
		return nil
	}
	if err := unix.Mount("", cgroupMount, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		return fmt.Errorf("read-only %s: %w", cgroupMount, err)
	}
	return nil
}

// readOnlyProcPaths are the kernel's own knobs under /proc that root would
// otherwise write without any capability (sysctls, /proc/sysrq-trigger,
// which crashes or powers off the guest, IRQ affinity, bus devices): in an
// exec they are read-only, as in a Docker container.
var readOnlyProcPaths = []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"}

// readOnlyProc bind-mounts each of readOnlyProcPaths read-only onto itself
// (one that does not exist is skipped).
func readOnlyProc() error {
	for _, p := range readOnlyProcPaths {
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", p, err)
		}
	}
	return nil
}

// dropBoundingSet removes every capability not in keptCaps from the bounding
// set and the ambient set.
func dropBoundingSet() error {
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 && n < 64 {
			last = n
		}
	}
	_ = unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	for c := 0; c <= last; c++ {
		if keptCaps[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	return nil
}
