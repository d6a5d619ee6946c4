package reaper

import (
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrExited means the process was already reaped: its pid (and process group
// id) may belong to another process now, so nothing was signalled.
var ErrExited = errors.New("process already exited")

// Options configures a Reaper.
type Options struct {
	// Logger gets unexpected wait errors. Nil discards.
	Logger *slog.Logger
	// All reaps every child of the process (PID 1 mode). Without it only
	// pids started through Start are waited for.
	All bool
}

// Reaper delivers exit statuses of processes started through Start. Safe for
// concurrent use. Close stops it.
type Reaper struct {
	log *slog.Logger
	all bool

	stop chan struct{}
	wg   sync.WaitGroup

	// mu is held while a child is started and registered, and while children
	// are reaped, so a child that exits at once is never reaped before it is
	// registered, and Signal never targets a reaped pid.
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	closed  bool
}

// New returns a running Reaper. In All mode it starts the SIGCHLD loop.
func New(opts Options) *Reaper {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reaper{
		log:     log,
		all:     opts.All,
		stop:    make(chan struct{}),
		waiters: make(map[int]chan syscall.WaitStatus),
	}
	if r.all {
		sigc := make(chan os.Signal, 1)
		signal.Notify(sigc, syscall.SIGCHLD)
		r.wg.Go(func() {
			defer signal.Stop(sigc)
			r.loop(sigc)
		})
	}
	return r
}

// Close stops the reaper and waits for its goroutines. Processes still
// running are not waited for any more: their done channels never fire.
// Idempotent.
func (r *Reaper) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.stop)
	r.mu.Unlock()
	r.wg.Wait()
}

// Start calls start, which must create exactly one child process and return
// its pid (typically with syscall.ForkExec), and registers that pid. The
// returned channel receives the child's wait status once, when it has exited
// and been reaped. The channel is closed without a value if the status was
// lost (a wait error in host mode).
//
// start runs with the reaper's mutex held: it must not call other Reaper
// methods. Starts are therefore serialized, which also lets the caller
// adjust process-wide state (such as its own oom_score_adj) around the fork.
func (r *Reaper) Start(start func() (int, error)) (pid int, done <-chan syscall.WaitStatus, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0, nil, errors.New("reaper closed")
	}
	pid, err = start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	if !r.all {
		r.wg.Go(func() { r.waitOne(pid) })
	}
	return pid, ch, nil
}

// Signal sends sig to pid, or to the process group pid if group is set,
// provided pid was started through Start and has not been reaped yet.
// Otherwise it returns ErrExited and sends nothing.
func (r *Reaper) Signal(pid int, sig syscall.Signal, group bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiters[pid]; !ok {
		return ErrExited
	}
	target := pid
	if group {
		target = -pid
	}
	return unix.Kill(target, sig)
}

// loop is the PID 1 mode: reap every child on each SIGCHLD.
func (r *Reaper) loop(sigc <-chan os.Signal) {
	r.reapAll() // children that exited before Notify took effect
	for {
		select {
		case <-r.stop:
			return
		case <-sigc:
			r.reapAll()
		}
	}
}

func (r *Reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			if !errors.Is(err, syscall.ECHILD) {
				r.log.Warn("wait4", "err", err)
			}
			return
		}
		if pid <= 0 {
			return
		}
		r.deliverLocked(pid, ws)
	}
}

// waitOne is the host mode: wait for one registered pid. It blocks in waitid
// with WNOWAIT (which leaves the child a zombie, so its pid stays reserved),
// then reaps it under the mutex.
func (r *Reaper) waitOne(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			r.log.Warn("waitid", "pid", pid, "err", err)
		}
		break
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || got != pid {
			r.log.Warn("wait4", "pid", pid, "err", err)
			// Unregister anyway so Signal cannot target a pid we lost, and
			// close the channel so the owner does not wait forever.
			if ch, ok := r.waiters[pid]; ok {
				delete(r.waiters, pid)
				close(ch)
			}
			return
		}
		r.deliverLocked(pid, ws)
		return
	}
}

func (r *Reaper) deliverLocked(pid int, ws syscall.WaitStatus) {
	ch, ok := r.waiters[pid]
	if !ok {
		return // an orphan: nobody asked for its status
	}
	delete(r.waiters, pid)
	ch <- ws // buffered, never blocks
}
