package qemu

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// vmmSysProcAttr runs QEMU as uid (gid = uid, plus groups) with no
// capabilities (a non-root uid after exec), in new mount, pid, net, ipc and
// uts namespaces (QEMU is pid 1 of its own: when it dies nothing of it is
// left), in its own process group, and killed if the thread that forked it
// dies. Go sets the parent-death signal after changing credentials, so the
// uid change does not clear it (it did with `unshare --kill-child setpriv`,
// notes §7).
func vmmSysProcAttr(uid uint32, groups []uint32) *syscall.SysProcAttr {
	if groups == nil {
		groups = []uint32{}
	}
	return &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: groups},
		Pdeathsig:  syscall.SIGKILL,
		Setpgid:    true,
	}
}

// confineThread prepares the calling OS thread, which must be locked to
// its goroutine and never unlocked, to fork the VMM: it sets no_new_privs
// and empties the thread's capability bounding set. Both are inherited by
// the child and kept across exec, so QEMU can gain no privilege by
// executing anything (a setuid or file-capability binary) even if its
// seccomp sandbox were bypassed. The thread keeps its effective set, which
// the child needs for its uid change; the thread must then die with its
// goroutine (no UnlockOSThread), so no other goroutine runs on it.
// Dropping the bounding set needs CAP_SETPCAP; without it (not root) the
// set stays full and no_new_privs alone holds.
func confineThread() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL):
			return nil // past the kernel's last capability
		case errors.Is(err, unix.EPERM):
			return nil // no CAP_SETPCAP: an unprivileged caller
		default:
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
}
