package agent

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// launcher starts the processes of execs and code contexts from one OS
// thread that holds the envelope's fixed part, so that a start is one fork
// and one exec, as without an envelope:
//
//   - a mount namespace of its own (a slave of the agent's: later mounts
//     of the agent reach it, its own never leave it) in which the cgroup
//     tree, /proc/sys, /proc/sysrq-trigger, /proc/irq and /proc/bus are
//     read-only;
//   - a capability bounding set cut down to keptCaps.
//
// Both are per-thread attributes that a child inherits and keeps across
// exec, and the thread keeps its effective capabilities, which the child
// needs to change user. What differs per process is set by the fork
// itself (syscall.SysProcAttr): the exec cgroup (CLONE_INTO_CGROUP, so the
// process is born inside it), a new cgroup namespace rooted there, the
// user. Root in the process then has only keptCaps (no CAP_SYS_ADMIN: no
// mount, unshare or setns; no CAP_SYS_RESOURCE), sees read-only cgroup
// and kernel knobs, and cannot leave its cgroup.
//
// The thread is locked to the launcher's goroutine for good and ends with
// it (close), so no other goroutine ever runs on it.
//
// This replaced a helper (the agent binary run again as an envelope before
// each program) that cost 40 ms per exec under TCG and 20 ms under gVisor.
type launcher struct {
	reqs chan launchReq
	err  error // the thread's setup failed: every start fails with it
	once sync.Once
}

type launchReq struct {
	fn    func() (int, error)
	reply chan launchResult
}

type launchResult struct {
	pid int
	err error
}

// newLauncher starts the launcher's thread and waits for its setup. In a
// guest (PID 1) it first makes the agent's mounts shared, so that mounts
// the agent makes later reach the launcher's namespace too.
func newLauncher(guest bool) *launcher {
	l := &launcher{reqs: make(chan launchReq)}
	ready := make(chan error, 1)
	go l.run(guest, ready)
	l.err = <-ready
	return l
}

// guestLauncher is the agent's launcher (PID 1 in a guest), made on first
// use and kept for the agent's life.
var guestLauncher = sync.OnceValue(func() *launcher { return newLauncher(true) })

func (l *launcher) run(guest bool, ready chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
	if guest {
		if err := unix.Mount("", "/", "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			ready <- fmt.Errorf("mount propagation: %w", err)
			return
		}
	}
	if err := confineThread(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for r := range l.reqs {
		pid, err := r.fn()
		r.reply <- launchResult{pid, err}
	}
}

// start runs fn, which forks (syscall.ForkExec), on the launcher's thread.
func (l *launcher) start(fn func() (int, error)) (int, error) {
	if l.err != nil {
		return 0, fmt.Errorf("exec envelope: %w", l.err)
	}
	r := launchReq{fn: fn, reply: make(chan launchResult, 1)}
	l.reqs <- r
	res := <-r.reply
	return res.pid, res.err
}

// close ends the launcher's goroutine and thread (tests; the guest's
// lives as long as the agent). No start may follow or run concurrently.
func (l *launcher) close() {
	l.once.Do(func() {
		if l.err == nil {
			close(l.reqs)
		}
	})
}

// confineThread gives the calling thread (locked, never unlocked) the
// envelope's mount namespace and bounding set.
func confineThread() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	// Receive the agent's mounts, send none back.
	if err := unix.Mount("", "/", "", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount propagation: %w", err)
	}
	if err := readOnlyCgroups(); err != nil {
		return err
	}
	if err := readOnlyProc(); err != nil {
		return err
	}
	return dropBoundingSet()
}

// direct runs a start on the calling thread (no envelope).
func direct(fork func() (int, error)) (int, error) { return fork() }

// enveloped makes sys's start (whose exec cgroup is set, UseCgroupFD) an
// enveloped one: a new cgroup namespace rooted at that cgroup, forked from
// the guest launcher's thread.
func enveloped(sys *syscall.SysProcAttr) func(func() (int, error)) (int, error) {
	sys.Unshareflags |= syscall.CLONE_NEWCGROUP
	return guestLauncher().start
}
