package guest

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
)

// MaxPathLen is the longest guest path the host sends.
const MaxPathLen = 4096

// CheckPath checks a path the host is about to send to the guest:
// absolute, clean, without NUL, at most MaxPathLen bytes.
func CheckPath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case len(p) > MaxPathLen:
		return fmt.Errorf("path is longer than %d bytes", MaxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is not absolute", p)
	case path.Clean(p) != p:
		return fmt.Errorf("path %q is not clean (want %q)", p, path.Clean(p))
	}
	return nil
}

// FileType is the kind of a guest file.
type FileType uint8

// File types. FileUnknown is what a guest that said nothing reports.
const (
	FileUnknown FileType = iota
	FileRegular
	FileDirectory
	FileSymlink
	FileOther
)

// FileInfo describes one guest file. Its strings are guest data: bounded by
// the shim, never interpreted as host paths.
type FileInfo struct {
	Path string
	Name string
	Type FileType
	Size uint64
	// Mode holds the permission bits (0o7777 mask).
	Mode  uint32
	Mtime time.Time
	UID   uint32
	GID   uint32
	// SymlinkTarget is a symlink's target (not followed).
	SymlinkTarget string
}

// FileList is what listing a directory returns.
type FileList struct {
	Entries []FileInfo
	// Truncated says the guest's entry cap was reached.
	Truncated bool
}

// ArchiveResult is what extracting a tar stream in the guest made.
type ArchiveResult struct {
	// Entries counts the files, directories, symlinks and hard links made.
	Entries int64
	// Bytes is the file data written.
	Bytes int64
}

// FileOp is what happened to a watched path.
type FileOp uint8

// File operations a watch reports.
const (
	OpCreate FileOp = iota + 1
	OpWrite
	OpRemove
	OpRename
	OpChmod
)

// FileEvent is one change under a watched directory.
type FileEvent struct {
	// Name is the path relative to the watched directory (clean, no "..").
	Name string
	Op   FileOp
}
