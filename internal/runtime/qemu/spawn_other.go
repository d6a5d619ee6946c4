//go:build !linux

package qemu

import "syscall"

// vmmSysProcAttr: the qemu runtime runs only on Linux; elsewhere the
// process would start unconfined, so refuse by running nothing useful.
func vmmSysProcAttr(uid uint32, groups []uint32) *syscall.SysProcAttr {
	panic("qemu runtime: Linux only")
}

func confineThread() error { panic("qemu runtime: Linux only") }
