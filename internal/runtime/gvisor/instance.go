package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/hostcg"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// DefaultStopTimeout bounds Stop when its context has no deadline.
const DefaultStopTimeout = 10 * time.Second

type state int

const (
	stateCreated state = iota
	stateStarting
	stateRunning
	stateExited
)

// instance is one runsc sandbox whose init is the agent. The `runsc run`
// process is a child of the thread that started it (parent-death signal),
// and the sandbox and gofer die with it (runsc sets theirs for attached
// runs).
type instance struct {
	rt    *Runtime
	spec  runtime.Spec
	cid   string
	paths instancePaths
	log   *slog.Logger
	// agentSum is the sha256 of the agent binary the sandbox runs (set
	// before runsc starts; SaveState records it).
	agentSum string

	// procExited is closed once runsc has exited; done once everything is
	// released and status is final.
	procExited chan struct{}
	done       chan struct{}

	mu sync.Mutex
	// state, requested and status follow the lifecycle.
	state     state
	requested bool
	status    runtime.ExitStatus
	// startErr is why Start failed after spawning runsc (the exit Reason).
	startErr error
	// proc is `runsc run` once spawned.
	proc *os.Process
	// ctl is the host end of the agent's control channel (its stdin):
	// each session is a socket of its own sent on it (sessions.go).
	// sessions counts those sent, closed the acknowledgements read back.
	ctl      *net.UnixConn
	sessions int
	closed   int
	// agent is the host end of the session socket until AgentConn takes
	// it; redial allows one more session (after a live save).
	agent      *net.UnixConn
	agentTaken bool
	redial     bool
	// saving is set while a checkpoint may end the sandbox: its exit is
	// then a requested one.
	saving bool
	// link is the NIC's host side (Spec.Network) until NetConn takes it.
	link      *tapLink
	linkTaken bool
	// mon is the process audit's trace session (Spec.ProcAudit): set in
	// spawn before runsc starts; its fields are guarded by mu.
	mon *procMonitor
}

var (
	_ runtime.Instance   = (*instance)(nil)
	_ runtime.Networker  = (*instance)(nil)
	_ runtime.StateSaver = (*instance)(nil)
)

func newInstance(r *Runtime, spec runtime.Spec, cid string) *instance {
	return &instance{
		rt:   r,
		spec: spec,
		cid:  cid,
		paths: instancePaths{
			root:   filepath.Join(spec.RunDir, "runsc"),
			bundle: filepath.Join(spec.RunDir, "bundle"),
			upper:  filepath.Join(spec.RunDir, "upper"),
			logDir: filepath.Join(spec.RunDir, "runsc-logs"),
		},
		log:        r.log.With("instance", spec.ID, "container", cid),
		procExited: make(chan struct{}),
		done:       make(chan struct{}),
	}
}

func (in *instance) ID() string { return in.spec.ID }

// Start writes the OCI bundle, prepares the network namespace (Spec.Network)
// and spawns `runsc run`; it returns once the agent has written its first
// byte (runsc has no other "running" signal, and a sandbox that fails to
// come up only says so by exiting). ctx bounds only the start. On error
// everything is released and the instance has ended.
func (in *instance) Start(ctx context.Context) error {
	in.mu.Lock()
	switch in.state {
	case stateCreated:
	case stateExited:
		in.mu.Unlock()
		return runtime.ErrNotRunning
	default:
		in.mu.Unlock()
		return errors.New("gvisor: instance already started")
	}
	in.state = stateStarting
	in.mu.Unlock()
	in.rt.live.Add(1)

	hc, err := in.spawn()
	if err != nil {
		// Nothing runs: release what spawn made and end here.
		cerr := in.cleanup()
		in.finish(runtime.ExitStatus{Code: -1, Reason: "start: " + err.Error()}, cerr)
		return fmt.Errorf("start gvisor: %w", err)
	}
	if err := in.waitReady(ctx, hc); err != nil {
		in.mu.Lock()
		if in.startErr == nil && !in.requested {
			in.startErr = err
		}
		p := in.proc
		in.mu.Unlock()
		_ = p.Signal(syscall.SIGKILL)
		<-in.done
		in.mu.Lock()
		st := in.status
		in.mu.Unlock()
		if st.Requested {
			return fmt.Errorf("start gvisor: %w", runtime.ErrNotRunning)
		}
		return fmt.Errorf("start gvisor: %s", st.Reason)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != stateStarting {
		return fmt.Errorf("start gvisor: %w", runtime.ErrNotRunning)
	}
	in.state = stateRunning
	raiseStubs(in.log, in.proc.Pid)
	return nil
}

// spawn prepares the instance's files and starts runsc. It returns the host
// end of the agent socket; in.agent holds it too.
func (in *instance) spawn() (*net.UnixConn, error) {
	cfg := in.rt.cfg
	for _, d := range []string{in.paths.root, in.paths.bundle, in.paths.upper} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("run dir: %w", err)
		}
	}
	if cfg.Debug {
		if err := os.MkdirAll(in.paths.logDir, 0o700); err != nil {
			return nil, fmt.Errorf("run dir: %w", err)
		}
	}
	agent, sum, err := in.agentFor()
	if err != nil {
		return nil, err
	}
	in.agentSum = sum
	b := bundleSpec{agent: agent}
	if !cfg.IgnoreCgroups {
		b.cgroupsPath = in.cgroupParent() + "/" + in.cid
	}
	if in.spec.Network {
		l, err := newTapLink(in.cid)
		if err != nil {
			return nil, err
		}
		in.mu.Lock()
		in.link = l
		in.mu.Unlock()
		if err := l.prepare(); err != nil {
			return nil, err
		}
		b.netnsPath = l.netnsPath()
	}
	if in.spec.ProcAudit {
		in.prepareMonitor()
	}
	mounts, err := in.prepareMounts()
	if err != nil {
		return nil, err
	}
	b.mounts = mounts
	js, err := buildSpec(in.spec, b)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(in.paths.bundle, "config.json"), js, 0o600); err != nil {
		return nil, fmt.Errorf("write bundle: %w", err)
	}

	ctl, guest, err := socketPair("agent-control")
	if err != nil {
		return nil, err
	}
	defer guest.Close()
	hc, err := in.newSession(ctl)
	if err != nil {
		ctl.Close()
		return nil, err
	}
	console, err := os.OpenFile(filepath.Join(in.spec.RunDir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		hc.Close()
		ctl.Close()
		return nil, fmt.Errorf("console log: %w", err)
	}
	defer console.Close()

	if in.spec.WritableBytes > 0 {
		cfg.DiskBytes = in.spec.WritableBytes
	}
	cmd := exec.Command(cfg.RunscPath, runscArgs(cfg, in.paths, in.cid, in.spec)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = guest, console, console
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	started := make(chan error, 1)
	// The thread that forks runsc must live as long as runsc (the
	// parent-death signal fires when it exits): the goroutine keeps it
	// locked until runsc has exited, and then lets it die.
	go func() {
		goruntime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		in.acceptMonitor(cmd.Process.Pid)
		started <- nil
		_ = cmd.Wait()
		in.exited(cmd.ProcessState)
	}()
	if err := <-started; err != nil {
		hc.Close()
		ctl.Close()
		return nil, fmt.Errorf("spawn runsc: %w", err)
	}
	in.mu.Lock()
	in.proc = cmd.Process
	in.ctl = ctl
	in.sessions = 1
	in.agent = hc
	killNow := in.requested
	in.mu.Unlock()
	if killNow { // Kill raced with Start
		_ = cmd.Process.Signal(syscall.SIGKILL)
	}
	return hc, nil
}

// waitReady waits until the agent's first byte can be read from hc (it is
// left there for the caller), runsc exits, or ctx ends.
func (in *instance) waitReady(ctx context.Context, hc *net.UnixConn) error {
	rc, err := hc.SyscallConn()
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-in.procExited:
		case <-stop:
			return
		}
		_ = hc.SetReadDeadline(time.Now())
	})
	var peekErr error
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return false
		case err != nil:
			peekErr = err
		case n == 0:
			peekErr = errors.New("agent channel closed before the agent spoke")
		}
		return true
	})
	close(stop)
	wg.Wait()
	_ = hc.SetReadDeadline(time.Time{})
	select {
	case <-in.procExited:
		return errors.New("runsc exited")
	default:
	}
	if ctx.Err() != nil {
		return fmt.Errorf("wait for the agent: %w", context.Cause(ctx))
	}
	return errors.Join(err, peekErr)
}

// exited runs once runsc has exited: it releases everything and records how
// the instance ended.
func (in *instance) exited(ps *os.ProcessState) {
	in.mu.Lock()
	in.state = stateExited
	agent := in.agent
	if in.agentTaken {
		agent = nil
	}
	in.agent = nil
	ctl := in.ctl
	in.ctl = nil
	requested, startErr := in.requested || in.saving, in.startErr
	in.mu.Unlock()
	close(in.procExited)
	if agent != nil {
		agent.Close()
	}
	if ctl != nil {
		ctl.Close()
	}
	cerr := in.cleanup()

	st := runtime.ExitStatus{Code: ps.ExitCode(), Requested: requested}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		st.Signal = ws.Signal().String()
	}
	switch {
	case requested:
	case startErr != nil:
		st.Reason = "start: " + startErr.Error()
		if l := in.consoleTail(); l != "" {
			st.Reason += ": " + l
		}
	default:
		st.Reason = "sandbox ended unexpectedly (" + ps.String() + ")"
		if ps.ExitCode() == 128+int(syscall.SIGKILL) || st.Signal == syscall.SIGKILL.String() {
			// The host's OOM killer ends the whole sentry: gVisor does not
			// enforce memory limits per process inside.
			st.Reason += fmt.Sprintf("; the sentry was killed: unless someone killed it, the sandbox used up its %d MiB memory limit", in.spec.MemoryMiB)
		}
		// runsc's own last words, not the agent's logs (slog text lines).
		if l := in.consoleTail(); l != "" && !strings.HasPrefix(l, "time=") {
			st.Reason += ": " + l
		}
	}
	in.finish(st, cerr)
}

// finish records st and marks the instance released.
func (in *instance) finish(st runtime.ExitStatus, cleanupErr error) {
	if cleanupErr != nil {
		in.log.Warn("gvisor cleanup", "err", cleanupErr)
	}
	in.mu.Lock()
	in.state = stateExited
	in.status = st
	in.mu.Unlock()
	in.rt.live.Add(-1)
	close(in.done)
}

// cleanup removes runsc's state (and cgroups), the network namespace and
// the instance's directories. Safe to call more than once.
func (in *instance) cleanup() error {
	var errs []error
	if ents, err := os.ReadDir(in.paths.root); err == nil && len(ents) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, in.rt.cfg.RunscPath, "--root="+in.paths.root, "delete", "-force", in.cid).CombinedOutput()
		cancel()
		if err != nil && !bytes.Contains(out, []byte("does not exist")) {
			errs = append(errs, fmt.Errorf("runsc delete: %w: %s", err, bytes.TrimSpace(out)))
		}
	}
	in.mu.Lock()
	link := in.link
	in.link = nil
	if link != nil {
		link.closeConn() // unless NetConn took it: then its caller closes it
	}
	in.mu.Unlock()
	if link != nil {
		errs = append(errs, link.destroy())
	}
	in.closeMonitor()
	errs = append(errs, in.removeCgroups(), in.releaseMounts())
	// runsc bind-mounts a "null" network namespace into its root dir
	// (--network=none) and leaves it there.
	if ents, err := os.ReadDir(in.paths.root); err == nil {
		for _, e := range ents {
			_ = unix.Unmount(filepath.Join(in.paths.root, e.Name()), unix.MNT_DETACH)
		}
	}
	for _, d := range []string{in.paths.root, in.paths.bundle, in.paths.upper, in.paths.monitor} {
		if d == "" {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cgroupParent is the cgroup under which runsc makes this sandbox's:
// the shim's host envelope when it has one (Spec.HostCgroup), else
// Config.CgroupParent.
func (in *instance) cgroupParent() string {
	if in.spec.HostCgroup != "" {
		return in.spec.HostCgroup
	}
	return in.rt.cfg.CgroupParent
}

// HostOOMKills counts the host's OOM kills in runsc's cgroup for this
// sandbox: under systrap each guest address space is a host stub process
// there, and the one the host's OOM killer picks takes its guest process
// with it (SIGKILL), which the sentry's cgroupfs never counts.
func (in *instance) HostOOMKills() (uint64, error) {
	if in.rt.cfg.IgnoreCgroups {
		return 0, errors.New("runsc runs without host cgroups")
	}
	return hostcg.OOMKills(in.cgroupParent() + "/" + in.cid)
}

// removeCgroups removes the sandbox's cgroups if runsc left them (it does
// when the sandbox failed to start): cgroup v1 controllers and v2.
func (in *instance) removeCgroups() error {
	if in.rt.cfg.IgnoreCgroups {
		return nil
	}
	rel := strings.TrimPrefix(in.cgroupParent(), "/") + "/" + in.cid
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", rel))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", rel))
	var errs []error
	for _, d := range dirs {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// consoleTail returns the last non-empty line of console.log, cleaned and
// shortened, for an exit Reason.
func (in *instance) consoleTail() string {
	f, err := os.Open(filepath.Join(in.spec.RunDir, "console.log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, 4096)
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-int64(len(buf)), 0)
	n, _ := f.ReadAt(buf, off)
	lines := strings.Split(strings.TrimSpace(string(buf[:n])), "\n")
	last := strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, lines[len(lines)-1])
	if len(last) > 300 {
		last = last[:300]
	}
	return strings.TrimSpace(last)
}

// AgentConn returns the host end of the agent's session socket. Callable
// once after Start, and once more after each live SaveState; the caller
// closes it, which ends the session.
func (in *instance) AgentConn(ctx context.Context) (net.Conn, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.state != stateRunning || in.ctl == nil:
		return nil, runtime.ErrNotRunning
	case in.agent != nil && !in.agentTaken:
		in.agentTaken = true
		return in.agent, nil
	case !in.redial:
		return nil, errors.New("gvisor: agent conn already taken")
	}
	c, err := in.newSession(in.ctl)
	if err != nil {
		return nil, err
	}
	in.sessions++
	in.redial = false
	in.agent, in.agentTaken = c, true
	return c, nil
}

// Wait blocks until the sandbox has exited and everything is released.
func (in *instance) Wait(ctx context.Context) (runtime.ExitStatus, error) {
	select {
	case <-in.done:
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.status, nil
	case <-ctx.Done():
		return runtime.ExitStatus{}, fmt.Errorf("wait for gvisor: %w", context.Cause(ctx))
	}
}

// Stop ends the sandbox and returns once it is released. The agent
// ignores SIGTERM as PID 1 and a gVisor sandbox has no power button worth
// waiting for (nothing in it needs flushing: its writable layer dies with
// it), so Stop kills at once. Idempotent; before Start it ends the
// instance.
func (in *instance) Stop(ctx context.Context) error {
	if err := in.Kill(); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStopTimeout)
		defer cancel()
	}
	select {
	case <-in.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop gvisor: %w", context.Cause(ctx))
	}
}

// Kill sends SIGKILL to `runsc run` (the sandbox and gofer die with it;
// cleanup's `runsc delete -force` makes sure). It does not wait.
// Idempotent; safe after exit.
func (in *instance) Kill() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch in.state {
	case stateCreated:
		in.state = stateExited
		in.requested = true
		in.status = runtime.ExitStatus{Requested: true}
		close(in.procExited)
		close(in.done)
	case stateExited:
	default:
		in.requested = true
		if in.proc != nil {
			_ = in.proc.Signal(syscall.SIGKILL)
		}
	}
	return nil
}
