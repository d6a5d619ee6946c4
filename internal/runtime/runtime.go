// Package runtime defines the isolation backends behind airlock sandboxes.
//
// A Runtime creates Instances (one guest each). The shim owns an Instance for
// the sandbox's whole life; nothing here is tied to a request's context.
// Optional abilities (snapshots for fast start) are separate interfaces found
// by type assertion, never stubs that return "unsupported".
package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Runtime is an isolation backend (qemu, later gvisor).
type Runtime interface {
	// Name is the backend's short name ("qemu", "fake").
	Name() string
	// Probe reports what this host can do. It may take a few seconds the
	// first time (the qemu runtime boots a probe guest to test KVM) and
	// caches its answer. Safe for concurrent use.
	Probe(ctx context.Context) (Capabilities, error)
	// Create prepares an instance for spec without starting it. The caller
	// owns the Instance and must call Stop or Kill, then Wait, to release
	// it. Create does not create the root disk; spec.RootDisk must exist.
	Create(ctx context.Context, spec Spec) (Instance, error)
}

// Capabilities describes a host as seen by one Runtime.
type Capabilities struct {
	// Accel is the acceleration in use: "kvm", "tcg" or "none".
	Accel string
	// AccelReason says why (e.g. why KVM was not used). One line.
	AccelReason string
	// VMMVersion is the hypervisor's version string, if any.
	VMMVersion string
	// Snapshots is true if instances implement Snapshotter (Snapshottable
	// ones) and StateSaver, and Specs with RestoreFrom are accepted.
	Snapshots bool
}

// Spec describes one guest. It is plain data; every path is host-side and
// chosen by airlock, never by a guest or an API caller.
type Spec struct {
	// ID names the instance in logs and process titles.
	ID string
	// CPUs is the number of vCPUs (>= 1).
	CPUs int
	// MemoryMiB is guest RAM in MiB (>= 64).
	MemoryMiB int
	// Kernel is the guest kernel (an uncompressed PVH vmlinux for qemu).
	// qemu opens it by path as an unprivileged uid: it must be
	// world-readable in traversable directories.
	Kernel string
	// Initrd is the initramfs holding the agent and modules (same
	// permissions as Kernel).
	Initrd string
	// KernelArgs are appended to the runtime's own kernel command line.
	// Each is one word: no spaces or control characters.
	KernelArgs []string
	// RootDisk is the sandbox's writable root disk (a qcow2 overlay). The
	// runtime opens it itself (root may own it, mode 0600); its backing
	// chain is opened by path by the VMM, read-only, so backing files must
	// be world-readable in traversable directories.
	RootDisk string
	// RootDiskFormat is "qcow2" (default) or "raw".
	RootDiskFormat string
	// RunDir is a private directory for this instance's runtime files
	// (qemu: console.log, qemu.log and agent.sock). It exists and is
	// owned by the caller; it may be 0700.
	RunDir string
	// RestoreFrom, if set, is a snapshot directory written by
	// Snapshotter.SaveSnapshot (a template) or StateSaver.SaveState (a
	// paused or live-snapshotted sandbox); the instance resumes from it
	// instead of booting. Every other field must equal the snapshotted
	// instance's, except ID, RunDir, RootDisk and Snapshottable. RootDisk
	// is a new qcow2 overlay on the disk frozen with the snapshot (so
	// RootDiskFormat is "qcow2" for a SaveState directory).
	RestoreFrom string
	// Snapshottable asks for an instance whose memory can be snapshotted
	// (for a template). Only meaningful if Capabilities.Snapshots. It may
	// be combined with a RestoreFrom written by StateSaver.SaveState (the
	// restored instance can then become a template, e.g. for fork), not
	// with one written by SaveSnapshot (qemu: ErrInvalid).
	Snapshottable bool
	// NoAgentHost: the host never connects to the agent channel. For an
	// instance restored from a SaveState directory only to be saved again
	// as a template: its guest agent waits for a host, as in every saved
	// state, and goes on waiting, so SaveSnapshot need not give it time to
	// see a host go. AgentConn fails. (qemu; other runtimes ignore it.)
	NoAgentHost bool
	// RootInPlace, for runtimes whose root is a directory (gvisor), writes
	// the sandbox's changes into RootDisk itself instead of a private
	// layer: template builds give a host overlay mount made for the one
	// sandbox (its upper layer is the build step's result), never a
	// shared image tree. WritableBytes does not apply; the caller caps
	// the directory's filesystem.
	RootInPlace bool
	// WritableBytes caps the writable layer of runtimes whose root is a
	// directory rather than a disk (gvisor); 0 keeps the runtime's default.
	WritableBytes int64
	// Network attaches a virtio-net NIC; its Ethernet frames are exchanged
	// with the host through Networker.NetConn. A snapshot records whether
	// it had one: restores from it must set Network the same way.
	Network bool
	// HostCgroup, if set, is the host cgroup (an absolute cgroup path,
	// e.g. /airlock/<id>) that the calling shim is in and under which a
	// runtime that makes cgroups of its own (gvisor's runsc) makes them,
	// instead of its configured parent; runtimes whose processes inherit
	// the shim's cgroup (qemu) ignore it.
	HostCgroup string
	// Mounts are filesystems the guest has for its whole life, at most
	// MaxMounts. A restore must have the same ones, in the same order.
	Mounts []Mount
	// ProcAudit asks a runtime that can see the guest's execs from
	// outside the guest (ProcWatcher) to report them; others ignore it.
	ProcAudit bool
}

// MaxMounts bounds Spec.Mounts: a microVM has 8 virtio device slots and
// airlock's own devices take 4.
const MaxMounts = 4

// Mount is a filesystem shared with the guest at Target.
type Mount struct {
	// Image is an ext4 image file (a volume): the runtime opens it
	// itself, as root. Exactly one of Image and Dir is set.
	Image string
	// Dir is a host directory (a host mount), opened without following
	// symlinks.
	Dir string
	// Target is the guest path: absolute and clean.
	Target   string
	ReadOnly bool
}

// MountSerial is the virtio-blk serial of the disk that carries
// Spec.Mounts[i] on runtimes whose guest mounts its volumes itself
// (GuestMounter).
func MountSerial(i int) string { return "airlock-vol" + strconv.Itoa(i) }

// MountStager is implemented by instances that present Spec.Mounts[i] to
// the guest at a fixed path, StagedMountPath(i), which the guest agent
// then moves to its target (gvisor).
type MountStager interface {
	StagedMountPath(i int) string
}

// MountTag is the virtio-fs tag of Spec.Mounts[i] when it is a host
// directory on a runtime whose guest mounts it itself (GuestMounter).
func MountTag(i int) string { return "airlock-fs" + strconv.Itoa(i) }

// GuestMounter is implemented by instances whose guest must mount
// Spec.Mounts itself (qemu: the images are virtio-blk disks, found by
// MountSerial) after a cold boot. Other runtimes mount them before the
// guest starts.
type GuestMounter interface {
	GuestMountsVolumes() bool
}

// Validate checks the fields every runtime relies on.
func (s Spec) Validate() error {
	switch {
	case s.ID == "":
		return errors.New("spec: empty ID")
	case s.CPUs < 1 || s.CPUs > 64:
		return errors.New("spec: cpus must be between 1 and 64")
	case s.MemoryMiB < 64 || s.MemoryMiB > 1<<20:
		return errors.New("spec: memory must be between 64 MiB and 1 TiB")
	case s.Kernel == "" || s.Initrd == "":
		return errors.New("spec: kernel and initrd are required")
	case s.RootDisk == "":
		return errors.New("spec: root disk is required")
	case s.RunDir == "":
		return errors.New("spec: run dir is required")
	case s.RootDiskFormat != "" && s.RootDiskFormat != "qcow2" && s.RootDiskFormat != "raw":
		return errors.New("spec: root disk format must be qcow2 or raw")
	case s.HostCgroup != "" && (!strings.HasPrefix(s.HostCgroup, "/") || strings.Contains(s.HostCgroup, "..")):
		return errors.New("spec: host cgroup must be an absolute cgroup path")
	case len(s.Mounts) > MaxMounts:
		return fmt.Errorf("spec: at most %d mounts", MaxMounts)
	}
	for _, m := range s.Mounts {
		switch {
		case (m.Image == "") == (m.Dir == ""):
			return errors.New("spec: a mount has exactly one of an image and a directory")
		case !path.IsAbs(m.Target) || path.Clean(m.Target) != m.Target || m.Target == "/":
			return fmt.Errorf("spec: mount target %q must be absolute, clean and not /", m.Target)
		case m.Image != "" && !filepath.IsAbs(m.Image), m.Dir != "" && !filepath.IsAbs(m.Dir):
			return errors.New("spec: mount sources must be absolute")
		}
	}
	return nil
}

// Instance is one guest. All methods are safe for concurrent use.
//
// Lifecycle: Create -> Start -> (running) -> exited. Stop or Kill before
// Start ends the instance without running anything: Wait then returns at
// once with Requested set, and Start fails with ErrNotRunning. A failed
// Start also ends the instance (Wait returns at once, Reason says why).
type Instance interface {
	// ID returns Spec.ID.
	ID() string
	// Start boots (or restores) the guest and returns once the VMM runs;
	// it does not wait for the agent. ctx bounds only the start itself:
	// the VMM's life is not tied to it. On error everything Start acquired
	// is released. Start may be called once.
	Start(ctx context.Context) error
	// AgentConn returns the host end of the agent channel. It may be called
	// once after Start (and once more after each live StateSaver.SaveState);
	// the caller owns and closes the conn. The guest may
	// not have connected yet: the first bytes arrive when it does. It fails
	// with ErrNotRunning before Start and after exit.
	AgentConn(ctx context.Context) (net.Conn, error)
	// Wait blocks until the VMM has exited and all its resources are
	// released, and returns how it ended. Safe to call from many goroutines
	// and after exit. The error is only ever ctx's.
	Wait(ctx context.Context) (ExitStatus, error)
	// Stop asks the guest to power off and kills it if it has not after
	// the context's deadline (a runtime default if it has none); it returns
	// once the VMM has exited. Idempotent; safe after exit.
	Stop(ctx context.Context) error
	// Kill ends the VMM at once, without waiting for it (use Wait).
	// Idempotent; safe after exit.
	Kill() error
}

// ExitStatus says how a VMM ended.
type ExitStatus struct {
	// Code is the VMM's exit code, or -1 if it was killed by a signal.
	Code int
	// Signal is the name of the signal that killed it, if any.
	Signal string
	// Reason is a one-line explanation for a user, e.g. the guest kernel's
	// panic message from the console log. Empty for a requested stop.
	Reason string
	// Requested is true if the exit followed Stop or Kill.
	Requested bool
}

// Snapshotter is implemented by instances that can save their memory and
// device state so that later instances start from it (templates, fast
// start). Instances created with Spec.Snapshottable implement it (others
// may too, and fail with errdefs.ErrFailedPrecondition).
type Snapshotter interface {
	// SaveSnapshot writes the running guest's state into dir (which must
	// exist and be empty), leaving the instance ended: Wait then reports
	// Requested. The caller has closed the agent connection first. The
	// root disk must be treated as frozen from then on: restored instances
	// use it as their backing file, so it must stay readable by the
	// runtime's VMM processes (qemu: world-readable, in traversable
	// directories). The files in dir are read-only afterwards; the
	// directory is opaque to callers except for being copied or removed
	// as a whole.
	SaveSnapshot(ctx context.Context, dir string) error
}

// StateSaver is implemented by running instances whose whole state (RAM and
// devices) can be written to a directory: pause (the instance ends) and live
// snapshots (it keeps running, e.g. for fork). It works for cold-booted and
// restored instances alike. Restore with Spec.RestoreFrom = dir.
type StateSaver interface {
	// SaveState writes the guest's full state (RAM and devices) into dir,
	// which must exist and be empty. The caller has closed the agent
	// connection first (the guest is given a moment to see the
	// disconnect). The files in dir end read-only; the directory is opaque
	// to callers except for being copied or removed as a whole.
	//
	// With o.KeepRunning false the instance ends afterwards (Wait reports
	// Requested): a pause. The root disk is frozen as it is and belongs to
	// the snapshot: restores use an overlay on it as their RootDisk (so it
	// must stay readable by the runtime's VMM processes, as for
	// SaveSnapshot). If SaveState fails before the guest was frozen the
	// instance keeps running; after that it ends either way.
	//
	// With o.KeepRunning true the guest continues after the save (a live
	// snapshot). o.NewRootDisk, a qcow2 overlay the caller created on the
	// current root disk (qemu-img create -f qcow2 -b <RootDisk> -F <fmt>),
	// becomes the instance's root disk at the instant the guest is frozen:
	// from then on the previous root disk file is never written again and
	// belongs to the snapshot. The guest gets a new agent channel:
	// AgentConn may be called again once SaveState returns. On error the
	// instance keeps running when it
	// can (possibly already on NewRootDisk); it is killed if it cannot be
	// resumed.
	//
	// Not safe to call concurrently with itself or SaveSnapshot.
	SaveState(ctx context.Context, dir string, o SaveOptions) error
}

// SaveOptions modify StateSaver.SaveState.
type SaveOptions struct {
	// KeepRunning keeps the guest running after the save (live snapshot)
	// instead of ending the instance (pause).
	KeepRunning bool
	// NewRootDisk is the qcow2 overlay the instance writes to after a
	// live snapshot; required with KeepRunning, ignored otherwise. The
	// runtime opens it itself (it may be root-owned, 0600).
	NewRootDisk string
}

// Networker is implemented by instances created with Spec.Network.
type Networker interface {
	// NetConn returns the host end of the NIC's link: a stream carrying
	// QEMU's "-netdev stream" framing (4-byte big-endian length, then an
	// Ethernet frame without FCS). Callable once after Start; the caller
	// owns and closes it. Fails with ErrNotRunning before Start and after
	// exit. The guest stalls on transmit if nobody reads the conn: a caller
	// that does not serve the link must still drain it.
	NetConn(ctx context.Context) (net.Conn, error)
}

// ErrNotRunning is returned by operations that need a running instance.
var ErrNotRunning = errors.New("instance is not running")

// DiskResizer is implemented by instances whose root disk can grow while
// the guest runs; the guest is told of the new size.
type DiskResizer interface {
	// ResizeRootDisk sets the root disk's size in bytes (never smaller).
	ResizeRootDisk(ctx context.Context, bytes int64) error
}

// HostOOMCounter is implemented by instances whose guest processes are
// backed by host processes in the instance's own host memory cgroup
// (gVisor: runsc's systrap stubs). The host kernel's OOM killer ends one
// of them, and with it the guest process it backs, without the guest
// kernel counting an OOM kill anywhere the guest can see; the shim reads
// this count instead.
type HostOOMCounter interface {
	// HostOOMKills returns how many OOM kills the host has counted in the
	// instance's cgroup so far.
	HostOOMKills() (uint64, error)
}

// String says in one line how the VMM ended: the Reason if there is one,
// else the signal or exit code.
func (s ExitStatus) String() string {
	switch {
	case s.Reason != "":
		return s.Reason
	case s.Signal != "":
		return "VMM killed by " + s.Signal
	default:
		return "VMM exited with code " + strconv.Itoa(s.Code)
	}
}

// ProcWatcher is implemented by instances whose runtime sees the programs
// the guest runs from outside the guest (gvisor: the Sentry's execve and
// exit trace points), when Spec.ProcAudit asked for it. The shim audits
// with it instead of the guest agent's process events.
type ProcWatcher interface {
	// ProcEvents returns the guest's execs and exits from the start of
	// the guest on. Callable once after Start; the caller closes the
	// stream. It fails when the runtime's monitoring did not start (the
	// error says why); the guest runs on regardless.
	ProcEvents(ctx context.Context) (ProcStream, error)
}

// ProcStream is a runtime's stream of process events. Not safe for
// concurrent use, except Close, which ends a Next in progress.
type ProcStream interface {
	// Next blocks until the next event. lost counts the events the
	// runtime failed to report since the previous call (it dropped them,
	// or they were malformed). The error is io.EOF once the instance has
	// exited, or another error after Close.
	Next() (e ProcEvent, lost uint64, err error)
	// Close ends the stream. Idempotent.
	Close() error
}

// ProcEvent is one exec or exit in the guest, as its runtime saw it. The
// strings are the guest's, unchecked: the caller bounds and escapes them.
type ProcEvent struct {
	// Exit is true for a process's exit, false for an exec. Exits are
	// reported only for processes whose exec was.
	Exit bool
	// Time is the event's time (zero if unknown).
	Time time.Time
	// PID and PPID are in the guest's initial pid namespace.
	PID, PPID uint32
	// UID and EUID are the real and effective uids of the process that
	// called execve (before a set-id program changed them).
	UID, EUID uint32
	// Path is the program the exec opened: for a script, the script (its
	// interpreter is in Argv); for an exit, repeated from the exec. Cwd
	// is the working directory at the exec.
	Path, Cwd string
	Argv      []string
	// Agent is true when the parent is the guest agent: it started the
	// process or adopted it as an orphan. A hint, not a proof.
	Agent bool
	// ExitCode, or Signal when a signal ended the process (then ExitCode
	// is 0).
	ExitCode, Signal int32
}
