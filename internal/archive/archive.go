package archive

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"syscall"
)

// Errors. An error of Extract or Write wraps one of these, or the system
// error of the step that failed (ENOSPC, EACCES, ...).
var (
	// ErrInvalid means an entry is refused: a bad or escaping name, a
	// special file, a hard link to something the archive did not make, a
	// directory where a file goes (or the reverse).
	ErrInvalid = errors.New("invalid archive entry")
	// ErrLimit means the archive has more entries or file bytes than its
	// Limits allow.
	ErrLimit = errors.New("archive limit exceeded")
)

const (
	// MaxNameBytes caps an entry's name and a symlink's target (PATH_MAX).
	MaxNameBytes = 4096
	// maxComponentBytes caps one component of a name (NAME_MAX).
	maxComponentBytes = 255
	// MaxDepth caps the components of a name: every step costs a lookup,
	// and real trees are far shallower.
	MaxDepth = 256
	// DefaultMaxEntries is the entry cap when Limits.MaxEntries is 0.
	DefaultMaxEntries = 1 << 20
	// tempPrefix starts the names of entries being made.
	tempPrefix = ".airlock-tmp-"
)

// Limits bound one Extract or Write. Zero values mean the defaults:
// DefaultMaxEntries entries, no cap on bytes.
type Limits struct {
	// MaxEntries caps the archive's entries.
	MaxEntries int
	// MaxBytes caps the sum of the regular files' sizes.
	MaxBytes int64
}

func (l Limits) entries() int {
	if l.MaxEntries <= 0 {
		return DefaultMaxEntries
	}
	return l.MaxEntries
}

func (l Limits) bytes() int64 {
	if l.MaxBytes <= 0 {
		return 1<<63 - 1
	}
	return l.MaxBytes
}

// Stats counts what one Extract or Write handled.
type Stats struct {
	Files, Dirs, Symlinks, Links int
	// Skipped counts the entries Write left out (sockets, FIFOs, devices).
	Skipped int
	// Bytes is the file data, without tar headers and padding.
	Bytes int64
}

// Entries is the number of entries made or archived.
func (s Stats) Entries() int { return s.Files + s.Dirs + s.Symlinks + s.Links }

// CleanName turns a tar entry name into a clean relative path ("" for the
// top directory itself, as "." or "./" name it), or fails with ErrInvalid
// for an absolute name, a ".." component, a NUL, a name or component that
// is too long, or more than MaxDepth components. A leading "./" and empty or "." components are dropped.
func CleanName(name string) (string, error) {
	switch {
	case name == "":
		return "", fmt.Errorf("%w: empty name", ErrInvalid)
	case len(name) > MaxNameBytes:
		return "", fmt.Errorf("%w: name longer than %d bytes", ErrInvalid, MaxNameBytes)
	case strings.IndexByte(name, 0) >= 0:
		return "", fmt.Errorf("%w: name contains NUL", ErrInvalid)
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("%w: absolute name %q", ErrInvalid, name)
	}
	var out []string
	for c := range strings.SplitSeq(name, "/") {
		switch {
		case c == "" || c == ".":
			continue
		case c == "..":
			return "", fmt.Errorf("%w: name %q has a .. component", ErrInvalid, name)
		case len(c) > maxComponentBytes:
			return "", fmt.Errorf("%w: a component of %q is longer than %d bytes", ErrInvalid, name, maxComponentBytes)
		}
		out = append(out, c)
	}
	if len(out) > MaxDepth {
		return "", fmt.Errorf("%w: %q is more than %d directories deep", ErrInvalid, name[:64]+"...", MaxDepth)
	}
	return strings.Join(out, "/"), nil
}

// rebase maps a clean name under from to the same place under to: from
// itself becomes to, from/x becomes to/x. Anything else is refused.
func rebase(name, from, to string) (string, error) {
	if from == "" {
		return path.Join(to, name), nil
	}
	if name == from {
		return to, nil
	}
	if rest, ok := strings.CutPrefix(name, from+"/"); ok {
		if to == "" {
			return rest, nil
		}
		return to + "/" + rest, nil
	}
	return "", fmt.Errorf("%w: %q is not under %q", ErrInvalid, name, from)
}

// tempName returns a fresh name for an entry being made in dir.
func tempName(dir string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return path.Join(dir, tempPrefix+hex.EncodeToString(b[:]))
}

// rootErr classifies an error of an os.Root method: a system error stays
// as it is (wrapped by the caller); anything else is the root refusing a
// path that leaves it (an escaping or absolute symlink), which is
// ErrInvalid.
func rootErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if errno, ok := errors.AsType[syscall.Errno](err); ok {
		return fmt.Errorf("%s %q: %w", op, name, errno)
	}
	return fmt.Errorf("%w: %q leads outside the destination", ErrInvalid, name)
}
