package agent

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
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
// boot; the control channel is the unix socket on fd 0 (one end of a
// socketpair the host passed as stdin), served for one host session. The
// clock and the RNG are the host's: Sync does not set them.
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
	if err == nil {
		var conn net.Conn
		if conn, err = net.FileConn(os.Stdin); err == nil {
			log.Info("serving", "mode", "container", "version", version)
			err = agentapi.Serve(context.Background(), conn, srv.Handler())
			_ = conn.Close()
		}
	}
	log.Info("host session ended; idle until the sandbox is stopped", "err", err)
	for {
		time.Sleep(time.Hour) // PID 1 must not exit
	}
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
