package qemu

import "syscall"

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
