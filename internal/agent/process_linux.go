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
}

// process is a started exec. Its fields are set before it is shared.
type process struct {
	pid    int
	done   <-chan syscall.WaitStatus
	start  time.Time
	reaper *reaper.Reaper
	cg     *cgroup.Exec // nil without cgroups

	stdout, stderr *os.File // read ends

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

	sys := &syscall.SysProcAttr{Setsid: true}
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
		Files: []uintptr{childStdin.Fd(), outW.Fd(), errW.Fd()},
		Sys:   sys,
	}
	path, argv := spec.path, spec.argv
	launch := direct
	if s.guest && p.cg != nil && os.Geteuid() == 0 {
		launch = enveloped(sys)
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
		return launch(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
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
	_ = p.stderr.Close()
	if p.cg != nil {
		p.cg.Release()
	}
}
