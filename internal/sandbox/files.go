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

// ArchiveLimit is the most bytes a guest's tar stream may have, for a
// sandbox disk of diskBytes: twice the disk (tar headers and padding can
// outweigh the data of small files) and 64 MiB more.
func ArchiveLimit(diskBytes int64) int64 { return 2*diskBytes + 64<<20 }

// WriteArchive extracts the tar stream r into directory p of sandbox id
// (made, with parents, if missing) and returns what the guest made. The
// guest refuses names, symlinks and hard links that would lead outside p,
// and device nodes (ErrInvalid), and caps entries and bytes by its disk
// (ErrResourceExhausted). An extraction that fails midway leaves what it
// made: the audit event says so ("failed").
func (m *Manager) WriteArchive(ctx context.Context, c Caller, id, p string, r io.Reader) (guest.ArchiveResult, error) {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return guest.ArchiveResult{}, err
	}
	res, err := sc.WriteArchive(ctx, p, r)
	d := map[string]any{"path": p, "entries": res.Entries, "size": res.Bytes}
	if err != nil {
		d["failed"] = true
	}
	m.audit(ctx, c, sb.ID, "file.extract", d)
	return res, err
}

// ReadArchive streams a tar of path p of sandbox id (a file, or a
// directory and everything below it, named base(p)/...) to w and returns
// the bytes copied, at most ArchiveLimit of the sandbox's disk
// (ErrResourceExhausted beyond). The stream is the guest's: whoever
// extracts it must treat it as hostile (internal/archive does).
func (m *Manager) ReadArchive(ctx context.Context, c Caller, id, p string, w io.Writer) (int64, error) {
	sb, sc, err := m.running(ctx, c, id)
	if err != nil {
		return 0, err
	}
	return sc.ReadArchive(ctx, p, ArchiveLimit(int64(sb.DiskMiB)<<20), w)
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
