package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agent/boot"
	"github.com/airlock-sandbox/airlock/internal/agent/cgroup"
	"github.com/airlock-sandbox/airlock/internal/agent/reaper"
	"github.com/airlock-sandbox/airlock/internal/agent/vport"
	"github.com/airlock-sandbox/airlock/internal/agentapi"
)

// PortName is the name of the control channel's virtio-serial port.
const PortName = "airlock"

// Main runs the agent as the guest's PID 1: boot, then serve the control
// channel forever. It returns only if the process is not PID 1. level, if
// set, is raised to Debug when the kernel command line has airlock.debug=1.
func Main(log *slog.Logger, level *slog.LevelVar, version string) error {
	if os.Getpid() != 1 {
		return errors.New("airlock-agent runs only as PID 1 inside an airlock guest")
	}
	if len(os.Args) > 1 && os.Args[1] == ContainerArg {
		containerMain(log, version)
		return nil
	}
	started := uptime()
	holdSignals(log)
	rp := reaper.New(reaper.Options{Logger: log, All: true})

	res := boot.Guest(log)
	if level != nil && res.Cmdline.Debug {
		level.Set(slog.LevelDebug)
	}
	// Size the user subtree from what is free now, after the kernel, the
	// initramfs and the agent took theirs: sized from MemTotal, user work
	// could exhaust the guest before its own limit and set off the global
	// OOM killer (seen with a 256 MiB guest).
	memTotal, memAvail := memTotal(), meminfo("MemAvailable")
	cg, err := cgroup.Setup(cgroup.Options{Logger: log, Memory: cmp.Or(memAvail, memTotal), TaskLimit: taskLimit()})
	if err != nil {
		log.Error("cgroups: execs run without limits", "err", err)
		cg = nil
	}
	pids := res.Cmdline.Pids
	if cg != nil && cg.SubtreePidsMax() > 0 && uint64(pids) > cg.SubtreePidsMax() {
		pids = uint32(cg.SubtreePidsMax())
	}
	srv, err := NewServer(Options{
		Logger:           log,
		Version:          version,
		Reaper:           rp,
		Cgroups:          cg,
		DefaultPidsLimit: pids,
		Guest:            true,
		RootDevice:       res.RootDevice,
	})
	if err != nil {
		log.Error("agent", "err", err) // cannot happen: options are complete
		select {}
	}
	log.Info("booted",
		"init_ms", started.Milliseconds(),
		"uptime_ms", uptime().Milliseconds(),
		"version", version,
		"modules", res.Modules,
		"root", res.RootDevice,
		"probe", res.Cmdline.Probe,
		"mem_total", memTotal,
		"mem_available", memAvail,
		"pids_default", pids,
	)
	serveForever(log, srv)
	return nil
}

// serveForever finds and opens the control port, then serves one host
// connection after another on it.
func serveForever(log *slog.Logger, srv *Server) {
	ctx := context.Background()
	var port *vport.Port
	for port == nil {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		dev, err := vport.Find(fctx, "/sys/class/virtio-ports", "/dev", PortName)
		cancel()
		if err != nil {
			log.Error("control channel not found, still looking", "err", err)
			continue
		}
		if port, err = vport.Open(dev); err != nil {
			log.Error("open control channel", "dev", dev, "err", err)
			time.Sleep(time.Second)
			continue
		}
		log.Debug("control channel", "dev", dev, "uptime_ms", uptime().Milliseconds())
	}
	for {
		start := time.Now()
		conn := port.Conn()
		err := agentapi.Serve(ctx, conn, srv.Handler())
		_ = conn.Close()
		log.Debug("host session ended", "took", time.Since(start), "err", err)
		if err != nil && time.Since(start) < 100*time.Millisecond {
			time.Sleep(100 * time.Millisecond) // do not spin on a broken port
		}
	}
}

// holdSignals keeps signals that would end the Go runtime from reaching it:
// the kernel delivers to PID 1 only signals it has a handler for, and Go
// installs handlers whose default is to exit (or, for a SIGSEGV, SIGBUS,
// SIGFPE or SIGILL sent with kill, to crash). Notified signals get a handler
// that only logs here, and unlike SIG_IGN it is not inherited by exec'd
// children. Real faults still panic as usual.
func holdSignals(log *slog.Logger) {
	c := make(chan os.Signal, 8)
	signal.Notify(c,
		syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTRAP, syscall.SIGABRT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTERM,
		syscall.SIGSTKFLT, syscall.SIGVTALRM, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGPWR,
		syscall.SIGSYS, syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL,
	)
	go func() { // lives as long as the process
		for s := range c {
			log.Debug("signal ignored", "signal", s.String())
		}
	}()
}

// taskLimit is how many tasks the kernel can have: min(pid_max, threads-max).
func taskLimit() uint64 {
	read := func(p string) uint64 {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	a, b := read("/proc/sys/kernel/pid_max"), read("/proc/sys/kernel/threads-max")
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

func uptime() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// --- Container mode (gVisor runtime, internal/runtime/gvisor). ---

// ContainerArg, as the agent's first argument, selects container mode: the
// agent is PID 1 of a gVisor (runsc) sandbox rather than of a VM. runsc has
// already mounted /proc, /sys, /dev and the root overlay, so there is no
// boot. The clock and the RNG are the host's: Sync does not set them.
//
// The control channel is fd 0, one end of a unix socketpair the host
// passed as stdin, and it carries no protocol traffic itself: the host
// sends each session as a socket of its own (one byte with the socket in
// SCM_RIGHTS), the agent serves it (Banner, then HTTP/2) until the host
// closes it, closes its end and writes one byte back on fd 0. A checkpoint
// needs that: runsc saves the sandbox's stdin (the host hands a new one to
// the restore) but cannot save a host socket received at run time, so the
// host ends the session and waits for the agent's byte before it saves,
// and after a restore or a live save it sends a new session.
const ContainerArg = "-container"

func containerMain(log *slog.Logger, version string) {
	holdSignals(log)
	rp := reaper.New(reaper.Options{Logger: log, All: true})
	hideSelf(log)
	cg, pids := containerCgroups(log)
	srv, err := NewServer(Options{
		Logger: log, Version: version, Reaper: rp, Guest: true,
		Cgroups: cg, DefaultPidsLimit: pids,
		system: containerSystem{guestSystem{log: log}},
	})
	var ctl *net.UnixConn
	if err == nil {
		var c net.Conn
		if c, err = net.FileConn(os.Stdin); err == nil {
			ctl, _ = c.(*net.UnixConn)
			if ctl == nil {
				err = errors.New("stdin is not a unix socket")
			}
		}
	}
	if err == nil {
		log.Info("serving", "mode", "container", "version", version)
		err = serveSessions(log, ctl, srv.Handler())
	}
	log.Info("control channel ended; idle until the sandbox is stopped", "err", err)
	for {
		time.Sleep(time.Hour) // PID 1 must not exit
	}
}

// serveSessions serves one host session after another, each received on
// ctl (see ContainerArg). It returns when ctl ends: the host is gone.
func serveSessions(log *slog.Logger, ctl *net.UnixConn, h http.Handler) error {
	for {
		conn, err := recvSession(ctl)
		if err != nil {
			return err
		}
		if conn == nil {
			continue // a byte without a socket: nothing to serve
		}
		start := time.Now()
		err = agentapi.Serve(context.Background(), conn, h)
		_ = conn.Close()
		log.Debug("host session ended", "took", time.Since(start), "err", err)
		if _, err := ctl.Write([]byte{agentapi.SessionClosed}); err != nil {
			return fmt.Errorf("control channel: %w", err)
		}
	}
}

// recvSession reads one message from ctl and returns the session socket it
// carries, or nil if it carries none. io.EOF means the host closed ctl.
func recvSession(ctl *net.UnixConn) (net.Conn, error) {
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := ctl.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, fmt.Errorf("control channel: %w", err)
	}
	if n == 0 && oobn == 0 {
		return nil, io.EOF
	}
	var fds []int
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) == 0 {
		return nil, nil
	}
	for _, fd := range fds[1:] { // one socket per message; close the rest
		_ = unix.Close(fd)
	}
	// Execs must never inherit the host's socket.
	unix.CloseOnExec(fds[0])
	f := os.NewFile(uintptr(fds[0]), "agent-session")
	defer f.Close()
	return net.FileConn(f)
}

// hideSelf lazily unmounts the read-only bind mount the agent was started
// from (argv[0]; gVisor shows it as a 9p mount of a host file). The
// running agent keeps its image; nothing re-executes it, and guest
// processes then see only the image's empty mount point there.
func hideSelf(log *slog.Logger) {
	if p := os.Args[0]; strings.HasPrefix(p, "/") {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			log.Warn("unmount the agent binary", "path", p, "err", err)
		}
	}
}

// containerCgroups mounts the sandbox's cgroup2 tree (runsc runs with
// --in-sandbox-cgroup=v2, whose pids controller is enforced and
// hierarchical) and sets up the exec subtree as in a VM. gVisor keeps
// memory.max but does not enforce it: the sandbox as a whole is bounded by
// runsc's host cgroup. Each task costs the sentry host memory, so the
// subtree's task limit comes from the memory size (ContainerMiBPerTask),
// not from pid_max: a fork bomb fails to fork before the host's OOM killer
// would end the whole sandbox. Without cgroups, execs run without limits.
func containerCgroups(log *slog.Logger) (*cgroup.Manager, uint32) {
	err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err != nil && !errors.Is(err, unix.EBUSY) {
		log.Error("cgroups: execs run without limits", "err", err)
		return nil, 0
	}
	mem := memTotal()
	cg, err := cgroup.Setup(cgroup.Options{Logger: log, Memory: cmp.Or(meminfo("MemAvailable"), mem), TaskLimit: containerTaskLimit(mem)})
	if err != nil {
		log.Error("cgroups: execs run without limits", "err", err)
		return nil, 0
	}
	// Half the subtree, so that one exec's fork bomb leaves room for others.
	pids := uint32(DefaultContainerPids)
	if sub := cg.SubtreePidsMax(); sub > 0 {
		pids = uint32(min(DefaultContainerPids, max(sub/2, 1)))
	}
	log.Info("cgroups", "mem_total", mem, "subtree_pids_max", cg.SubtreePidsMax(), "pids_default", pids)
	return cg, pids
}

// ContainerMiBPerTask is the sentry's host memory per task that a gVisor
// sandbox's task limit assumes: a forked process costs it about 1.7 MiB
// (measured with a bash fork bomb on systrap), so with one task per 3 MiB
// of the memory limit a fork bomb runs out of tasks well before the
// sandbox's host cgroup runs out of memory. An exec's default pids limit
// there is half of that, at most DefaultContainerPids (airlock.pids=
// defaults to it in a VM).
const (
	ContainerMiBPerTask  = 3
	DefaultContainerPids = 1024
)

// containerTaskLimit is the TaskLimit for a sandbox of mem bytes: its
// subtree's pids.max (cgroup.PidsMax) comes out at one task per
// ContainerMiBPerTask, the reserve on top.
func containerTaskLimit(mem uint64) uint64 {
	tasks := (mem >> 20) / ContainerMiBPerTask
	return tasks + max(64, tasks/9)
}

// containerSystem is guestSystem without the machine-wide steps a gVisor
// sandbox does not allow (and does not need).
type containerSystem struct{ guestSystem }

func (containerSystem) SetClock(time.Time) error { return nil }
func (containerSystem) AddEntropy([]byte) error  { return nil }
