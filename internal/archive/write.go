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
)

// WriteOptions says what Write archives and how it names it.
type WriteOptions struct {
	Limits Limits
	// Name is the top's name in the archive: a file is one entry of that
	// name, a directory is Name/ and everything below it as Name/... .
	// Empty: a directory's contents only, named relative to it (a file
	// needs a Name).
	Name string
}

// Write writes a tar stream of src to w and returns what it archived. src
// itself is followed if it is a symlink (the caller named it); nothing
// below it is: symlinks are archived as symlinks. Sockets, FIFOs and
// devices are skipped (Stats.Skipped), and so is an entry that vanishes
// or changes type while Write runs. A regular file with several links in
// the tree is archived once, then as hard links to its first name. A file
// that shrinks while it is read is padded with zeros to the size its
// header gave; one that grows is cut there.
//
// An entry beyond Limits.MaxEntries, file data beyond Limits.MaxBytes or a
// name longer than MaxNameBytes ends the stream with an error; what was
// written to w by then is not a complete archive.
func Write(ctx context.Context, w io.Writer, src string, opt WriteOptions) (Stats, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return Stats{}, err
	}
	a := &archiver{tw: tar.NewWriter(w), opt: opt, links: map[fileID]string{}, buf: make([]byte, 256<<10)}
	name := strings.TrimSuffix(opt.Name, "/")
	switch {
	case fi.Mode().IsRegular():
		if name == "" {
			return Stats{}, fmt.Errorf("%w: a file needs a name in the archive", ErrInvalid)
		}
		open := func() (*os.File, error) { return os.OpenFile(src, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0) }
		if err := a.file(src, name, fi, open); err != nil {
			return a.stats, err
		}
	case fi.IsDir():
		root, err := os.OpenRoot(src)
		if err != nil {
			return Stats{}, err
		}
		defer root.Close()
		a.root = root
		if name != "" {
			if err := a.header(header(name+"/", fi, tar.TypeDir)); err != nil {
				return a.stats, err
			}
			a.stats.Dirs++
		}
		if err := a.walk(ctx, ".", name); err != nil {
			return a.stats, err
		}
	default:
		return Stats{}, fmt.Errorf("%w: %s is neither a file nor a directory", ErrInvalid, src)
	}
	if err := a.tw.Close(); err != nil {
		return a.stats, err
	}
	return a.stats, nil
}

type archiver struct {
	root    *os.Root
	tw      *tar.Writer
	opt     WriteOptions
	stats   Stats
	entries int
	// links maps a multiply linked file to its first name in the archive.
	links map[fileID]string
	buf   []byte
}

// header builds the header of name from fi: permission, set-id and
// sticky bits, numeric owner, mtime. Names and sizes are the caller's.
func header(name string, fi fs.FileInfo, typ byte) *tar.Header {
	m := fi.Mode()
	h := &tar.Header{Typeflag: typ, Name: name, Mode: int64(m.Perm()), ModTime: fi.ModTime()}
	if m&fs.ModeSetuid != 0 {
		h.Mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		h.Mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		h.Mode |= 0o1000
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		h.Uid, h.Gid = int(st.Uid), int(st.Gid)
	}
	return h
}

// header writes h after checking the entry cap and the name's length.
func (a *archiver) header(h *tar.Header) error {
	a.entries++
	if a.entries > a.opt.Limits.entries() {
		return fmt.Errorf("%w: more than %d entries", ErrLimit, a.opt.Limits.entries())
	}
	if len(h.Name) > MaxNameBytes {
		return fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalid, h.Name[:64]+"...", MaxNameBytes)
	}
	if strings.Count(strings.TrimSuffix(h.Name, "/"), "/") >= MaxDepth {
		return fmt.Errorf("%w: %q is more than %d directories deep", ErrInvalid, h.Name[:64]+"...", MaxDepth)
	}
	return a.tw.WriteHeader(h)
}

// walk archives the entries of directory rel (relative to the root) as
// name/... .
func (a *archiver) walk(ctx context.Context, rel, name string) error {
	d, err := a.root.Open(rel)
	if err != nil {
		return rootErr("open", rel, err)
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return rootErr("read directory", rel, err)
	}
	if a.entries+len(ents) > a.opt.Limits.entries() {
		return fmt.Errorf("%w: more than %d entries", ErrLimit, a.opt.Limits.entries())
	}
	slices.SortFunc(ents, func(x, y fs.DirEntry) int { return strings.Compare(x.Name(), y.Name()) })
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		crel, cname := path.Join(rel, e.Name()), e.Name()
		if name != "" {
			cname = name + "/" + e.Name()
		}
		fi, err := a.root.Lstat(crel)
		if errors.Is(err, fs.ErrNotExist) {
			continue // vanished meanwhile
		}
		if err != nil {
			return rootErr("stat", crel, err)
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			if err := a.header(header(cname+"/", fi, tar.TypeDir)); err != nil {
				return err
			}
			a.stats.Dirs++
			if err := a.walk(ctx, crel, cname); err != nil {
				return err
			}
		case m&fs.ModeSymlink != 0:
			target, err := a.root.Readlink(crel)
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EINVAL) {
				a.stats.Skipped++ // vanished or replaced meanwhile
				continue
			}
			if err != nil {
				return rootErr("read link", crel, err)
			}
			h := header(cname, fi, tar.TypeSymlink)
			h.Linkname = target
			if err := a.header(h); err != nil {
				return err
			}
			a.stats.Symlinks++
		case m.IsRegular():
			open := func() (*os.File, error) {
				return a.root.OpenFile(crel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
			}
			if err := a.file(crel, cname, fi, open); err != nil {
				return err
			}
		default:
			a.stats.Skipped++
		}
	}
	return nil
}

// zeros pads a file that shrank while it was read.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// file archives regular file rel (fi from Lstat; open opens it) as name.
func (a *archiver) file(rel, name string, fi fs.FileInfo, open func() (*os.File, error)) error {
	id, hasID := idOf(fi)
	st, _ := fi.Sys().(*syscall.Stat_t)
	multi := hasID && st != nil && st.Nlink > 1
	if multi {
		if first, ok := a.links[id]; ok {
			h := header(name, fi, tar.TypeLink)
			h.Linkname = first
			if err := a.header(h); err != nil {
				return err
			}
			a.stats.Links++
			return nil
		}
	}
	f, err := open()
	if errors.Is(err, fs.ErrNotExist) {
		a.stats.Skipped++
		return nil
	}
	if err != nil {
		return rootErr("open", rel, err)
	}
	defer f.Close()
	ofi, err := f.Stat()
	if err != nil {
		return rootErr("stat", rel, err)
	}
	if oid, _ := idOf(ofi); !ofi.Mode().IsRegular() || (hasID && oid != id) {
		a.stats.Skipped++ // replaced meanwhile
		return nil
	}
	size := ofi.Size()
	if a.stats.Bytes+size > a.opt.Limits.bytes() {
		return fmt.Errorf("%w: more than %d bytes of files", ErrLimit, a.opt.Limits.bytes())
	}
	h := header(name, ofi, tar.TypeReg)
	h.Size = size
	if err := a.header(h); err != nil {
		return err
	}
	n, err := io.CopyBuffer(a.tw, io.LimitReader(f, size), a.buf)
	a.stats.Bytes += n
	if err != nil {
		if errno, ok := errors.AsType[syscall.Errno](err); ok {
			return fmt.Errorf("read %q: %w", rel, errno)
		}
		return err
	}
	if n < size {
		if _, err := io.CopyBuffer(a.tw, io.LimitReader(zeros{}, size-n), a.buf); err != nil {
			return err
		}
	}
	if multi {
		a.links[id] = name
	}
	a.stats.Files++
	return nil
}
