package api

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Sandboxes is the lifecycle part of the manager the API needs. Every
// method acts for a caller: the manager decides what it may see (another
// tenant's sandbox is ErrNotFound, like a missing one), checks its quotas
// and writes the audit trail. Errors are categorized with errdefs.
type Sandboxes interface {
	// Create boots a sandbox of c's tenant and returns its row once the
	// guest answers (*sandbox.QuotaError over quota).
	Create(ctx context.Context, c sandbox.Caller, o sandbox.CreateOptions) (store.Sandbox, error)
	// Get returns one sandbox c may see (ErrNotFound if none).
	Get(ctx context.Context, c sandbox.Caller, id string) (store.Sandbox, error)
	// List returns the sandboxes c may see.
	List(ctx context.Context, c sandbox.Caller) ([]store.Sandbox, error)
	// Remove stops and deletes a sandbox.
	Remove(ctx context.Context, c sandbox.Caller, id string) error
	// SetTimeout moves the sandbox's expiry to now + d.
	SetTimeout(ctx context.Context, c sandbox.Caller, id string, d time.Duration) error
	// Pause saves a running sandbox to disk and ends its VMM (a paused
	// sandbox is a no-op). Without force it is refused
	// (ErrFailedPrecondition) while commands or code are running.
	Pause(ctx context.Context, c sandbox.Caller, id string, force bool) (sandbox.PauseResult, error)
	// Resume restores a paused sandbox (a running one is a no-op) and
	// returns its row once the guest answers.
	Resume(ctx context.Context, c sandbox.Caller, id string) (store.Sandbox, error)
	// Touch counts as activity for the idle-pause timer (and resumes a
	// paused sandbox).
	Touch(ctx context.Context, c sandbox.Caller, id string) error
	// Usage asks a running sandbox's guest for its resource use.
	Usage(ctx context.Context, c sandbox.Caller, id string) (guest.Usage, error)
	// SetNetwork replaces a running or paused sandbox's egress policy,
	// whole (sandbox.Manager.SetNetwork: validated like a create, the
	// platform floor refused to tenants with a *sandbox.FloorError).
	SetNetwork(ctx context.Context, c sandbox.Caller, id string, p sandbox.EgressPolicy) (sandbox.NetworkChange, error)
}

// Snapshots is the snapshot and fork part of the manager (sandbox.Manager's
// methods of the same names), acting for a caller like Sandboxes. Errors
// are categorized with errdefs.
type Snapshots interface {
	// Snapshot saves a running or paused sandbox (memory, processes, disk)
	// as the named snapshot of the sandbox's tenant; the sandbox keeps
	// running. ErrConflict if the tenant has that name; ErrFailedPrecondition
	// for a sandbox with secrets or, without force, running commands.
	Snapshot(ctx context.Context, c sandbox.Caller, id, name string, force bool) (store.Snapshot, error)
	// CreateFromSnapshot starts a sandbox from c's tenant's snapshot name;
	// o may set Timeout, Metadata and IdlePause only.
	CreateFromSnapshot(ctx context.Context, c sandbox.Caller, name string, o sandbox.CreateOptions) (store.Sandbox, error)
	// Fork makes count (1..sandbox.MaxForks) running copies of a sandbox,
	// all or none.
	Fork(ctx context.Context, c sandbox.Caller, id string, o sandbox.ForkOptions) ([]store.Sandbox, error)
	// RemoveSnapshot deletes a snapshot of c's tenant (of tenant for an
	// admin who names one); ErrFailedPrecondition while sandboxes or
	// snapshots are backed by its disk.
	RemoveSnapshot(ctx context.Context, c sandbox.Caller, tenant, name string) error
	// PruneSnapshots removes unused fork bases and orphaned snapshot files
	// of every tenant and returns the bytes freed; sandbox.ErrNeedsAdmin
	// unless c is an admin.
	PruneSnapshots(ctx context.Context, c sandbox.Caller) (int64, error)
	// ListSnapshots returns c's tenant's snapshots (tenant's for an admin
	// who names one; every tenant's, fork bases included, if all and c is
	// an admin).
	ListSnapshots(ctx context.Context, c sandbox.Caller, tenant string, all bool) ([]store.Snapshot, error)
	// GetSnapshot returns c's tenant's snapshot name (ErrNotFound if none).
	GetSnapshot(ctx context.Context, c sandbox.Caller, tenant, name string) (store.Snapshot, error)
	// DiskUsage is the bytes a sandbox's files take on the host (0 if none).
	DiskUsage(id string) int64
}

// Volumes is the volume part of the manager (sandbox.Manager's methods of
// the same names), acting for a caller like Snapshots: another tenant's
// volume is ErrNotFound like a missing one; tenant is honoured for admins
// only. Errors are categorized with errdefs.
type Volumes interface {
	// CreateVolume makes an empty volume of sizeMiB for c's tenant
	// (ErrConflict if the name is taken, *sandbox.QuotaError over quota).
	CreateVolume(ctx context.Context, c sandbox.Caller, name string, sizeMiB int) (store.Volume, error)
	// ListVolumes returns c's tenant's volumes (tenant's for an admin who
	// names one; every tenant's with all, admins only).
	ListVolumes(ctx context.Context, c sandbox.Caller, tenant string, all bool) ([]sandbox.VolumeInfo, error)
	// GetVolume returns one volume with its attachments.
	GetVolume(ctx context.Context, c sandbox.Caller, tenant, name string) (sandbox.VolumeInfo, error)
	// ResizeVolume grows a volume no sandbox has mounted (ErrConflict
	// while one has; ErrInvalid to shrink).
	ResizeVolume(ctx context.Context, c sandbox.Caller, tenant, name string, sizeMiB int) (store.Volume, error)
	// RemoveVolume deletes a volume and its data (ErrConflict while a
	// sandbox has it mounted).
	RemoveVolume(ctx context.Context, c sandbox.Caller, tenant, name string) error
}

// Files is the file part of the manager. Paths are validated by the API
// before they get here. Nothing is buffered whole: data streams.
type Files interface {
	// WriteFile streams r into p (mode, parents made) and returns its size.
	WriteFile(ctx context.Context, c sandbox.Caller, id, p string, mode uint32, r io.Reader) (int64, error)
	// ReadFile streams p to w (capped at the sandbox's disk size); info is
	// called before the first byte.
	ReadFile(ctx context.Context, c sandbox.Caller, id, p string, w io.Writer, info func(guest.FileInfo)) (int64, error)
	StatFile(ctx context.Context, c sandbox.Caller, id, p string) (guest.FileInfo, error)
	ListFiles(ctx context.Context, c sandbox.Caller, id, p string, depth uint32) (guest.FileList, error)
	Mkdir(ctx context.Context, c sandbox.Caller, id, p string, parents bool) error
	RemoveFile(ctx context.Context, c sandbox.Caller, id, p string, recursive bool) error
	// Rename renames within one guest filesystem.
	Rename(ctx context.Context, c sandbox.Caller, id, from, to string) error
	// WriteArchive extracts the tar stream r into directory p (made if
	// missing); the guest refuses entries that would leave p.
	WriteArchive(ctx context.Context, c sandbox.Caller, id, p string, r io.Reader) (guest.ArchiveResult, error)
	// ReadArchive streams a tar of p (named base(p)/...) to w, capped at
	// sandbox.ArchiveLimit of the sandbox's disk.
	ReadArchive(ctx context.Context, c sandbox.Caller, id, p string, w io.Writer) (int64, error)
	// WatchDir calls started once the watch is in place, then fn per
	// change, until ctx ends (nil), fn fails or the guest ends it.
	WatchDir(ctx context.Context, c sandbox.Caller, id, p string, recursive bool, started func(), fn func(guest.FileEvent) error) error
}

// ExecInfo describes one exec session.
type ExecInfo = guest.ExecInfo

// Execs is the exec part of the manager (sandbox.Manager's methods of the
// same names; see there for the contracts). Execs are owned by the
// sandbox's shim, so they outlive the HTTP request that started them. The
// manager decides what the caller may see: a sandbox it may not use is
// ErrNotFound, an unknown exec guest.ErrNoExec.
type Execs interface {
	// Exec starts spec and returns its stream once it runs; killOnDetach
	// kills it when its last attached stream goes away.
	Exec(ctx context.Context, c sandbox.Caller, sandboxID string, spec guest.ExecSpec, killOnDetach bool) (guest.ExecStream, error)
	// AttachExec streams an exec's output (from the start of what the shim
	// retained if fromStart) until its exit.
	AttachExec(ctx context.Context, c sandbox.Caller, sandboxID, execID string, fromStart bool) (guest.ExecStream, error)
	// ExecControl opens a stream for an exec's stdin and signals only.
	ExecControl(ctx context.Context, c sandbox.Caller, sandboxID, execID string) (guest.ExecStream, error)
	ListExecs(ctx context.Context, c sandbox.Caller, sandboxID string) ([]ExecInfo, error)
	GetExec(ctx context.Context, c sandbox.Caller, sandboxID, execID string) (ExecInfo, error)
}

// Contexts is the code-context part of the manager (sandbox.Manager's
// methods of the same names; see there for the contracts).
type Contexts interface {
	CreateContext(ctx context.Context, c sandbox.Caller, sandboxID string, spec guest.ContextSpec) (guest.ContextInfo, error)
	ListContexts(ctx context.Context, c sandbox.Caller, sandboxID string) ([]guest.ContextInfo, error)
	DeleteContext(ctx context.Context, c sandbox.Caller, sandboxID, contextID string) error
	RestartContext(ctx context.Context, c sandbox.Caller, sandboxID, contextID string) (guest.ContextInfo, error)
	InterruptContext(ctx context.Context, c sandbox.Caller, sandboxID, contextID string) error
	// RunCode calls fn for every event, the last being the end, and returns
	// nil after it.
	RunCode(ctx context.Context, c sandbox.Caller, sandboxID string, req guest.CodeRequest, fn func(guest.CodeEvent) error) error
}

// Ports reaches TCP ports inside sandboxes (the preview route).
type Ports interface {
	// DialPort opens a TCP stream to port of sandbox id's guest, through the
	// sandbox's shim. The caller closes the returned conn. Errors are
	// categorized: ErrInvalid for port 0, ErrNotFound or
	// ErrFailedPrecondition when the sandbox is missing or not running,
	// ErrUnavailable when its network cannot be reached or nothing listens.
	// ErrNotFound also when c may not see the sandbox. Safe for concurrent
	// use.
	DialPort(ctx context.Context, c sandbox.Caller, id string, port uint16) (net.Conn, error)
}

// Browsers reaches the browsers of sandboxes made from the browser image
// (sandbox.Manager: the launcher runs through an exec of the caller, the
// streams go through DialPort).
type Browsers interface {
	// StartBrowser starts the sandbox's browser where it is not running
	// (sandbox.ErrNoBrowser if its image has none).
	StartBrowser(ctx context.Context, c sandbox.Caller, id string, v sandbox.BrowserView) (sandbox.BrowserStatus, error)
	// BrowserStatus reports on it, starting nothing.
	BrowserStatus(ctx context.Context, c sandbox.Caller, id string) (sandbox.BrowserStatus, error)
	// DialBrowser reaches its DevTools port, starting it if needed.
	DialBrowser(ctx context.Context, c sandbox.Caller, id string) (net.Conn, error)
	// DialBrowserView reaches its live view (websockify), starting it if
	// needed.
	DialBrowserView(ctx context.Context, c sandbox.Caller, id string, interactive bool) (net.Conn, error)
}

// Events is the audit trail.
type Events interface {
	AppendEvent(ctx context.Context, e store.Event) (int64, error)
	ListEvents(ctx context.Context, f store.EventFilter) ([]store.Event, error)
}

// Keys authenticates API keys.
type Keys interface {
	// LookupKey returns the record of a full key, or an error wrapping
	// store.ErrBadKey.
	LookupKey(ctx context.Context, key string) (store.APIKey, error)
}

var (
	_ Sandboxes = (*sandbox.Manager)(nil)
	_ Files     = (*sandbox.Manager)(nil)
	_ Execs     = (*sandbox.Manager)(nil)
	_ Contexts  = (*sandbox.Manager)(nil)
	_ Ports     = (*sandbox.Manager)(nil)
	_ Browsers  = (*sandbox.Manager)(nil)
	_ Snapshots = (*sandbox.Manager)(nil)
	_ Volumes   = (*sandbox.Manager)(nil)
	_ Events    = (*store.Store)(nil)
	_ Keys      = (*store.Store)(nil)
)
