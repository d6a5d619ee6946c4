package agent

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/cgroup"
	"github.com/airlock-sandbox/airlock/internal/agent/reaper"
)

// execSpec is a validated ExecStart.
type execSpec struct {
	path    string // resolved executable
	argv    []string
	env     []string
	dir     string
	user    string // as asked; "" runs as the agent's own user
	id      identity
	stdin   bool
	timeout time.Duration
	maxOut  uint64
	pids    uint32
	tty     *pty.Winsize // nil: pipes
}

// process is a started exec. Its fields are set before it is shared.
type process struct {
	pid    int
	done   <-chan syscall.WaitStatus
	start  time.Time
	reaper *reaper.Reaper
	cg     *cgroup.Exec // nil without cgroups

	stdout, stderr *os.File // read ends; stderr is nil on a terminal
	tty            *os.File // the terminal's master (also stdout); nil without

	stdinMu sync.Mutex
	stdin   *os.File // write end; nil without stdin or once closed
}

// lookPath finds name in the colon-separated dirs of path, as execvp does,
// in the guest's own root. Only absolute directories are searched.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for dir := range strings.SplitSeq(path, ":") {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", connect.NewError(connect.CodeNotFound, errors.New("executable not found in PATH"))
}

// spawn starts spec's process in its own session and exec cgroup.
func (s *execService) spawn(spec *execSpec) (_ *process, err error) {
	p := &process{reaper: s.reaper}
	var cleanup []func()
	defer func() {
		if err != nil {
			for _, f := range cleanup {
				f()
			}
		}
	}()
	if s.cg != nil {
		cg, err := s.cg.NewExec(spec.pids)
		if err != nil {
			return nil, sysError("create exec cgroup", err)
		}
		p.cg = cg
		cleanup = append(cleanup, cg.Release)
	}

	if spec.tty != nil {
		return s.spawnTTY(spec, p)
	}
	var childStdin *os.File
	if spec.stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, sysError("pipe", err)
		}
		childStdin, p.stdin = r, w
		cleanup = append(cleanup, func() { w.Close() })
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, sysError("open /dev/null", err)
		}
		childStdin = f
	}
	defer childStdin.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	defer outW.Close()
	cleanup = append(cleanup, func() { outR.Close() })
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, sysError("pipe", err)
	}
	defer errW.Close()
	cleanup = append(cleanup, func() { errR.Close() })
	p.stdout, p.stderr = outR, errR

	return s.launch(spec, p, []uintptr{childStdin.Fd(), outW.Fd(), errW.Fd()}, &syscall.SysProcAttr{Setsid: true})
}

// spawnTTY starts spec's process on a new pseudo-terminal: its stdin,
// stdout and stderr are the terminal, which becomes its controlling
// terminal; the agent keeps the master, for output, input and resizes.
func (s *execService) spawnTTY(spec *execSpec, p *process) (_ *process, err error) {
	var cleanup []func()
	defer func() {
		if err != nil {
			for _, f := range cleanup {
				f()
			}
		}
	}()
	opened, slave, err := pty.Open()
	if err != nil {
		return nil, sysError("open a pseudo-terminal", err)
	}
	defer slave.Close()
	// pty.Open leaves the master in blocking mode; the output pump needs
	// read deadlines (see run's drain), so keep a non-blocking copy that
	// the runtime poller manages, and another for input, which closing
	// stdin closes without ending the output.
	master, err := nonBlockingDup(opened, "ptmx")
	opened.Close()
	if err != nil {
		return nil, sysError("dup the terminal", err)
	}
	cleanup = append(cleanup, func() { master.Close() })
	in, err := nonBlockingDup(master, "ptmx-input")
	if err != nil {
		return nil, sysError("dup the terminal", err)
	}
	cleanup = append(cleanup, func() { in.Close() })
	p.stdout, p.tty, p.stdin = master, master, in
	if !p.resize(spec.tty) {
		return nil, sysError("set the terminal size", errors.New("not a terminal"))
	}
	// The child's fd 0 (Ctty) becomes its controlling terminal.
	return s.launch(spec, p, []uintptr{slave.Fd(), slave.Fd(), slave.Fd()}, &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0})
}

// nonBlockingDup duplicates f's descriptor (close-on-exec, non-blocking)
// as a new *os.File, which the runtime poller then manages.
func nonBlockingDup(f *os.File, name string) (*os.File, error) {
	var fd int
	var err error
	rc, cerr := f.SyscallConn()
	if cerr != nil {
		return nil, cerr
	}
	if cerr := rc.Control(func(raw uintptr) {
		if fd, err = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0); err == nil {
			err = unix.SetNonblock(fd, true)
		}
	}); cerr != nil {
		return nil, cerr
	}
	if err != nil {
		if fd > 0 {
			unix.Close(fd)
		}
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// launch forks and execs spec with files as the child's fds 0, 1 and 2,
// in the exec's cgroup and envelope, as spec's user.
func (s *execService) launch(spec *execSpec, p *process, files []uintptr, sys *syscall.SysProcAttr) (*process, error) {
	if os.Geteuid() == 0 {
		sys.Credential = &syscall.Credential{Uid: spec.id.uid, Gid: spec.id.gid, Groups: spec.id.groups}
	} else if spec.user != "" && spec.id.uid != uint32(os.Geteuid()) {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("the agent is not root and cannot change user"))
	}
	if p.cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, p.cg.FD()
	}
	attr := &syscall.ProcAttr{
		Dir: spec.dir,
		Env: spec.env,
		// Fd puts the child's ends in blocking mode; ours stay non-blocking.
		Files: files,
		Sys:   sys,
	}
	path, argv := spec.path, spec.argv
	fork := direct
	if s.guest && p.cg != nil && os.Geteuid() == 0 {
		fork = enveloped(sys)
	}
	pid, done, err := s.reaper.Start(func() (int, error) {
		if s.guest {
			// The agent runs with oom_score_adj -1000, which children
			// inherit. Drop it around the fork (starts are serialized by
			// the reaper) so user processes are born with 0.
			setOOMScoreAdj(s.log, "0")
			defer setOOMScoreAdj(s.log, "-1000")
		}
		p.start = time.Now()
		return fork(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	})
	if err != nil {
		return nil, sysError("start process", err)
	}
	p.pid, p.done = pid, done
	return p, nil
}

func setOOMScoreAdj(log *slog.Logger, v string) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(v), 0); err != nil {
		log.Warn("oom_score_adj", "err", err)
	}
}

// kill kills the whole exec: its cgroup, or without cgroups its process
// group.
func (p *process) kill() {
	if p.cg != nil {
		if err := p.cg.Kill(); err == nil {
			return
		}
	}
	_ = p.reaper.Signal(p.pid, syscall.SIGKILL, true)
}

// signal sends sig to the process group, unless the process was reaped.
func (p *process) signal(sig int32) {
	if sig <= 0 || sig > 64 {
		return
	}
	_ = p.reaper.Signal(p.pid, syscall.Signal(sig), true)
}

func (p *process) writeStdin(b []byte) {
	p.stdinMu.Lock()
	w := p.stdin
	p.stdinMu.Unlock()
	if w != nil {
		// May block while the process does not read; Close (closeStdin)
		// unblocks it. Errors (EPIPE once the reader is gone) drop the data.
		_, _ = w.Write(b)
	}
}

// resize sets the terminal's size (false: not a terminal, or the size
// could not be set).
func (p *process) resize(ws *pty.Winsize) bool {
	if p.tty == nil || ws == nil {
		return false
	}
	rc, err := p.tty.SyscallConn()
	if err != nil {
		return false
	}
	var ierr error
	err = rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	})
	return err == nil && ierr == nil
}

func (p *process) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
}

// release frees what the agent holds for the exec. Background children keep
// running; their cgroup goes when they do.
func (p *process) release() {
	p.closeStdin()
	_ = p.stdout.Close()
	if p.stderr != nil {
		_ = p.stderr.Close()
	}
	if p.cg != nil {
		p.cg.Release()
	}
}
