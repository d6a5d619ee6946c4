package mcp

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Service is the part of the sandbox manager MCP needs. Lifecycle
// methods act for a caller: the manager decides what it may see (another
// tenant's sandbox is ErrNotFound, like a missing one), checks its quotas
// and writes the audit trail. Errors are categorized with errdefs; their
// text may name host details and is not shown to clients except for
// ErrInvalid, ErrNotFound, ErrFailedPrecondition and ErrResourceExhausted
// (see publicText).
type Service interface {
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
	// SetNetwork replaces a running or paused sandbox's egress policy,
	// whole (sandbox.Manager.SetNetwork: validated like a create, the
	// platform floor refused to callers that are not admins).
	SetNetwork(ctx context.Context, c sandbox.Caller, id string, p sandbox.EgressPolicy) (sandbox.NetworkChange, error)
	// SetSecret adds or replaces a running or paused sandbox's secret
	// (sandbox.Manager.SetSecret); MCP gives only sec.Vault, never a
	// value.
	SetSecret(ctx context.Context, c sandbox.Caller, id string, sec netconf.Secret, value string) (sandbox.NetworkChange, error)
	// RemoveSecret removes a running or paused sandbox's secret.
	RemoveSecret(ctx context.Context, c sandbox.Caller, id, name string) (sandbox.NetworkChange, error)
	// Pause saves a running sandbox to disk and ends its VMM (a paused one
	// is a no-op); without force it is refused (ErrFailedPrecondition)
	// while code runs (running commands are parked). Every other call resumes it first.
	Pause(ctx context.Context, c sandbox.Caller, id string, force bool) (sandbox.PauseResult, error)
	// Resume restores a paused sandbox (a running one is a no-op).
	Resume(ctx context.Context, c sandbox.Caller, id string) (store.Sandbox, error)
	// Snapshot saves a running or paused sandbox as the named snapshot of
	// its tenant; the sandbox keeps running. ErrConflict if the name is
	// taken; ErrFailedPrecondition with secrets or, unless force, running
	// commands.
	Snapshot(ctx context.Context, c sandbox.Caller, id, name string, force bool) (store.Snapshot, error)
	// CreateFromSnapshot starts a sandbox from c's tenant's snapshot name
	// (ErrNotFound if none); o may set Timeout, Metadata and IdlePause only.
	CreateFromSnapshot(ctx context.Context, c sandbox.Caller, name string, o sandbox.CreateOptions) (store.Sandbox, error)
	// Fork makes count running copies of a sandbox, all or none.
	Fork(ctx context.Context, c sandbox.Caller, id string, o sandbox.ForkOptions) ([]store.Sandbox, error)

	// Exec starts spec in the sandbox for c and returns its stream once it
	// runs (sandbox.Manager.Exec: the shim merges the sandbox's env under
	// spec.Env); with killOnDetach closing the stream kills it.
	Exec(ctx context.Context, c sandbox.Caller, sandboxID string, spec guest.ExecSpec, killOnDetach bool) (guest.ExecStream, error)

	// WriteFile streams r into p (mode, parents made).
	WriteFile(ctx context.Context, c sandbox.Caller, id, p string, mode uint32, r io.Reader) (int64, error)
	// ReadFile streams p to w; info is called before the first byte.
	ReadFile(ctx context.Context, c sandbox.Caller, id, p string, w io.Writer, info func(guest.FileInfo)) (int64, error)
	// ListFiles lists directory p to depth levels.
	ListFiles(ctx context.Context, c sandbox.Caller, id, p string, depth uint32) (guest.FileList, error)

	// StartBrowser starts the browser of a sandbox made from the browser
	// image where it is not running and returns its status
	// (sandbox.ErrNoBrowser, a failed precondition, for other images).
	// Idempotent.
	StartBrowser(ctx context.Context, c sandbox.Caller, id string, v sandbox.BrowserView) (sandbox.BrowserStatus, error)
	// DialBrowser opens a TCP stream to the DevTools port of the
	// sandbox's browser, starting the browser first if nothing answers.
	// The caller closes the stream.
	DialBrowser(ctx context.Context, c sandbox.Caller, id string) (net.Conn, error)

	Contexts
}

// Contexts is the code-context part of the manager.
type Contexts interface {
	CreateContext(ctx context.Context, c sandbox.Caller, sandboxID string, spec guest.ContextSpec) (guest.ContextInfo, error)
	ListContexts(ctx context.Context, c sandbox.Caller, sandboxID string) ([]guest.ContextInfo, error)
	RestartContext(ctx context.Context, c sandbox.Caller, sandboxID, contextID string) (guest.ContextInfo, error)
	// RunCode runs code and calls fn with each event, ending with one end.
	RunCode(ctx context.Context, c sandbox.Caller, sandboxID string, req guest.CodeRequest, fn func(guest.CodeEvent) error) error
}

// Principal is who a session acts as: the manager's caller. Tenant "" is
// the local user; KeyID "" (stdio) becomes "mcp:<session>" in the audit
// trail; Via is set to "mcp" by the handler.
type Principal = sandbox.Caller
