package sandbox

import (
	"context"
	"io"

	"github.com/airlock-sandbox/airlock/internal/guest"
)

// Guest files, through the sandbox's shim (its FileService). Paths are
// validated by the caller; the shim checks them again before the guest sees
// them. A paused sandbox is resumed first. Errors: errNoSandbox when c may
// not see the sandbox, ErrFailedPrecondition when it is not running, and
// the shim's categories (ErrNotFound for a missing path, ErrInvalid, ...).

// WriteFile streams r into file p of sandbox id (created with mode, parents
// made) and returns the bytes written. Nothing is buffered beyond one
// chunk; on an error the guest keeps the old file.
func (m *Manager) WriteFile(ctx context.Context, c Caller, id, p string, mode uint32, r io.Reader) (int64, error) {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return 0, err
	}
	n, err := sc.WriteFile(ctx, p, mode, r)
	if err == nil {
		m.audit(ctx, c, sb.ID, "file.write", map[string]any{"path": p, "size": n})
	}
	return n, err
}

// ReadFile streams file p of sandbox id to w and returns the bytes copied.
// It refuses more than the sandbox's disk size (ErrResourceExhausted): a
// hostile guest must not make the host store more than its disk can hold.
// info, if not nil, is called with the file's metadata before the first
// byte.
func (m *Manager) ReadFile(ctx context.Context, c Caller, id, p string, w io.Writer, info func(guest.FileInfo)) (int64, error) {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return 0, err
	}
	return sc.ReadFile(ctx, p, int64(sb.DiskMiB)<<20, w, info)
}

// StatFile describes file p of sandbox id.
func (m *Manager) StatFile(ctx context.Context, c Caller, id, p string) (guest.FileInfo, error) {
	_, sc, err := m.running(ctx, c, id)
	if err != nil {
		return guest.FileInfo{}, err
	}
	return sc.StatFile(ctx, p)
}

// ListFiles lists directory p of sandbox id to depth levels; Truncated
// reports that the guest's entry cap was reached.
func (m *Manager) ListFiles(ctx context.Context, c Caller, id, p string, depth uint32) (guest.FileList, error) {
	_, sc, err := m.running(ctx, c, id)
	if err != nil {
		return guest.FileList{}, err
	}
	return sc.ListFiles(ctx, p, depth)
}

// Mkdir makes directory p (mode 0755) in sandbox id, and its parents if
// asked.
func (m *Manager) Mkdir(ctx context.Context, c Caller, id, p string, parents bool) error {
	_, sc, err := m.running(ctx, c, id)
	if err != nil {
		return err
	}
	return sc.Mkdir(ctx, p, parents, 0o755)
}

// RemoveFile removes p in sandbox id (a directory's contents too if
// recursive).
func (m *Manager) RemoveFile(ctx context.Context, c Caller, id, p string, recursive bool) error {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return err
	}
	if err := sc.RemoveFile(ctx, p, recursive); err != nil {
		return err
	}
	m.audit(ctx, c, sb.ID, "file.delete", map[string]any{"path": p, "recursive": recursive})
	return nil
}

// Rename renames from to to in sandbox id (one guest filesystem).
func (m *Manager) Rename(ctx context.Context, c Caller, id, from, to string) error {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return err
	}
	if err := sc.Rename(ctx, from, to); err != nil {
		return err
	}
	m.audit(ctx, c, sb.ID, "file.rename", map[string]any{"from": from, "to": to})
	return nil
}

// WatchDir watches directory p of sandbox id (and below it if recursive):
// started is called once the watch is in place, then fn for each change,
// until ctx ends (nil), fn fails or the guest ends the watch (an error).
// A watch is not activity: it does not keep the sandbox from idling.
func (m *Manager) WatchDir(ctx context.Context, c Caller, id, p string, recursive bool, started func(), fn func(guest.FileEvent) error) error {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return err
	}
	m.audit(ctx, c, sb.ID, "file.watch", map[string]any{"path": p, "recursive": recursive})
	return sc.Watch(ctx, p, recursive, started, fn)
}
