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

// Sandboxes is the lifecycle part of the manager the API needs. Errors are
// categorized with errdefs.
type Sandboxes interface {
	// Create boots a sandbox and returns its row once the guest answers.
	Create(ctx context.Context, o sandbox.CreateOptions) (store.Sandbox, error)
	// Get returns one sandbox (ErrNotFound if missing).
	Get(ctx context.Context, id string) (store.Sandbox, error)
	// List returns every sandbox of every tenant.
	List(ctx context.Context) ([]store.Sandbox, error)
	// Remove stops and deletes a sandbox; removing twice is fine.
	Remove(ctx context.Context, id string) error
	// SetTimeout moves the sandbox's expiry to now + d.
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	// Pause saves a running sandbox to disk and ends its VMM (a paused
	// sandbox is a no-op). Without force it is refused
	// (ErrFailedPrecondition) while commands or code are running.
	Pause(ctx context.Context, id string, force bool) (sandbox.PauseResult, error)
	// Resume restores a paused sandbox (a running one is a no-op) and
	// returns its row once the guest answers.
	Resume(ctx context.Context, id string) (store.Sandbox, error)
	// Touch counts as activity for the idle-pause timer (and resumes a
	// paused sandbox).
	Touch(ctx context.Context, id string) error
}

// Snapshots is the snapshot and fork part of the manager (sandbox.Manager's
// methods of the same names, with the catalog's snapshot reads; see
// ManagerSnapshots). Errors are categorized with errdefs.
type Snapshots interface {
	// Snapshot saves a running or paused sandbox (memory, processes, disk)
	// as the named snapshot of the sandbox's tenant; the sandbox keeps
	// running. ErrConflict if the tenant has that name; ErrFailedPrecondition
	// for a sandbox with secrets or, without force, running commands.
	Snapshot(ctx context.Context, id, name string, force bool) (store.Snapshot, error)
	// CreateFromSnapshot starts a sandbox from o.Tenant's snapshot name; o
	// may set Timeout, Metadata and IdlePause only.
	CreateFromSnapshot(ctx context.Context, name string, o sandbox.CreateOptions) (store.Sandbox, error)
	// Fork makes count (1..sandbox.MaxForks) running copies of a sandbox. On
	// an error the copies made so far are returned with it.
	Fork(ctx context.Context, id string, count int, force bool) ([]store.Sandbox, error)
	// RemoveSnapshot deletes a snapshot; ErrFailedPrecondition while
	// sandboxes or snapshots are backed by its disk.
	RemoveSnapshot(ctx context.Context, tenant, name string) error
	// PruneSnapshots removes unused fork bases and orphaned snapshot files
	// of every tenant and returns the bytes freed.
	PruneSnapshots(ctx context.Context) (int64, error)
	// ListSnapshots returns tenant's snapshots (every tenant's if all),
	// fork bases included.
	ListSnapshots(ctx context.Context, tenant string, all bool) ([]store.Snapshot, error)
	// GetSnapshot returns tenant's snapshot name (ErrNotFound if none).
	GetSnapshot(ctx context.Context, tenant, name string) (store.Snapshot, error)
	// DiskUsage is the bytes a sandbox's files take on the host (0 if none).
	DiskUsage(id string) int64
}

// ManagerSnapshots is m as Snapshots: the manager's operations and its
// catalog's reads.
func ManagerSnapshots(m *sandbox.Manager) Snapshots { return managerSnapshots{m} }

type managerSnapshots struct{ *sandbox.Manager }

func (m managerSnapshots) ListSnapshots(ctx context.Context, tenant string, all bool) ([]store.Snapshot, error) {
	return m.Store.ListSnapshots(ctx, tenant, all)
}

func (m managerSnapshots) GetSnapshot(ctx context.Context, tenant, name string) (store.Snapshot, error) {
	return m.Store.GetSnapshot(ctx, tenant, name)
}

// Files is the file part of the manager (sandbox.Manager's methods of the
// same names). Paths are validated by the API before they get here. Nothing
// is buffered whole: data streams.
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
	// Safe for concurrent use.
	DialPort(ctx context.Context, id string, port uint16) (net.Conn, error)
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
	_ Snapshots = managerSnapshots{}
	_ Events    = (*store.Store)(nil)
	_ Keys      = (*store.Store)(nil)
)
