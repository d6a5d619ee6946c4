package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu/qmp"
)

const (
	// DefaultStopTimeout bounds Stop when its context has no deadline.
	DefaultStopTimeout = 5 * time.Second
	// quitMargin is the part of Stop's time kept for QMP quit (a clean
	// QEMU exit that flushes the disk) after the guest ignored the
	// power button.
	quitMargin = time.Second
	// killWait bounds the wait for a SIGKILLed QEMU to be reaped.
	killWait = 10 * time.Second
	// qemuLogLimit caps RunDir/qemu.log (QEMU's stderr).
	qemuLogLimit = 256 << 10
)

type instState int

const (
	stateCreated instState = iota
	stateStarting
	stateRunning
	stateExited
)

// instance is one QEMU process. Its lifetime is owned by a goroutine
// started in Start (own), which alone waits for the process and releases
// everything; the other methods only signal it and wait on done.
type instance struct {
	rt    *Runtime
	spec  runtime.Spec
	accel string
	probe bool
	log   *slog.Logger
	// restoreKind is the kind of Spec.RestoreFrom (kindTemplate or
	// kindFull), "" for a cold boot.
	restoreKind string
	// machine is the machine profile: machineV2 for a cold boot, the
	// snapshot's for a restore (its meta.json; "" for the profile before).
	machine string

	done chan struct{} // closed when the VMM has exited and all is released

	mu         sync.Mutex
	state      instState
	requested  bool        // Stop, Kill or SaveSnapshot ended (or will end) it
	proc       *os.Process // set once QEMU runs
	qmp        *qmp.Client // set once the QMP handshake is done
	agent      net.Conn    // host end of the agent channel until handed out
	agentTaken bool        // AgentConn was called successfully (reset by a live SaveState)
	netConn    net.Conn    // host end of the NIC's link (Spec.Network) until handed out
	netTaken   bool        // NetConn was called successfully
	shutdown   string      // reason of QMP's SHUTDOWN event
	status     runtime.ExitStatus
	startErr   string   // one line, if QEMU died during Start
	rootNode   string   // the root disk's active block node ("root", then "root-N" after live snapshots)
	diskGen    int      // live snapshots taken (names new root nodes)
	reaped     bool     // own() has reaped QEMU and closed its endpoints
	ram        *os.File // a Snapshottable instance's RAM memfd; closed (by release) once QEMU is gone

	events sync.WaitGroup // watchEvents; own() waits for it
}

var (
	_ runtime.Instance    = (*instance)(nil)
	_ runtime.Snapshotter = (*instance)(nil)
	_ runtime.Networker   = (*instance)(nil)
	_ runtime.StateSaver  = (*instance)(nil)
)

func (r *Runtime) newInstance(spec runtime.Spec, accel string, probe bool) *instance {
	return &instance{
		rt:      r,
		spec:    spec,
		accel:   accel,
		probe:   probe,
		machine: machineV2,
		log:     r.log.With("sandbox_id", spec.ID),
		done:    make(chan struct{}),

		rootNode: "root",
	}
}

// ID returns Spec.ID.
func (in *instance) ID() string { return in.spec.ID }

// Start launches QEMU and returns once it runs: after the QMP handshake
// for a cold boot, and once the guest is running again for a restore. It
// does not wait for the agent. On error everything is released and Wait
// returns at once. Start may be called once; after Stop or Kill it fails
// with runtime.ErrNotRunning.
func (in *instance) Start(ctx context.Context) error {
	in.mu.Lock()
	switch in.state {
	case stateCreated:
		in.state = stateStarting
	case stateExited:
		in.mu.Unlock()
		return fmt.Errorf("start: %w (stopped before start)", runtime.ErrNotRunning)
	default:
		in.mu.Unlock()
		return fmt.Errorf("%w: start called twice", errdefs.ErrConflict)
	}
	in.mu.Unlock()

	t0 := time.Now()
	if err := in.start(ctx); err != nil {
		in.log.Warn("qemu start failed", "err", err)
		return fmt.Errorf("start qemu: %w", err)
	}
	in.log.Info("qemu started", "accel", in.accel, "restore", in.spec.RestoreFrom != "", "took", time.Since(t0))
	return nil
}

// launch holds what start prepares for the owner goroutine.
type launch struct {
	cmd        *exec.Cmd
	lease      *uidLease
	childFiles []*os.File // QEMU's ends; closed once QEMU has them
	console    *consoleLog
	conHost    *os.File // host end of the serial console
	stderr     *cappedWriter
	stderrFile *os.File
	memFile    *os.File // a Snapshottable instance's RAM memfd (instance.ram too)
	// fsds serve Spec.Mounts' host directories (virtio-fs) from the
	// mount points in mountsDir.
	fsds      []*exec.Cmd
	mountsDir string
}

// release frees everything in l except the process (used on failures
// before QEMU started, and by own after it exited).
func (l *launch) release() error {
	var errs []error
	for _, f := range l.childFiles {
		if f != nil {
			f.Close()
		}
	}
	if l.conHost != nil {
		l.conHost.Close()
	}
	if l.console != nil {
		errs = append(errs, l.console.Close())
	}
	if l.stderrFile != nil {
		errs = append(errs, l.stderrFile.Close())
	}
	if l.memFile != nil {
		errs = append(errs, l.memFile.Close())
	}
	for _, c := range l.fsds {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	if l.mountsDir != "" {
		errs = append(errs, runtime.ReleaseMountPoints(l.mountsDir))
	}
	errs = append(errs, l.lease.Release())
	return errors.Join(errs...)
}

// GuestMountsVolumes: the guest mounts Spec.Mounts' disks itself
// (runtime.GuestMounter).
func (in *instance) GuestMountsVolumes() bool { return true }

func (in *instance) start(ctx context.Context) (err error) {
	l := &launch{}
	var hostQMP, hostAgent, hostNet net.Conn
	defer func() {
		if err != nil && l.cmd == nil {
			// QEMU never ran: release here.
			for _, c := range []net.Conn{hostQMP, hostAgent, hostNet} {
				if c != nil {
					c.Close()
				}
			}
			_ = l.release()
			_ = os.Remove(filepath.Join(in.spec.RunDir, agentSock))
			in.finish(runtime.ExitStatus{Code: -1, Reason: "VMM failed to start"})
		}
	}()

	if l.lease, err = acquireUID(in.rt.cfg.StateDir, in.rt.cfg.UIDBase, in.rt.cfg.UIDCount); err != nil {
		return err
	}
	uid := l.lease.UID

	// ExtraFiles[i] is fd 3+i in QEMU; see the fd* constants.
	files := make([]*os.File, fdVolume0-3+len(in.spec.Mounts))
	set := func(fd int, f *os.File) { files[fd-3] = f }

	var conChild, qmpChild, agentChild *os.File
	if l.conHost, conChild, err = socketpair("console"); err != nil {
		return err
	}
	l.childFiles = append(l.childFiles, conChild)
	set(fdConsole, conChild)
	if hostQMP, qmpChild, err = socketpairConn("qmp"); err != nil {
		return err
	}
	l.childFiles = append(l.childFiles, qmpChild)
	set(fdQMP, qmpChild)
	// The agent channel is a listening socket in RunDir that QEMU accepts
	// on (server=on): the first connection is made here, before QEMU
	// runs; a live SaveState connects again after the caller closed it.
	if agentChild, err = listenAgent(in.spec.RunDir); err != nil {
		return err
	}
	if in.spec.NoAgentHost {
		// QEMU listens; nobody connects.
	} else if hostAgent, err = dialAgent(in.spec.RunDir); err != nil {
		agentChild.Close()
		return err
	}
	l.childFiles = append(l.childFiles, agentChild)
	set(fdAgent, agentChild)

	fds := fdLayout{}
	if in.spec.Network && !in.probe {
		var netChild *os.File
		if hostNet, netChild, err = socketpairConn("net"); err != nil {
			return err
		}
		l.childFiles = append(l.childFiles, netChild)
		set(fdNet, netChild)
		fds.Net = true
	}
	if in.spec.RootDisk != "" {
		disk, err := os.OpenFile(in.spec.RootDisk, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("root disk: %w", err)
		}
		l.childFiles = append(l.childFiles, disk)
		set(fdDisk, disk)
		fds.Disk = true
	}
	for i, m := range in.spec.Mounts {
		if m.Dir != "" {
			conn, err := l.startVirtiofsd(in.spec.RunDir, i, m)
			if err != nil {
				return fmt.Errorf("mount at %s: %w", m.Target, err)
			}
			l.childFiles = append(l.childFiles, conn)
			set(fdVolume0+i, conn)
			fds.FS = true
			continue
		}
		flag := os.O_RDWR
		if m.ReadOnly {
			flag = os.O_RDONLY
		}
		img, err := os.OpenFile(m.Image, flag|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("volume image: %w", err)
		}
		l.childFiles = append(l.childFiles, img)
		set(fdVolume0+i, img)
	}
	if in.spec.Snapshottable {
		// The RAM lives in a memfd (tmpfs): a full restore writes every
		// page it carries through QEMU's shared mapping, which cost about
		// 50 us a page on an ext4 file (1.8 s for a 90 MB fork state)
		// and 2 us here. SaveSnapshot copies its non-zero pages out. A
		// memfd is mode 0777: QEMU opens it again through /proc/self/fd,
		// read-write, under its own uid.
		mem, err := memfdCreate("airlock-ram-"+in.spec.ID, mfdCloexec)
		if err != nil {
			return fmt.Errorf("ram file: %w", err)
		}
		l.memFile = mem
		in.mu.Lock()
		in.ram = mem
		in.mu.Unlock()
		if err := mem.Truncate(int64(in.spec.MemoryMiB) << 20); err != nil {
			return fmt.Errorf("ram file: %w", err)
		}
		set(fdMem, mem)
		fds.Mem, fds.MemShare = true, true
	}
	if in.spec.RestoreFrom != "" {
		if in.restoreKind == kindTemplate {
			// Create refused Snapshottable with a template.
			mem, err := in.rt.mems.get(filepath.Join(in.spec.RestoreFrom, snapMem))
			if err != nil {
				return fmt.Errorf("snapshot ram: %w", err)
			}
			l.childFiles = append(l.childFiles, mem)
			set(fdMem, mem)
			fds.Mem = true
		}
		// A full snapshot's RAM is in its stream: it loads into fresh
		// anonymous RAM, or into the RAM file of a Snapshottable instance.
		state, err := os.Open(filepath.Join(in.spec.RestoreFrom, snapState))
		if err != nil {
			return fmt.Errorf("snapshot state: %w", err)
		}
		l.childFiles = append(l.childFiles, state)
		set(fdIncoming, state)
		fds.Incoming = true
	}
	// Trailing nils would close nothing useful; drop them.
	for len(files) > 0 && files[len(files)-1] == nil {
		files = files[:len(files)-1]
	}

	if l.stderrFile, err = os.OpenFile(filepath.Join(in.spec.RunDir, "qemu.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
		return fmt.Errorf("qemu log: %w", err)
	}
	l.stderr = &cappedWriter{w: l.stderrFile, limit: qemuLogLimit}
	conFile, err := os.OpenFile(filepath.Join(in.spec.RunDir, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("console log: %w", err)
	}
	l.console = newConsoleLog(conFile, in.rt.cfg.ConsoleLimit)

	argv := buildArgs(argConfig{Accel: in.accel, TSCkHz: in.rt.tscKHz, Probe: in.probe, Legacy: in.machine == ""}, in.spec, fds)
	var groups []uint32
	if in.accel == "kvm" && in.rt.kvmGID >= 0 {
		groups = append(groups, uint32(in.rt.kvmGID))
	}
	cmd := exec.Command(in.rt.qemu, argv...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout = l.stderr
	cmd.Stderr = l.stderr
	cmd.ExtraFiles = files
	cmd.SysProcAttr = vmmSysProcAttr(uid, groups)
	in.log.Debug("qemu argv", "argv", argv, "uid", uid)

	started := make(chan error, 1)
	l.cmd = cmd
	in.mu.Lock()
	in.agent = hostAgent
	in.netConn = hostNet
	in.mu.Unlock()
	go in.own(l, hostQMP, started)
	if err := <-started; err != nil {
		<-in.done
		return err
	}

	// From here on own() releases everything; on failure kill and wait.
	fail := func(err error) error {
		in.kill(false)
		<-in.done
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.startErr != "" {
			return fmt.Errorf("%w (%s)", err, in.startErr)
		}
		return err
	}
	q, err := qmp.Dial(ctx, hostQMP)
	if err != nil {
		return fail(err)
	}
	in.mu.Lock()
	if in.reaped {
		// QEMU is already gone and own() has cleaned up without us.
		in.mu.Unlock()
		_ = q.Close()
		return fail(errors.New("qemu exited during start"))
	}
	in.qmp = q
	in.events.Add(1)
	in.mu.Unlock()
	go func() {
		defer in.events.Done()
		in.watchEvents(q)
	}()

	if in.spec.RestoreFrom != "" {
		if err := in.incoming(ctx, q); err != nil {
			return fail(err)
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != stateStarting {
		return fmt.Errorf("%w: stopped during start", runtime.ErrNotRunning)
	}
	in.state = stateRunning
	return nil
}

// own starts QEMU, waits for it, releases everything and closes done. It
// runs on a locked OS thread for QEMU's whole life: the parent-death signal
// fires when the forking thread exits, not the process (golang/go#27505),
// and a goroutine elsewhere that exits while locked would take its thread
// down with it.
func (in *instance) own(l *launch, hostQMP net.Conn, started chan<- error) {
	// Locked for good: QEMU's parent-death signal follows this thread,
	// and confineThread changes it for QEMU alone (the thread ends with
	// this goroutine).
	goruntime.LockOSThread()

	err := confineThread()
	if err == nil {
		err = l.cmd.Start()
	}
	for _, f := range l.childFiles {
		f.Close() // QEMU has its copies (or never will)
	}
	l.childFiles = nil
	if err != nil {
		hostQMP.Close()
		in.mu.Lock()
		if in.agent != nil {
			in.agent.Close()
			in.agent = nil
		}
		if in.netConn != nil {
			in.netConn.Close()
			in.netConn = nil
		}
		in.mu.Unlock()
		_ = l.release()
		in.finish(runtime.ExitStatus{Code: -1, Reason: "VMM failed to start"})
		started <- fmt.Errorf("exec qemu: %w", err)
		return
	}
	raiseOOMScore(in.log, l.cmd.Process.Pid)
	in.mu.Lock()
	in.proc = l.cmd.Process
	killNow := in.requested
	in.mu.Unlock()
	if killNow {
		_ = l.cmd.Process.Kill()
	}
	started <- nil

	var wg sync.WaitGroup
	wg.Go(func() {
		// EOF when QEMU (the only other holder) exits.
		_, _ = io.Copy(l.console, l.conHost)
	})
	waitErr := l.cmd.Wait()
	wg.Wait()

	in.mu.Lock()
	q := in.qmp
	agent, netConn := in.agent, in.netConn
	in.agent, in.netConn = nil, nil
	in.reaped = true
	in.mu.Unlock()
	if q != nil {
		_ = q.Close()
		in.events.Wait()
	} else {
		hostQMP.Close()
	}
	if agent != nil {
		agent.Close()
	}
	if netConn != nil {
		netConn.Close()
	}
	st := in.exitStatus(l, waitErr)
	if err := l.release(); err != nil {
		in.log.Warn("release instance resources", "err", err)
	}
	_ = os.Remove(filepath.Join(in.spec.RunDir, agentSock))
	in.finish(st)
}

// exitStatus says how QEMU ended.
func (in *instance) exitStatus(l *launch, waitErr error) runtime.ExitStatus {
	st := runtime.ExitStatus{Code: -1}
	ps := l.cmd.ProcessState
	if ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			st.Signal = ws.Signal().String()
		} else {
			st.Code = ps.ExitCode()
		}
	} else if waitErr != nil {
		in.log.Warn("wait for qemu", "err", waitErr)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	st.Requested = in.requested
	if in.state == stateStarting {
		in.startErr = l.stderr.LastLine()
	}
	if st.Requested {
		return st
	}
	switch {
	case l.console.PanicMessage() != "":
		st.Reason = "guest kernel panic: " + strings.TrimSpace(strings.TrimPrefix(l.console.PanicMessage(), "Kernel panic - not syncing:"))
	case in.shutdown == "guest-shutdown":
		st.Reason = "guest powered off"
	case in.shutdown == "guest-reset":
		st.Reason = "guest rebooted (a reboot ends the sandbox)"
	case in.shutdown == "guest-panic":
		st.Reason = "guest kernel panic"
	case st.Signal != "":
		st.Reason = "VMM killed by signal " + st.Signal
	case in.state == stateStarting:
		st.Reason = "VMM failed to start"
	default:
		st.Reason = fmt.Sprintf("VMM exited unexpectedly (code %d)", st.Code)
	}
	in.log.Warn("qemu exited", "code", st.Code, "signal", st.Signal, "reason", st.Reason, "shutdown", in.shutdown, "stderr", l.stderr.LastLine())
	return st
}

// finish records the final status and closes done. Called once.
func (in *instance) finish(st runtime.ExitStatus) {
	in.mu.Lock()
	in.state = stateExited
	st.Requested = st.Requested || in.requested
	in.status = st
	in.mu.Unlock()
	close(in.done)
}

// watchEvents consumes QMP events until the connection ends.
func (in *instance) watchEvents(q *qmp.Client) {
	for ev := range q.Events() {
		switch ev.Name {
		case "SHUTDOWN":
			var d struct {
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(ev.Data, &d)
			in.mu.Lock()
			in.shutdown = d.Reason
			in.mu.Unlock()
			in.log.Info("qemu shutdown", "reason", d.Reason)
		default:
			in.log.Debug("qmp event", "event", ev.Name)
		}
	}
}

// AgentConn returns the host end of the agent channel (a *net.UnixConn).
// It can be taken once after Start, and once more after each live
// SaveState; the caller closes it.
func (in *instance) AgentConn(ctx context.Context) (net.Conn, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.spec.NoAgentHost:
		return nil, fmt.Errorf("%w: agent conn: the instance was created with NoAgentHost", errdefs.ErrFailedPrecondition)
	case in.state != stateRunning:
		return nil, fmt.Errorf("agent conn: %w", runtime.ErrNotRunning)
	case in.agentTaken:
		return nil, fmt.Errorf("%w: agent conn already taken", errdefs.ErrConflict)
	case in.agent == nil:
		return nil, fmt.Errorf("agent conn: %w", runtime.ErrNotRunning)
	}
	c := in.agent
	in.agent, in.agentTaken = nil, true
	return c, nil
}

// NetConn returns the host end of the NIC's link (a *net.UnixConn carrying
// QEMU's stream netdev framing). It can be taken once, after Start, from an
// instance created with Spec.Network; the caller closes it. A taken conn is
// not closed at exit: reads then see EOF.
func (in *instance) NetConn(ctx context.Context) (net.Conn, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case !in.spec.Network:
		return nil, fmt.Errorf("%w: instance has no network (Spec.Network)", errdefs.ErrFailedPrecondition)
	case in.state != stateRunning:
		return nil, fmt.Errorf("net conn: %w", runtime.ErrNotRunning)
	case in.netTaken:
		return nil, fmt.Errorf("%w: net conn already taken", errdefs.ErrConflict)
	case in.netConn == nil:
		return nil, fmt.Errorf("net conn: %w", runtime.ErrNotRunning)
	}
	c := in.netConn
	in.netConn, in.netTaken = nil, true
	return c, nil
}

// Wait blocks until QEMU has exited and everything is released, or ctx
// ends. Safe from many goroutines and after exit.
func (in *instance) Wait(ctx context.Context) (runtime.ExitStatus, error) {
	select {
	case <-in.done:
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.status, nil
	case <-ctx.Done():
		return runtime.ExitStatus{}, fmt.Errorf("wait for qemu: %w", context.Cause(ctx))
	}
}

// Stop presses the guest's power button (ACPI, QMP system_powerdown),
// then asks QEMU to quit (flushing the disk) shortly before ctx's deadline
// (DefaultStopTimeout if it has none), then kills it. It returns once QEMU
// has exited. Idempotent; before Start it ends the instance.
func (in *instance) Stop(ctx context.Context) error {
	if in.endBeforeStart() {
		return nil
	}
	in.mu.Lock()
	switch in.state {
	case stateExited:
		in.mu.Unlock()
		<-in.done
		return nil
	}
	in.requested = true
	q := in.qmp
	in.mu.Unlock()

	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultStopTimeout)
	}
	if q != nil {
		c, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		err := q.Execute(c, "system_powerdown", nil, nil)
		cancel()
		if err == nil && in.waitDone(time.Until(deadline)-quitMargin) {
			return nil
		}
		c, cancel = context.WithTimeout(context.WithoutCancel(ctx), max(time.Until(deadline), 100*time.Millisecond))
		err = q.Execute(c, "quit", nil, nil)
		cancel()
		if err == nil && in.waitDone(time.Until(deadline)) {
			return nil
		}
	}
	in.kill(true)
	if !in.waitDone(killWait) {
		return fmt.Errorf("stop: qemu did not exit %v after SIGKILL", killWait)
	}
	return nil
}

// waitDone waits up to d for done.
func (in *instance) waitDone(d time.Duration) bool {
	if d <= 0 {
		select {
		case <-in.done:
			return true
		default:
			return false
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-in.done:
		return true
	case <-t.C:
		return false
	}
}

// Kill sends SIGKILL to QEMU. Idempotent; before Start it ends the
// instance. It does not wait: use Wait.
func (in *instance) Kill() error {
	if !in.endBeforeStart() {
		in.kill(true)
	}
	return nil
}

// endBeforeStart ends an instance that was never started, and reports
// whether it did.
func (in *instance) endBeforeStart() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != stateCreated {
		return false
	}
	in.state = stateExited
	in.requested = true
	in.status = runtime.ExitStatus{Requested: true}
	close(in.done)
	return true
}

// kill sends SIGKILL; requested says whether this is the caller's wish
// (Stop, Kill, a finished snapshot) rather than a failure's cleanup.
func (in *instance) kill(requested bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state == stateExited {
		return
	}
	in.requested = in.requested || requested
	if in.proc != nil {
		// os.Process signals through a pidfd: no pid reuse race.
		if err := in.proc.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			in.log.Warn("kill qemu", "err", err)
		}
	}
}

// agentSock is the agent channel's listening socket in RunDir.
const agentSock = "agent.sock"

// maxSunPath is what fits in sockaddr_un.sun_path with its NUL.
const maxSunPath = 107

// inDir runs fn with a path naming dir/name short enough for a unix
// socket address: the plain one, or one through /proc/self/fd.
func inDir(dir, name string, fn func(path string) error) error {
	p := filepath.Join(dir, name)
	if len(p) <= maxSunPath {
		return fn(p)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	return fn(fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name))
}

// listenAgent creates the agent channel's listening socket in dir (mode
// 0600, replacing a stale one) and returns it for QEMU.
func listenAgent(dir string) (*os.File, error) {
	_ = os.Remove(filepath.Join(dir, agentSock))
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), "agent-listener")
	err = inDir(dir, agentSock, func(p string) error {
		if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: p}); err != nil {
			return err
		}
		return os.Chmod(p, 0o600)
	})
	if err == nil {
		err = syscall.Listen(fd, 4)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	return f, nil
}

// dialAgent connects to the agent channel's socket in dir. It succeeds
// as soon as the connection is queued, even before QEMU accepts it.
func dialAgent(dir string) (net.Conn, error) {
	var c net.Conn
	err := inDir(dir, agentSock, func(p string) error {
		var err error
		c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: p, Net: "unix"})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	return c, nil
}

// socketpair returns two connected unix stream sockets as files.
func socketpair(name string) (host, child *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair %s: %w", name, err)
	}
	return os.NewFile(uintptr(fds[0]), name+"-host"), os.NewFile(uintptr(fds[1]), name+"-vmm"), nil
}

// socketpairConn is socketpair with the host end as a *net.UnixConn.
func socketpairConn(name string) (net.Conn, *os.File, error) {
	h, c, err := socketpair(name)
	if err != nil {
		return nil, nil, err
	}
	conn, err := net.FileConn(h)
	h.Close()
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("socketpair %s: %w", name, err)
	}
	return conn, c, nil
}

// ResizeRootDisk grows the root disk's virtual size to bytes and notifies
// the guest (a virtio-blk config change), e.g. after restoring a clone whose
// overlay should be larger than its template's.
func (in *instance) ResizeRootDisk(ctx context.Context, bytes int64) error {
	in.mu.Lock()
	q := in.qmp
	in.mu.Unlock()
	if q == nil {
		return runtime.ErrNotRunning
	}
	in.mu.Lock()
	node := in.rootNode
	in.mu.Unlock()
	if err := q.Execute(ctx, "block_resize", map[string]any{"node-name": node, "size": bytes}, nil); err != nil {
		return fmt.Errorf("resize root disk: %w", err)
	}
	return nil
}

var _ runtime.DiskResizer = (*instance)(nil)

// oPath is Linux's O_PATH (not in package syscall).
const oPath = 0x200000

// raiseOOMScore makes the VMM the host OOM killer's first choice within
// its sandbox: its oom_score_adj is this process's (the shim's) plus 100,
// at most 1000. Under a sandbox's memory envelope (hostcg) the kernel then
// ends the VMM, whose exit the shim reports as out of memory, rather than
// the shim. Best effort: a failure is logged.
func raiseOOMScore(log *slog.Logger, pid int) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err == nil {
		var adj int
		if adj, err = strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			err = os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(min(adj+100, 1000))), 0)
		}
	}
	if err != nil {
		log.Warn("VMM oom_score_adj not raised", "err", err)
	}
}
