package image

import (
	"fmt"
	"log/slog"
	"path"
	"strings"
)

// unpackOptions configures unpack.
type unpackOptions struct {
	limits Limits
	// chown sets each entry's owner from the tar header. Without it files
	// belong to the caller (for tests that run unprivileged).
	chown bool
	log   *slog.Logger
}

// unpackStats counts what unpack did.
type unpackStats struct {
	entries   int64 // tar headers read
	bytes     int64 // regular file bytes written
	files     int64
	dirs      int64
	symlinks  int64
	hardlinks int64
	skipped   int64 // devices, FIFOs, sockets, unknown types, dangling hard links
}

// maxPathLen caps entry names and link targets (PATH_MAX).
const maxPathLen = 4096

// cleanEntryName turns a tar entry name into a path relative to the root,
// "" for the root itself. Leading "/" and "./" are dropped (absolute names
// are relative to the image root); a ".." component is refused, as are
// NUL bytes and over-long names.
func cleanEntryName(name string) (string, error) {
	if name == "" || len(name) > maxPathLen || strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("entry name %q: %w: empty, too long or has NUL", name, ErrInvalid)
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("entry name %q: %w: \"..\" would leave the image root", name, ErrInvalid)
		}
	}
	p := path.Clean("/" + name)
	return strings.TrimPrefix(p, "/"), nil
}

// allowedXattr says which extended attributes from a layer are kept.
// File capabilities matter for binaries such as ping; user.* is harmless.
// Everything else (trusted.*, security.selinux, ...) is dropped.
func allowedXattr(key string) bool {
	return key == "security.capability" || strings.HasPrefix(key, "user.")
}

// xattrPrefix marks extended attributes in PAX records.
const xattrPrefix = "SCHILY.xattr."
