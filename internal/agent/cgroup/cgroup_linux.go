package cgroup

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// Controllers enabled for the airlock subtree.
var controllers = []string{"pids", "memory", "cpu"}

// Options configures Setup.
type Options struct {
	// Logger gets best-effort failures. Nil discards.
	Logger *slog.Logger
	// Root is the cgroup2 mount point (default /sys/fs/cgroup).
	Root string
	// Name is the subtree for user work (default "airlock").
	Name string
	// Memory is what the guest's processes can have, in bytes: MemAvailable
	// of /proc/meminfo right after boot. memory.max is that minus a reserve
	// (MemoryMax). Zero leaves memory.max alone.
	Memory uint64
	// TaskLimit is how many tasks the kernel can hold: min(pid_max,
	// threads-max). Zero leaves the subtree's pids.max alone.
	TaskLimit uint64
	// SweepInterval is how often released exec cgroups that still held
	// processes are swept while some remain: the backstop where the kernel
	// does not report them empty (default 5s).
	SweepInterval time.Duration
}

// MemoryMax returns memory.max for the airlock subtree: the available memory
// minus max(32 MiB, 10%), which stays for the agent, the kernel and the page
// cache, so the OOM killer acts inside the subtree before the guest runs out.
func MemoryMax(avail uint64) uint64 {
	reserve := max(uint64(32<<20), avail/10)
	if avail <= reserve {
		return avail / 2
	}
	return avail - reserve
}

// PidsMax returns pids.max for the airlock subtree: the task limit minus
// max(64, 10%), which stays available to the agent and the kernel.
func PidsMax(taskLimit uint64) uint64 {
	reserve := max(uint64(64), taskLimit/10)
	if taskLimit <= reserve {
		return taskLimit / 2
	}
	return taskLimit - reserve
}

// Manager owns the airlock subtree. Safe for concurrent use.
type Manager struct {
	log     *slog.Logger
	dir     string // <root>/<name>
	pidsMax uint64 // of the subtree; 0 if unknown

	stop chan struct{}
	wg   sync.WaitGroup
	// w watches the cgroup.events of released exec cgroups that still
	// held processes; nil when inotify is unavailable (then only the
	// backstop sweep removes them). An idle guest costs no wakeups.
	w       *fsnotify.Watcher
	watched chan struct{} // a watch was added: arm the backstop sweep
	every   time.Duration

	mu   sync.Mutex
	seq  uint64
	live map[string]bool // exec cgroups handed out and not yet released
}

// Setup enables the controllers, creates the airlock subtree with its
// limits, and starts the periodic sweep of empty exec cgroups. It fails if
// the subtree cannot be created; limits that cannot be set are logged.
func Setup(opts Options) (*Manager, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Root == "" {
		opts.Root = "/sys/fs/cgroup"
	}
	if opts.Name == "" {
		opts.Name = "airlock"
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = 5 * time.Second
	}
	enableControllers(log, opts.Root)
	dir := filepath.Join(opts.Root, opts.Name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	m := &Manager{log: log, dir: dir, stop: make(chan struct{}), live: make(map[string]bool),
		watched: make(chan struct{}, 1), every: opts.SweepInterval}
	if opts.Memory > 0 {
		if err := writeFile(dir, "memory.max", strconv.FormatUint(MemoryMax(opts.Memory), 10)); err != nil {
			log.Warn("cgroup memory.max", "err", err)
		}
		// Swapless guests: keep the subtree off swap anyway if one appears.
		_ = writeFile(dir, "memory.swap.max", "0")
	}
	if opts.TaskLimit > 0 {
		m.pidsMax = PidsMax(opts.TaskLimit)
		if err := writeFile(dir, "pids.max", strconv.FormatUint(m.pidsMax, 10)); err != nil {
			log.Warn("cgroup pids.max", "err", err)
			m.pidsMax = 0
		}
	}
	enableControllers(log, dir)
	m.Sweep() // what an earlier agent left (none in a fresh guest)
	if w, err := fsnotify.NewWatcher(); err == nil {
		m.w = w
	} else {
		log.Warn("cgroup: no inotify; empty exec cgroups are only swept", "err", err)
	}
	m.wg.Go(m.watchLoop)
	return m, nil
}

func enableControllers(log *slog.Logger, dir string) {
	all := "+" + strings.Join(controllers, " +")
	if writeFile(dir, "cgroup.subtree_control", all) == nil {
		return
	}
	// One missing controller fails the whole write; enable what exists.
	for _, c := range controllers {
		if err := writeFile(dir, "cgroup.subtree_control", "+"+c); err != nil {
			log.Warn("cgroup controller", "controller", c, "dir", dir, "err", err)
		}
	}
}

// SubtreePidsMax is the subtree's pids.max, or 0 if it was not set.
func (m *Manager) SubtreePidsMax() uint64 { return m.pidsMax }

// Close stops the sweep. It does not remove any cgroup. Idempotent.
func (m *Manager) Close() {
	m.mu.Lock()
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.mu.Unlock()
	m.wg.Wait()
	if m.w != nil {
		_ = m.w.Close()
	}
}

// Exec is one exec's cgroup. Its methods are safe for concurrent use.
type Exec struct {
	m    *Manager
	name string
	dir  string

	mu sync.Mutex
	fd int // -1 once released
}

// NewExec creates a new exec cgroup with pids.max = pidsMax (0: no own
// limit). The caller must call Release when the exec is over.
func (m *Manager) NewExec(pidsMax uint32) (*Exec, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for range 1000 {
		m.seq++
		name := "exec-" + strconv.FormatUint(m.seq, 10)
		dir := filepath.Join(m.dir, name)
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("create exec cgroup: %w", err)
		}
		if pidsMax > 0 {
			if err := writeFile(dir, "pids.max", strconv.FormatUint(uint64(pidsMax), 10)); err != nil {
				_ = unix.Rmdir(dir)
				return nil, fmt.Errorf("set pids.max: %w", err)
			}
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			_ = unix.Rmdir(dir)
			return nil, fmt.Errorf("open exec cgroup: %w", err)
		}
		m.live[name] = true
		return &Exec{m: m, name: name, dir: dir, fd: fd}, nil
	}
	return nil, errors.New("create exec cgroup: no free name")
}

// FD is the cgroup directory's fd, for SysProcAttr.CgroupFD. Valid until
// Release.
func (e *Exec) FD() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fd
}

// Kill kills every process in the cgroup (cgroup.kill). It does not wait.
func (e *Exec) Kill() error {
	err := writeFile(e.dir, "cgroup.kill", "1")
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Kernels before 5.14 have no cgroup.kill: kill what is listed, a few
	// rounds to catch processes forked meanwhile.
	for range 10 {
		b, err := os.ReadFile(filepath.Join(e.dir, "cgroup.procs"))
		if err != nil {
			return err
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	return nil
}

// OOMKills returns how many processes of the cgroup (and its descendants)
// an OOM killer killed: oom_kill of memory.events. 0 if unreadable.
func (e *Exec) OOMKills() uint64 {
	b, err := os.ReadFile(filepath.Join(e.dir, "memory.events"))
	if err != nil {
		return 0
	}
	return parseOOMKills(string(b))
}

// parseOOMKills reads the oom_kill counter of a memory.events file.
func parseOOMKills(s string) uint64 {
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return 0
}

// Release closes the cgroup's fd and removes the cgroup if it is empty. A
// cgroup that still holds processes (background children of the exec) is
// removed once they are gone: the kernel reports that as a change of its
// cgroup.events. Idempotent.
func (e *Exec) Release() {
	e.mu.Lock()
	if e.fd >= 0 {
		_ = unix.Close(e.fd)
		e.fd = -1
	}
	e.mu.Unlock()
	e.m.mu.Lock()
	delete(e.m.live, e.name)
	e.m.mu.Unlock()
	if err := unix.Rmdir(e.dir); !errors.Is(err, unix.EBUSY) {
		return // removed, or gone
	}
	if e.m.w != nil {
		if err := e.m.w.Add(filepath.Join(e.dir, "cgroup.events")); err != nil {
			e.m.log.Warn("cgroup: watch", "cgroup", e.name, "err", err)
		} else if unix.Rmdir(e.dir) == nil {
			return // it emptied between the Rmdir and the watch
		}
	}
	select {
	case e.m.watched <- struct{}{}:
	default:
	}
}

// watchLoop removes a watched exec cgroup when its cgroup.events changes
// and it is empty; the kernel drops the watch with the directory. While
// released cgroups remain, a sweep every m.every is the backstop for a
// kernel whose cgroupfs does not report (gVisor's) or an agent without
// inotify; with none left it sleeps.
func (m *Manager) watchLoop() {
	backstop := time.NewTimer(m.every)
	backstop.Stop()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if m.w != nil {
		events, errs = m.w.Events, m.w.Errors
	}
	for {
		select {
		case <-m.stop:
			backstop.Stop()
			return
		case <-m.watched:
			backstop.Reset(m.every)
		case <-backstop.C:
			if m.Sweep() > 0 {
				backstop.Reset(m.every)
			}
		case ev, ok := <-events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Write) {
				_ = unix.Rmdir(filepath.Dir(ev.Name)) // EBUSY: still populated
			}
		case err, ok := <-errs:
			if !ok {
				return
			}
			m.log.Warn("cgroup: watch", "err", err)
		}
	}
}

// Sweep removes every released exec cgroup that has become empty, and
// returns how many released ones are left (still populated).
func (m *Manager) Sweep() (left int) {
	ents, err := os.ReadDir(m.dir)
	if err != nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock() // held so NewExec cannot hand out a name being removed
	for _, ent := range ents {
		if !ent.IsDir() || !strings.HasPrefix(ent.Name(), "exec-") || m.live[ent.Name()] {
			continue
		}
		if unix.Rmdir(filepath.Join(m.dir, ent.Name())) != nil { // EBUSY if populated
			left++
		}
	}
	return left
}

func writeFile(dir, name, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
