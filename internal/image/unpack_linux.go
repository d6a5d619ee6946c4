package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// resolveInRoot makes openat2 treat the root fd as "/" for every path:
// "..", absolute symlinks and relative symlinks cannot climb out of it.
const resolveInRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// unpack extracts the tar stream r into dir, an existing empty directory,
// without letting any entry escape it:
//
//   - names are relative to dir; ".." components are refused;
//   - parent directories are resolved with openat2(RESOLVE_IN_ROOT), so a
//     symlink in a parent path (a -> /etc, then a/passwd) resolves inside
//     dir, as it would inside the guest;
//   - the final component is never followed (O_NOFOLLOW, *at calls with
//     AT_SYMLINK_NOFOLLOW); an existing non-directory there is replaced;
//   - symlinks are created verbatim and never followed while unpacking;
//   - hard links must name an existing non-directory inside dir;
//   - device nodes, FIFOs and sockets are skipped and logged;
//   - setuid/setgid/sticky bits are kept; owners are set with fchown or
//     lchown-style fchownat when opt.chown is set;
//   - opt.limits caps total file bytes and entries.
//
// Directory modes and mtimes are applied at the end. dir itself gets mode
// 0755.
func unpack(ctx context.Context, r io.Reader, dir string, opt unpackOptions) (unpackStats, error) {
	if opt.log == nil {
		opt.log = slog.New(slog.DiscardHandler)
	}
	if err := opt.limits.Validate(); err != nil {
		return unpackStats{}, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return unpackStats{}, err
	}
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return unpackStats{}, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(root)
	u := &unpacker{root: root, opt: opt}
	err = u.run(ctx, r)
	return u.stats, err
}

// dirMeta is a directory's mode and mtime, applied after the whole stream
// so that a read-only directory can still be filled (without root) and
// children do not bump its mtime.
type dirMeta struct {
	name  string
	mode  uint32
	mtime time.Time
}

type unpacker struct {
	root  int
	opt   unpackOptions
	stats unpackStats
	dirs  []dirMeta
	// pending hard links whose target did not exist yet.
	pending []*tar.Header
}

func (u *unpacker) run(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		u.stats.entries++
		if u.stats.entries > u.opt.limits.MaxEntries {
			return fmt.Errorf("unpack: %w: more than %d entries", ErrLimit, u.opt.limits.MaxEntries)
		}
		if err := u.entry(hdr, tr, buf); err != nil {
			return fmt.Errorf("unpack %q: %w", hdr.Name, err)
		}
	}
	for _, hdr := range u.pending {
		if err := u.hardlink(hdr, true); err != nil {
			return fmt.Errorf("unpack %q: %w", hdr.Name, err)
		}
	}
	// Directories last, deepest first.
	for _, d := range slices.Backward(u.dirs) {
		if err := u.finishDir(d); err != nil {
			return fmt.Errorf("unpack %q: %w", d.name, err)
		}
	}
	if u.stats.skipped > 0 {
		u.opt.log.Info("unpack skipped entries", "skipped", u.stats.skipped)
	}
	return nil
}

func (u *unpacker) entry(hdr *tar.Header, tr io.Reader, buf []byte) error {
	name, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.mkdir(name, hdr)
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck // TypeRegA appears in old archives.
		if name == "" {
			return fmt.Errorf("%w: regular file at the root", ErrInvalid)
		}
		return u.file(name, hdr, tr, buf)
	case tar.TypeSymlink:
		if name == "" {
			return fmt.Errorf("%w: symlink at the root", ErrInvalid)
		}
		return u.symlink(name, hdr)
	case tar.TypeLink:
		if name == "" {
			return fmt.Errorf("%w: hard link at the root", ErrInvalid)
		}
		return u.hardlink(hdr, false)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.stats.skipped++
		u.opt.log.Debug("unpack: skipping special file", "path", name, "type", string(hdr.Typeflag))
		return nil
	default:
		u.stats.skipped++
		u.opt.log.Debug("unpack: skipping entry of unknown type", "path", name, "type", string(hdr.Typeflag))
		return nil
	}
}

// parent opens the directory that will hold name (which must not be "")
// and returns it with name's last component. With create, missing parent
// directories are made (mode 0755, owned by the caller).
func (u *unpacker) parent(name string, create bool) (int, string, error) {
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if base == "" || base == "." || base == ".." {
		return -1, "", fmt.Errorf("%w: bad name", ErrInvalid)
	}
	fd, err := u.openDir(dir)
	if errors.Is(err, unix.ENOENT) && create {
		if err = u.mkdirAll(dir); err == nil {
			fd, err = u.openDir(dir)
		}
	}
	if err != nil {
		return -1, "", fmt.Errorf("open parent %q: %w", dir, err)
	}
	return fd, base, nil
}

// openDir opens dir (relative to the root, "" for the root) as an O_PATH
// directory fd, resolving every component inside the root.
func (u *unpacker) openDir(dir string) (int, error) {
	if dir == "" {
		dir = "."
	}
	for {
		fd, err := unix.Openat2(u.root, dir, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: resolveInRoot,
		})
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // EAGAIN: a concurrent rename raced the lookup; retry
		}
		return fd, err
	}
}

// mkdirAll creates the missing directories of dir, each resolved inside
// the root.
func (u *unpacker) mkdirAll(dir string) error {
	comps := strings.Split(dir, "/")
	for i := range comps {
		prefix := strings.Join(comps[:i+1], "/")
		fd, err := u.openDir(prefix)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return err
		}
		pfd, err := u.openDir(strings.Join(comps[:i], "/"))
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, comps[i], 0o755)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		if errors.Is(err, unix.EEXIST) {
			// Something (a dangling symlink) is there but is no directory.
			return fmt.Errorf("%w: %q is not a directory", ErrInvalid, prefix)
		}
		u.stats.dirs++
	}
	return nil
}

// clearNonDir removes a non-directory at dirfd/base so it can be replaced, and
// reports whether a directory is there.
func clearNonDir(dirfd int, base string) (isDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true, nil
	}
	return false, unix.Unlinkat(dirfd, base, 0)
}

func (u *unpacker) mkdir(name string, hdr *tar.Header) error {
	if name == "" {
		// The root keeps mode 0755 and the owner mkfs gives it.
		return nil
	}
	pfd, base, err := u.parent(name, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Mkdirat(pfd, base, 0o700)
	if errors.Is(err, unix.EEXIST) {
		isDir, cerr := clearNonDir(pfd, base)
		if cerr != nil {
			return cerr
		}
		if !isDir {
			err = unix.Mkdirat(pfd, base, 0o700)
		} else {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open dir: %w", err)
	}
	defer unix.Close(fd)
	if u.opt.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	u.setXattrs(fd, name, hdr)
	u.stats.dirs++
	u.dirs = append(u.dirs, dirMeta{name, uint32(hdr.Mode) & 0o7777, hdr.ModTime})
	return nil
}

// finishDir applies a directory's mode and mtime.
func (u *unpacker) finishDir(d dirMeta) error {
	pfd, base, err := u.parent(d.name, false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open dir: %w", err)
	}
	err = unix.Fchmod(fd, d.mode)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return u.setTimesAt(pfd, base, d.mtime)
}

func (u *unpacker) file(name string, hdr *tar.Header, r io.Reader, buf []byte) error {
	if hdr.Size < 0 {
		return fmt.Errorf("%w: negative size", ErrInvalid)
	}
	if u.stats.bytes+hdr.Size > u.opt.limits.MaxBytes {
		return fmt.Errorf("%w: more than %d bytes of files", ErrLimit, u.opt.limits.MaxBytes)
	}
	pfd, base, err := u.parent(name, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(pfd, base, flags, 0o600)
	if errors.Is(err, unix.EEXIST) {
		isDir, cerr := clearNonDir(pfd, base)
		if cerr != nil {
			return cerr
		}
		if isDir {
			return fmt.Errorf("%w: a directory is in the way", ErrInvalid)
		}
		fd, err = unix.Openat(pfd, base, flags, 0o600)
	}
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	n, err := io.CopyBuffer(f, io.LimitReader(r, hdr.Size), buf)
	u.stats.bytes += n
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if n != hdr.Size {
		return fmt.Errorf("write: %w: short file (%d of %d bytes)", io.ErrUnexpectedEOF, n, hdr.Size)
	}
	if err := u.setOwnerMode(fd, hdr); err != nil {
		return err
	}
	u.setXattrs(fd, name, hdr)
	if err := f.Close(); err != nil {
		return err
	}
	u.stats.files++
	return u.setTimesAt(pfd, base, hdr.ModTime)
}

func (u *unpacker) symlink(name string, hdr *tar.Header) error {
	if hdr.Linkname == "" || len(hdr.Linkname) > maxPathLen || strings.ContainsRune(hdr.Linkname, 0) {
		return fmt.Errorf("%w: bad symlink target", ErrInvalid)
	}
	pfd, base, err := u.parent(name, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.Symlinkat(hdr.Linkname, pfd, base)
	if errors.Is(err, unix.EEXIST) {
		isDir, cerr := clearNonDir(pfd, base)
		if cerr != nil {
			return cerr
		}
		if isDir {
			return fmt.Errorf("%w: a directory is in the way", ErrInvalid)
		}
		err = unix.Symlinkat(hdr.Linkname, pfd, base)
	}
	if err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if u.opt.chown {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("lchown: %w", err)
		}
	}
	u.stats.symlinks++
	return u.setTimesAt(pfd, base, hdr.ModTime)
}

// hardlink links hdr.Name to hdr.Linkname, both inside the root. A target
// that does not exist yet is retried after the whole stream (final=false);
// if it is still missing then, the entry is skipped and logged.
func (u *unpacker) hardlink(hdr *tar.Header, final bool) error {
	name, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	target, err := cleanEntryName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	if target == "" || target == name {
		return fmt.Errorf("%w: bad hard link target %q", ErrInvalid, hdr.Linkname)
	}
	tfd, tbase, err := u.parent(target, false)
	if err == nil {
		defer unix.Close(tfd)
		var st unix.Stat_t
		err = unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("%w: hard link to a directory", ErrInvalid)
		}
	}
	if errors.Is(err, unix.ENOENT) {
		if !final {
			u.pending = append(u.pending, hdr)
			return nil
		}
		u.stats.skipped++
		u.opt.log.Warn("unpack: skipping hard link to a missing file", "path", name, "target", target)
		return nil
	}
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	pfd, base, err := u.parent(name, true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	// flags 0: if the target is a symlink, link the symlink itself.
	err = unix.Linkat(tfd, tbase, pfd, base, 0)
	if errors.Is(err, unix.EEXIST) {
		isDir, cerr := clearNonDir(pfd, base)
		if cerr != nil {
			return cerr
		}
		if isDir {
			return fmt.Errorf("%w: a directory is in the way", ErrInvalid)
		}
		err = unix.Linkat(tfd, tbase, pfd, base, 0)
	}
	if err != nil {
		return fmt.Errorf("link: %w", err)
	}
	u.stats.hardlinks++
	return nil
}

// setOwnerMode sets owner (when chown is on) and then mode, in that order:
// chown clears the setuid and setgid bits.
func (u *unpacker) setOwnerMode(fd int, hdr *tar.Header) error {
	if u.opt.chown {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// setXattrs applies the allowed extended attributes. Failures are logged:
// a missing file capability is not worth failing an import for.
func (u *unpacker) setXattrs(fd int, name string, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		key, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok || !allowedXattr(key) {
			continue
		}
		if err := unix.Fsetxattr(fd, key, []byte(v), 0); err != nil {
			u.opt.log.Warn("unpack: set xattr", "path", name, "xattr", key, "err", err)
		}
	}
}

func (u *unpacker) setTimesAt(dirfd int, base string, mtime time.Time) error {
	if mtime.IsZero() {
		return nil
	}
	ts := unix.NsecToTimespec(mtime.UnixNano())
	if err := unix.UtimesNanoAt(dirfd, base, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}
