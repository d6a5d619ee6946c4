package archive

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// maxDeferredNames caps the bytes of directory names whose mode and times
// wait for the end of the stream; directories beyond it get theirs at once.
const maxDeferredNames = 16 << 20

// ExtractOptions says how Extract makes entries.
type ExtractOptions struct {
	Limits Limits
	// Chown, if set, makes UID:GID the owner of every entry Extract makes
	// (directories it makes for an entry's parents too). The archive's
	// owners are never used: without Chown, entries belong to the caller.
	Chown    bool
	UID, GID int
	// From and To rebase names: with From set, every entry (and hard link
	// target) must be From or below it, and From is replaced by To ("" is
	// the destination itself). Names are compared after CleanName.
	From, To string
	// RootMeta gives the destination itself the mode and mtime of the
	// archive's entry for it (if any), for a destination the caller has
	// just made; otherwise the destination keeps its own.
	RootMeta bool
}

// Extract reads the tar stream r into dir, an existing directory, and
// returns what it made. dir itself keeps its mode, owner and times (an
// entry that names it, "./", only counts) unless RootMeta is set. An entry
// whose name exists is replaced (a file, symlink or link by rename, so
// never followed), and a directory is merged into an existing one; a
// directory never replaces a non-directory, nor the reverse (ErrInvalid).
// Missing parents are made (0755). Directory modes and times are set
// after the last entry, so that a read-only directory in the archive can
// still be filled.
//
// Extract reads r up to the end-of-archive marker, not beyond. On an
// error, what it made so far stays. It does not sync.
func Extract(ctx context.Context, r io.Reader, dir string, opt ExtractOptions) (Stats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, err
	}
	defer root.Close()
	x := &extractor{root: root, opt: opt, made: map[fileID]struct{}{}, buf: make([]byte, 256<<10)}
	err = x.run(ctx, r)
	return x.stats, err
}

type fileID struct{ dev, ino uint64 }

// idOf returns the device and inode of fi (from Lstat or Stat).
func idOf(fi fs.FileInfo) (fileID, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{uint64(st.Dev), st.Ino}, true //nolint:unconvert // Dev is int32 on darwin
}

// dirMeta is the mode and mtime a directory gets at the end.
type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

type extractor struct {
	root    *os.Root
	opt     ExtractOptions
	stats   Stats
	entries int
	// made holds the regular files this archive made: the only targets a
	// hard link may have.
	made map[fileID]struct{}
	// dirs wait for their mode and mtime; dirNames is their names' bytes.
	dirs     []dirMeta
	dirNames int
	buf      []byte
}

func (x *extractor) run(ctx context.Context, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if errors.Is(err, tar.ErrHeader) {
			return fmt.Errorf("%w: read tar: %v", ErrInvalid, err)
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		x.entries++
		if x.entries > x.opt.Limits.entries() {
			return fmt.Errorf("%w: more than %d entries", ErrLimit, x.opt.Limits.entries())
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
		// Parents made for entries count too.
		if x.stats.Entries() > x.opt.Limits.entries() {
			return fmt.Errorf("%w: more than %d entries made", ErrLimit, x.opt.Limits.entries())
		}
	}
	for _, d := range slices.Backward(x.dirs) {
		if err := x.finishDir(d); err != nil {
			return err
		}
	}
	return nil
}

// name cleans and rebases an entry name or hard link target.
func (x *extractor) name(raw string) (string, error) {
	name, err := CleanName(raw)
	if err != nil {
		return "", err
	}
	if x.opt.From == "" && x.opt.To == "" {
		return name, nil
	}
	return rebase(name, x.opt.From, x.opt.To)
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // PAX defaults for later entries; nothing to make
	}
	name, err := x.name(hdr.Name)
	if err != nil {
		return err
	}
	if name == "" && hdr.Typeflag != tar.TypeDir {
		return fmt.Errorf("%w: %q names the destination itself", ErrInvalid, hdr.Name)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, hdr)
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse: //nolint:staticcheck // TypeRegA appears in old archives.
		return x.file(name, hdr, r)
	case tar.TypeSymlink:
		return x.symlink(name, hdr)
	case tar.TypeLink:
		return x.link(name, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("%w: %q is a device node or FIFO", ErrInvalid, hdr.Name)
	default:
		return fmt.Errorf("%w: %q has unsupported type %q", ErrInvalid, hdr.Name, hdr.Typeflag)
	}
}

// parentDir is the directory that holds name ("" for the destination).
func parentDir(name string) string {
	d := path.Dir(name)
	if d == "." {
		return ""
	}
	return d
}

// mkdirAll makes the missing directories of dir (0755, and chowned), each
// resolved inside the root. An existing dir costs one lookup; a missing
// one is made by descending one component at a time (sub-roots), so that a
// deep name costs time linear in its length.
func (x *extractor) mkdirAll(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := x.root.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("%w: %q: a non-directory is in the way", ErrInvalid, dir)
	case !errors.Is(err, fs.ErrNotExist):
		return rootErr("stat", dir, err)
	}
	r := x.root
	defer func() {
		if r != x.root {
			r.Close()
		}
	}()
	comps := strings.Split(dir, "/")
	for i, c := range comps {
		prefix := strings.Join(comps[:i+1], "/")
		err := r.Mkdir(c, 0o755)
		switch {
		case err == nil:
			x.stats.Dirs++
			if x.opt.Chown {
				if err := r.Lchown(c, x.opt.UID, x.opt.GID); err != nil {
					return rootErr("chown", prefix, err)
				}
			}
		case !errors.Is(err, fs.ErrExist):
			return rootErr("mkdir", prefix, err)
		}
		sub, err := r.OpenRoot(c)
		if err != nil {
			// c is there but is no plain directory: a symlink may still
			// lead to one inside the root; resolve it from there.
			if fi, serr := x.root.Stat(prefix); errors.Is(serr, fs.ErrNotExist) {
				return fmt.Errorf("%w: %q: a dangling symlink is in the way", ErrInvalid, prefix)
			} else if serr != nil {
				return rootErr("open", prefix, serr)
			} else if !fi.IsDir() {
				return fmt.Errorf("%w: %q: a non-directory is in the way", ErrInvalid, prefix)
			}
			if sub, err = x.root.OpenRoot(prefix); err != nil {
				return rootErr("open", prefix, err)
			}
		}
		if r != x.root {
			r.Close()
		}
		r = sub
	}
	return nil
}

// mkdir makes directory name, or finds one there (following symlinks that
// stay inside the root), and reports whether it made it.
func (x *extractor) mkdir(name string, perm fs.FileMode) (bool, error) {
	err := x.root.Mkdir(name, perm)
	if err == nil {
		if x.opt.Chown {
			if err := x.root.Lchown(name, x.opt.UID, x.opt.GID); err != nil {
				return true, rootErr("chown", name, err)
			}
		}
		return true, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return false, rootErr("mkdir", name, err)
	}
	fi, err := x.root.Stat(name)
	if err != nil {
		return false, rootErr("stat", name, err)
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("%w: %q: a non-directory is in the way", ErrInvalid, name)
	}
	return false, nil
}

func (x *extractor) dir(name string, hdr *tar.Header) error {
	if name == "" && !x.opt.RootMeta {
		return nil // the destination keeps its own mode, owner and times
	}
	if name == "" {
		name = "."
	} else {
		if err := x.mkdirAll(parentDir(name)); err != nil {
			return err
		}
		made, err := x.mkdir(name, 0o700)
		if err != nil {
			return err
		}
		if made {
			x.stats.Dirs++
		}
	}
	d := dirMeta{name, fs.FileMode(hdr.Mode) & fs.ModePerm, hdr.ModTime}
	if hdr.Mode&0o1000 != 0 {
		d.mode |= fs.ModeSticky
	}
	if x.dirNames+len(name) > maxDeferredNames {
		return x.finishDir(d)
	}
	x.dirNames += len(name)
	x.dirs = append(x.dirs, d)
	return nil
}

// finishDir gives a directory its mode and mtime.
func (x *extractor) finishDir(d dirMeta) error {
	if err := x.root.Chmod(d.name, d.mode); err != nil {
		return rootErr("chmod", d.name, err)
	}
	return x.setTimes(d.name, d.mtime)
}

func (x *extractor) setTimes(name string, mtime time.Time) error {
	if mtime.IsZero() {
		return nil
	}
	return rootErr("set times of", name, x.root.Chtimes(name, mtime, mtime))
}

// place renames tmp, a fresh entry, over name; a directory in the way is
// ErrInvalid. tmp is removed on failure.
func (x *extractor) place(tmp, name string) error {
	err := x.root.Rename(tmp, name)
	if err == nil {
		return nil
	}
	_ = x.root.Remove(tmp)
	if fi, lerr := x.root.Lstat(name); lerr == nil && fi.IsDir() {
		return fmt.Errorf("%w: %q: a directory is in the way", ErrInvalid, name)
	}
	return rootErr("rename over", name, err)
}

// onlyWriter hides a writer's ReadFrom, so io.CopyBuffer uses its buffer.
type onlyWriter struct{ io.Writer }

func (x *extractor) file(name string, hdr *tar.Header, r io.Reader) error {
	if hdr.Size < 0 {
		return fmt.Errorf("%w: %q has a negative size", ErrInvalid, hdr.Name)
	}
	if x.stats.Bytes+hdr.Size > x.opt.Limits.bytes() {
		return fmt.Errorf("%w: more than %d bytes of files", ErrLimit, x.opt.Limits.bytes())
	}
	dir := parentDir(name)
	if err := x.mkdirAll(dir); err != nil {
		return err
	}
	tmp := tempName(dir)
	f, err := x.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return rootErr("create", name, err)
	}
	closed, done := false, false
	defer func() {
		if !closed {
			_ = f.Close()
		}
		if !done {
			_ = x.root.Remove(tmp)
		}
	}()
	n, err := io.CopyBuffer(onlyWriter{f}, io.LimitReader(r, hdr.Size), x.buf)
	x.stats.Bytes += n
	if err != nil {
		if errno, ok := errors.AsType[syscall.Errno](err); ok {
			return fmt.Errorf("write %q: %w", name, errno)
		}
		return fmt.Errorf("read %q from the archive: %w", name, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("%w: %q is truncated", ErrInvalid, hdr.Name)
	}
	// chown before chmod: chown clears set-id bits (none are set here).
	if x.opt.Chown {
		if err := f.Chown(x.opt.UID, x.opt.GID); err != nil {
			return rootErr("chown", name, err)
		}
	}
	if err := f.Chmod(fs.FileMode(hdr.Mode) & fs.ModePerm); err != nil {
		return rootErr("chmod", name, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return rootErr("stat", name, err)
	}
	closed = true
	if err := f.Close(); err != nil {
		return rootErr("close", name, err)
	}
	if err := x.setTimes(tmp, hdr.ModTime); err != nil {
		return err
	}
	if err := x.place(tmp, name); err != nil {
		return err
	}
	done = true
	if id, ok := idOf(fi); ok {
		x.made[id] = struct{}{}
	}
	x.stats.Files++
	return nil
}

func (x *extractor) symlink(name string, hdr *tar.Header) error {
	t := hdr.Linkname
	if t == "" || len(t) > MaxNameBytes || strings.IndexByte(t, 0) >= 0 {
		return fmt.Errorf("%w: %q has a bad symlink target", ErrInvalid, hdr.Name)
	}
	dir := parentDir(name)
	if err := x.mkdirAll(dir); err != nil {
		return err
	}
	tmp := tempName(dir)
	if err := x.root.Symlink(t, tmp); err != nil {
		return rootErr("symlink", name, err)
	}
	if x.opt.Chown {
		if err := x.root.Lchown(tmp, x.opt.UID, x.opt.GID); err != nil {
			_ = x.root.Remove(tmp)
			return rootErr("chown", name, err)
		}
	}
	if err := x.place(tmp, name); err != nil {
		return err
	}
	x.stats.Symlinks++
	return nil
}

func (x *extractor) link(name string, hdr *tar.Header) error {
	target, err := x.name(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link %q: %w", hdr.Name, err)
	}
	fi, err := x.root.Lstat(target)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rootErr("hard link to", target, err)
	}
	id, ok := fileID{}, false
	if err == nil && fi.Mode().IsRegular() {
		id, ok = idOf(fi)
	}
	if _, made := x.made[id]; !ok || !made {
		return fmt.Errorf("%w: hard link %q to %q, a file this archive did not make", ErrInvalid, hdr.Name, hdr.Linkname)
	}
	dir := parentDir(name)
	if err := x.mkdirAll(dir); err != nil {
		return err
	}
	tmp := tempName(dir)
	if err := x.root.Link(target, tmp); err != nil {
		return rootErr("hard link", name, err)
	}
	if err := x.place(tmp, name); err != nil {
		return err
	}
	x.stats.Links++
	return nil
}
