package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// A sandbox's logs (`airlock logs`, the dashboard's Logs card): its guest's
// console (qemu: the serial console, the kernel's and the agent's output,
// capped by the runtime; gvisor: the container's output) and its
// supervisor's log (the shim's: the host's account of the
// sandbox, with host paths and errors, so for admins only). Reading them
// never resumes a paused sandbox and is not activity.

// LogSource names a sandbox log.
type LogSource string

const (
	LogConsole    LogSource = "console"
	LogSupervisor LogSource = "supervisor"
)

// MaxLogTail caps the bytes of one log that Logs returns.
const MaxLogTail = 1 << 20

// LogTail is the end of one log of a sandbox.
type LogTail struct {
	Source LogSource
	// Exists is false when the sandbox has no such log (yet).
	Exists bool
	// Size is the log's size; Text its last bytes (all of it unless
	// Size is larger than the tail asked for).
	Size int64
	Text []byte
}

// Logs returns the last tail bytes (at most MaxLogTail) of sandbox id's
// logs that c may read: the console for anyone who sees the sandbox, the
// supervisor's log too for an admin. Safe for concurrent use.
func (m *Manager) Logs(ctx context.Context, c Caller, id string, tail int64) ([]LogTail, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if tail <= 0 || tail > MaxLogTail {
		tail = MaxLogTail
	}
	srcs := []struct {
		src  LogSource
		path string
	}{{LogConsole, m.L.Console(sb.ID)}}
	if c.Admin {
		srcs = append(srcs, struct {
			src  LogSource
			path string
		}{LogSupervisor, m.L.ShimLog(sb.ID)})
	}
	out := make([]LogTail, 0, len(srcs))
	for _, s := range srcs {
		lt, err := readTail(s.path, tail)
		if err != nil {
			return nil, fmt.Errorf("%s log: %w", s.src, err)
		}
		lt.Source = s.src
		out = append(out, lt)
	}
	return out, nil
}

// readTail reads the last n bytes of the file at path (Exists false if
// there is none).
func readTail(path string, n int64) (LogTail, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return LogTail{}, nil
	}
	if err != nil {
		return LogTail{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return LogTail{}, err
	}
	off := max(fi.Size()-n, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return LogTail{}, err
	}
	return LogTail{Exists: true, Size: fi.Size(), Text: b}, nil
}
