package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExecInitName is argv[0] with which the agent binary, executed again by the
// agent, becomes the envelope of one exec or context interpreter (see
// ExecInit). cmd/airlock-agent checks for it before anything else.
const ExecInitName = "airlock-exec-init"

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

// envelope turns a start of path/argv with attr (whose Files are set, and
// whose Sys has the exec cgroup in CgroupFD, if any) into a start of the
// agent binary as ExecInitName in a new mount namespace, with the exec
// cgroup's fd; ExecInit then moves itself into the exec cgroup, enters a new
// cgroup namespace rooted there, mounts the cgroup tree read-only, drops
// capabilities, becomes id and executes path. It returns the path and argv to start and the read end of
// the status pipe, for startStatus once the start returned; closeW closes the
// write end and must be called after the fork.
func envelope(path string, argv []string, attr *syscall.ProcAttr, id identity) (exe string, args []string, status *os.File, closeW func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", nil, nil, nil, err
	}
	groups := make([]string, len(id.groups))
	for i, g := range id.groups {
		groups[i] = strconv.FormatUint(uint64(g), 10)
	}
	statusFD, cgFD := len(attr.Files), -1
	attr.Files = append(attr.Files, w.Fd())
	if attr.Sys.UseCgroupFD {
		// ExecInit moves itself into the exec cgroup (see there).
		cgFD = len(attr.Files)
		attr.Files = append(attr.Files, uintptr(attr.Sys.CgroupFD))
		attr.Sys.UseCgroupFD, attr.Sys.CgroupFD = false, 0
	}
	attr.Sys.Credential = nil // ExecInit changes user after dropping capabilities
	attr.Sys.Unshareflags |= syscall.CLONE_NEWNS
	args = append([]string{ExecInitName, strconv.Itoa(statusFD), strconv.Itoa(cgFD),
		strconv.FormatUint(uint64(id.uid), 10), strconv.FormatUint(uint64(id.gid), 10),
		strings.Join(groups, ","), path}, argv...)
	return "/proc/self/exe", args, r, func() { w.Close() }, nil
}

// startStatus waits until the envelope executed the exec's program (the
// status pipe closes on exec) or failed, and returns its failure as the errno
// that a direct start would have returned.
func startStatus(r *os.File) error {
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 512))
	if err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	num, msg, _ := strings.Cut(string(b), " ")
	if n, err := strconv.Atoi(num); err == nil && n > 0 {
		return fmt.Errorf("%s: %w", msg, syscall.Errno(n))
	}
	return errors.New("exec envelope: " + msg)
}

// ExecInit is the envelope of one exec (see envelope); os.Args[0] is
// ExecInitName. It never returns: it executes the exec's program or writes
// why it could not to the status fd and exits 127.
func ExecInit() {
	runtime.LockOSThread() // the bounding set is per thread: drop and exec on this one
	a := os.Args
	fd := -1
	if len(a) >= 2 {
		fd, _ = strconv.Atoi(a[1])
	}
	err := execInit(a)
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = 0
	}
	if fd > 2 {
		f := os.NewFile(uintptr(fd), "status")
		fmt.Fprintf(f, "%d %s", int(errno), strings.ReplaceAll(err.Error(), "\n", " "))
	}
	os.Exit(127)
}

func execInit(a []string) error {
	if len(a) < 8 {
		return errors.New("bad arguments")
	}
	fd, err := strconv.Atoi(a[1])
	if err != nil || fd < 3 {
		return errors.New("bad status fd")
	}
	unix.CloseOnExec(fd)
	cgFD, err := strconv.Atoi(a[2])
	if err != nil || (cgFD != -1 && cgFD < 3) {
		return errors.New("bad cgroup fd")
	}
	a = a[1:]
	uid, err1 := strconv.ParseUint(a[2], 10, 32)
	gid, err2 := strconv.ParseUint(a[3], 10, 32)
	if err1 != nil || err2 != nil {
		return errors.New("bad uid or gid")
	}
	var groups []int
	if a[4] != "" {
		for g := range strings.SplitSeq(a[4], ",") {
			n, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return errors.New("bad group")
			}
			groups = append(groups, int(n))
		}
	}
	path, argv := a[5], a[6:]
	// The start's chdir ran as root: redo it as the exec's user below, so
	// that a working directory the user cannot enter fails as before.
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("getwd: %w", err)
	}
	if cgFD >= 0 {
		if err := enterCgroup(cgFD); err != nil {
			return err
		}
	}
	// A new cgroup namespace for this thread (the one that executes the
	// program), rooted at the cgroup it is in now: the exec cgroup.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	if err := readOnlyCgroups(); err != nil {
		return err
	}
	if err := readOnlyProc(); err != nil {
		return err
	}
	if err := dropBoundingSet(); err != nil {
		return err
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(int(gid)); err != nil {
		return fmt.Errorf("setgid: %w", err)
	}
	if err := syscall.Setuid(int(uid)); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	if err := syscall.Chdir(wd); err != nil {
		return fmt.Errorf("chdir: %w", err)
	}
	return syscall.Exec(path, argv, os.Environ())
}

// enterCgroup moves the envelope (every thread of it) into the exec cgroup
// open at dir. The envelope is a Go program with a few threads: it
// starts outside the exec cgroup and moves in whole, since a migration is
// not held to pids.max (a fork is); the exec then replaces those threads
// with its one, so a --pids-limit as low as 1 still lets the exec start.
func enterCgroup(dir int) error {
	defer unix.Close(dir)
	f, err := unix.Openat(dir, "cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open exec cgroup: %w", err)
	}
	_, err = unix.Write(f, []byte("0"))
	unix.Close(f)
	if err != nil {
		return fmt.Errorf("enter exec cgroup: %w", err)
	}
	return nil
}

// readOnlyCgroups replaces the exec's view of the cgroup tree with a
// read-only cgroup2 mount of its own cgroup namespace (its exec cgroup is
// the root it sees), or, where that mount is refused, makes the inherited
// mount read-only.
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
