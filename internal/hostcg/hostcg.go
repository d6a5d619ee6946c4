// Package hostcg puts each sandbox's host processes in a host cgroup (its
// envelope) with memory and pids limits derived from the sandbox's size,
// so that one sandbox cannot exhaust the host's memory or tasks or starve
// its neighbours of them (threats 88 and 101), even after a VMM escape.
//
// Layout, the same under cgroup v1 (one directory per controller) and v2:
//
//	/airlock/<sandbox-id>          the envelope: memory and pids (For)
//	/airlock/<sandbox-id>/shim     the shim, and the QEMU it starts
//	/airlock/<sandbox-id>/<cid>    gVisor: runsc's own cgroup for the sentry
//
// The shim enters its leaf before it starts the VMM, so the VMM is in the
// envelope from its first instruction. Processes live only in leaves (cgroup
// v2's rule; v1 would allow more).
//
// CPU is left out on purpose. A sandbox's CPU is already bounded by its
// size: QEMU runs one thread per vCPU (plus I/O threads), and runsc puts
// the sentry in a cgroup with a quota of its vCPUs. Two CPU groupings were
// built and measured here (`make bench`, neighbour rows): a CPU group per
// sandbox (quota of its vCPUs, shares per vCPU) made a mostly idle 1-vCPU
// sandbox's exec beside a neighbour burning its vCPUs 1.3x to 20x slower,
// and one CPU group shared by all sandboxes 1.45x to 1.86x slower, against
// 1.0x to 1.1x without either: a group's weight on a CPU follows its recent
// load, so work that wakes inside a group loses to a busy one. On v1 the
// envelope has cpuacct (accounting only) where cpuacct is not mounted with
// cpu; on v2 the envelope does not enable the cpu controller below the
// parent.
//
// containerd's cgroups library does the cgroupfs work; no library type
// crosses this package's API.
package hostcg

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DefaultParent is the cgroup under which each sandbox gets its envelope.
const DefaultParent = "/airlock"

// Limits is one envelope's limits.
type Limits struct {
	// MemoryBytes caps the envelope's memory (RSS and page cache it
	// touches; the VMM's guest RAM included).
	MemoryBytes int64
	// Pids caps the envelope's tasks (threads count).
	Pids int64
}

// Overheads added to a sandbox's size. Memory: a clone of a template maps
// the template's RAM (a sparse memfd shared by its clones) copy-on-write,
// so a guest page it touches for the first time is charged twice here,
// once as the page the kernel allocates in the shared memfd's hole and
// once as the clone's private copy; on top come the shim, the VMM's code,
// its TCG translation cache (32 MiB), device buffers and the user-space
// network stack. A 512 MiB clone whose guest touched 440 MiB was killed
// under RAM + 224 MiB.
const (
	memOverheadMiB = 256
	pidsBase       = 512
)

// For returns the envelope of a sandbox with memMiB of RAM: twice its RAM
// plus 256 MiB, and 512 tasks plus one per 2 MiB of RAM (a gVisor sentry
// on the systrap platform has a host task per guest address space).
func For(memMiB int) Limits {
	return Limits{
		MemoryBytes: (2*int64(memMiB) + memOverheadMiB) << 20,
		Pids:        pidsBase + int64(memMiB)/2,
	}
}

func (l Limits) resources() *specs.LinuxResources {
	mem := l.MemoryBytes
	pids := l.Pids
	return &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &mem},
		Pids:   &specs.LinuxPids{Limit: &pids},
	}
}

// controllers are the cgroup controllers an envelope uses.
var controllers = []string{"memory", "pids"}

// Check reports whether envelopes can be made on this host: nil, or an
// error naming what is missing (no cgroupfs, a controller that is not
// mounted or not writable).
func Check() error {
	switch cgroups.Mode() {
	case cgroups.Unavailable:
		return errors.New("no cgroup filesystem at /sys/fs/cgroup")
	case cgroups.Unified:
		b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return err
		}
		have := strings.Fields(string(b))
		var missing []string
		for _, c := range controllers {
			if !contains(have, c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("cgroup v2 root lacks the %s controller(s)", strings.Join(missing, ", "))
		}
		return writable("/sys/fs/cgroup")
	default:
		var errs []error
		for _, c := range controllers {
			if err := writable(path.Join("/sys/fs/cgroup", c)); err != nil {
				errs = append(errs, fmt.Errorf("cgroup v1 %s: %w", c, err))
			}
		}
		return errors.Join(errs...)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func writable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	f, err := os.OpenFile(path.Join(dir, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// Version is "v1" or "v2": the cgroup hierarchy envelopes are made in.
func Version() string {
	if cgroups.Mode() == cgroups.Unified {
		return "v2"
	}
	return "v1"
}

// Envelope is one sandbox's host cgroup, entered by the calling process.
type Envelope struct {
	path string // e.g. /airlock/<id>
	v1   cgroup1.Cgroup
	v2   *cgroup2.Manager
}

// Path is the envelope's cgroup path, the parent under which a runtime
// may put its own cgroups (gVisor's runsc).
func (e *Envelope) Path() string { return e.path }

// validName refuses anything but one plain path element.
func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00\n") || len(name) > 128 {
		return fmt.Errorf("hostcg: bad cgroup name %q", name)
	}
	return nil
}

// Enter creates (or reuses) the envelope parent/name with lim and moves the
// calling process (all its threads) into its "shim" leaf: everything it
// starts afterwards is inside. parent is an absolute cgroup path.
func Enter(parent, name string, lim Limits) (*Envelope, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if !path.IsAbs(parent) {
		return nil, fmt.Errorf("hostcg: parent %q must be absolute", parent)
	}
	if err := Check(); err != nil {
		return nil, err
	}
	e := &Envelope{path: path.Join(parent, name)}
	self := uint64(os.Getpid())
	if cgroups.Mode() == cgroups.Unified {
		// memory and pids below the parent; no cpu controller below it.
		m, err := cgroup2.NewManager("/sys/fs/cgroup", e.path, cgroup2.ToResources(lim.resources()))
		if err != nil {
			return nil, fmt.Errorf("hostcg: create %s: %w", e.path, err)
		}
		if err := m.ToggleControllers([]string{"memory", "pids"}, cgroup2.Enable); err != nil {
			_ = m.Delete()
			return nil, fmt.Errorf("hostcg: enable controllers in %s: %w", e.path, err)
		}
		leaf, err := m.NewChild("shim", &cgroup2.Resources{})
		if err == nil {
			err = leaf.AddProc(self)
		}
		if err != nil {
			_ = m.Delete()
			return nil, fmt.Errorf("hostcg: enter %s/shim: %w", e.path, err)
		}
		e.v2 = m
		return e, nil
	}
	c, err := cgroup1.New(cgroup1.StaticPath(e.path), lim.resources(), cgroup1.WithHierarchy(v1Envelope))
	if err != nil {
		return nil, fmt.Errorf("hostcg: create %s: %w", e.path, err)
	}
	leaf, err := c.New("shim", &specs.LinuxResources{})
	if err == nil {
		err = leaf.AddProc(self)
	}
	if err != nil {
		_ = c.Delete()
		return nil, fmt.Errorf("hostcg: enter %s/shim: %w", e.path, err)
	}
	e.v1 = c
	return e, nil
}

// cpuacctApart reports whether v1's cpuacct is its own hierarchy (then an
// envelope has its own CPU accounting) rather than mounted with cpu.
func cpuacctApart() bool {
	a, err1 := os.Stat("/sys/fs/cgroup/cpu")
	b, err2 := os.Stat("/sys/fs/cgroup/cpuacct")
	return err1 == nil && err2 == nil && !os.SameFile(a, b)
}

// v1Subsystems is the default v1 hierarchy cut down to the subsystems keep
// selects.
func v1Subsystems(keep func(cgroup1.Name) bool) ([]cgroup1.Subsystem, error) {
	all, err := cgroup1.Default()
	if err != nil {
		return nil, err
	}
	var out []cgroup1.Subsystem
	for _, s := range all {
		if keep(s.Name()) {
			out = append(out, s)
		}
	}
	return out, nil
}

// v1Envelope: memory, pids, and cpuacct where it is apart from cpu.
func v1Envelope() ([]cgroup1.Subsystem, error) {
	apart := cpuacctApart()
	return v1Subsystems(func(n cgroup1.Name) bool {
		return n == cgroup1.Memory || n == cgroup1.Pids || (n == cgroup1.Cpuacct && apart)
	})
}

// v1All: every subsystem an airlock cgroup uses, for leaving them.
func v1All() ([]cgroup1.Subsystem, error) {
	return v1Subsystems(func(n cgroup1.Name) bool {
		return n == cgroup1.Cpu || n == cgroup1.Cpuacct || n == cgroup1.Memory || n == cgroup1.Pids
	})
}

// Stats are an envelope's usage figures.
type Stats struct {
	CPUNanos        uint64 // CPU time used since the envelope was made (0 where v1 mounts cpuacct with cpu)
	MemoryBytes     uint64 // memory charged now
	MemoryPeakBytes uint64 // the most ever charged (0 on v2 before 5.19)
	MemoryMaxBytes  uint64 // the memory limit now
	Pids            uint64 // tasks now
	OOMKills        uint64 // the kernel's OOM kills inside
}

// Stats reads the envelope's usage.
func (e *Envelope) Stats() (Stats, error) {
	if e.v2 != nil {
		m, err := e.v2.Stat()
		if err != nil {
			return Stats{}, err
		}
		s := Stats{CPUNanos: m.GetCPU().GetUsageUsec() * 1000, MemoryBytes: m.GetMemory().GetUsage(), MemoryPeakBytes: m.GetMemory().GetMaxUsage(), MemoryMaxBytes: m.GetMemory().GetUsageLimit(), Pids: m.GetPids().GetCurrent()}
		s.OOMKills = m.GetMemoryEvents().GetOomKill()
		return s, nil
	}
	m, err := e.v1.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return Stats{}, err
	}
	st := Stats{
		CPUNanos:        m.GetCPU().GetUsage().GetTotal(),
		MemoryBytes:     m.GetMemory().GetUsage().GetUsage(),
		MemoryPeakBytes: m.GetMemory().GetUsage().GetMax(),
		MemoryMaxBytes:  m.GetMemory().GetUsage().GetLimit(),
		Pids:            m.GetPids().GetCurrent(),
	}
	st.OOMKills = v1OOMKills(path.Join("/sys/fs/cgroup/memory", e.path))
	return st, nil
}

// OOMKills returns how many processes the host kernel's OOM killer has
// ended in the cgroup cg (an absolute cgroup path, such as gVisor's
// /airlock/<id>/<cid>) and the cgroups below it.
func OOMKills(cg string) (uint64, error) {
	if !strings.HasPrefix(cg, "/") || strings.Contains(cg, "..") {
		return 0, fmt.Errorf("cgroup path %q is not absolute and clean", cg)
	}
	if Version() == "v2" {
		b, err := os.ReadFile(path.Join("/sys/fs/cgroup", cg, "memory.events"))
		if err != nil {
			return 0, err
		}
		return oomKillLine(string(b)), nil
	}
	dir := path.Join("/sys/fs/cgroup/memory", cg)
	if _, err := os.Stat(dir); err != nil {
		return 0, err
	}
	return v1OOMKills(dir), nil
}

// oomKillLine reads the "oom_kill N" line of memory.events (v2) or
// memory.oom_control (v1).
func oomKillLine(s string) uint64 {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			k, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return k
		}
	}
	return 0
}

// v1OOMKills sums the oom_kill counts of dir and the cgroups below it: the
// library does not read them (Linux 4.13+), and v1 counts a kill in the
// victim's own cgroup only.
func v1OOMKills(dir string) uint64 {
	var n uint64
	if b, err := os.ReadFile(path.Join(dir, "memory.oom_control")); err == nil {
		n += oomKillLine(string(b))
	}
	ents, _ := os.ReadDir(dir)
	for _, ent := range ents {
		if ent.IsDir() {
			n += v1OOMKills(path.Join(dir, ent.Name()))
		}
	}
	return n
}

// Open returns the existing envelope parent/name, to read its Stats; it
// does not move the calling process.
func Open(parent, name string) (*Envelope, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	e := &Envelope{path: path.Join(parent, name)}
	var err error
	if cgroups.Mode() == cgroups.Unified {
		e.v2, err = cgroup2.Load(e.path)
	} else {
		e.v1, err = cgroup1.Load(cgroup1.StaticPath(e.path), cgroup1.WithHierarchy(v1Envelope))
	}
	if err != nil {
		return nil, fmt.Errorf("hostcg: open %s: %w", e.path, err)
	}
	return e, nil
}

// Leave moves the calling process back to the root cgroup and removes the
// envelope. It fails (and leaves the envelope) while another process is
// still inside, e.g. a VMM that has not exited; Remove cleans up later.
func (e *Envelope) Leave() error {
	if err := toRoot(); err != nil {
		return fmt.Errorf("hostcg: leave %s: %w", e.path, err)
	}
	return removeTree(e.path)
}

// toRoot moves the calling process to the root cgroup of the envelope
// controllers.
func toRoot() error {
	self := uint64(os.Getpid())
	if cgroups.Mode() == cgroups.Unified {
		root, err := cgroup2.Load("/")
		if err != nil {
			return err
		}
		return root.AddProc(self)
	}
	root, err := cgroup1.Load(cgroup1.RootPath, cgroup1.WithHierarchy(v1All))
	if err != nil {
		return err
	}
	return root.AddProc(self)
}

// Escape moves the calling process out of the envelope under parent it
// inherited, if any, to the root cgroup: for a long-lived helper that a
// shim starts but that outlives its sandbox (a template holder). It does
// nothing for a process in no envelope.
func Escape(parent string) error {
	cgs, err := Of("self")
	if err != nil {
		return err
	}
	for _, p := range cgs {
		if strings.HasPrefix(p, parent+"/") {
			return toRoot()
		}
	}
	return nil
}

// Of returns the cgroup path of process pid ("self" for the caller) per
// controller, from /proc/<pid>/cgroup; cgroup v2's entry is under "".
func Of(pid string) (map[string]string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-id:controllers:path
		if f := strings.SplitN(line, ":", 3); len(f) == 3 {
			for _, c := range strings.Split(f[1], ",") {
				out[c] = f[2]
			}
		}
	}
	return out, nil
}

// Remove deletes the envelope parent/name and every cgroup below it, in
// every hierarchy, if no process is left in it. It is idempotent: a
// missing envelope is not an error.
func Remove(parent, name string) error {
	if err := validName(name); err != nil {
		return err
	}
	// rmdir fails with EBUSY until the last task has left: the VMM or
	// sentry of a sandbox just removed may still be exiting.
	var err error
	for deadline := time.Now().Add(removeWait); ; time.Sleep(20 * time.Millisecond) {
		err = removeTree(path.Join(parent, name))
		if err == nil || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
	}
}

// removeWait bounds how long Remove waits for tasks to leave.
const removeWait = 3 * time.Second

// removeTree removes the cgroup directories of p, deepest first, in the v2
// tree and in each v1 hierarchy. rmdir of a cgroup fails with EBUSY while
// a task is inside; the cgroup's files are not removable, and need not be.
func removeTree(p string) error {
	var roots []string
	if cgroups.Mode() == cgroups.Unified {
		roots = []string{"/sys/fs/cgroup"}
	} else {
		// Every hierarchy: the shim's envelope is in memory and pids
		// (cpu too in older builds), and runsc makes the sandbox's own
		// cgroups under it in every controller it finds (blkio, cpuset,
		// devices, freezer, ...).
		ents, _ := os.ReadDir("/sys/fs/cgroup")
		for _, e := range ents {
			if e.IsDir() {
				roots = append(roots, path.Join("/sys/fs/cgroup", e.Name()))
			}
		}
	}
	var errs []error
	for _, r := range roots {
		if err := rmdirAll(path.Join(r, p)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func rmdirAll(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, ent := range ents {
		if ent.IsDir() {
			if err := rmdirAll(path.Join(dir, ent.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("hostcg: remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}
