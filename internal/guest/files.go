package guest

import "time"

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
