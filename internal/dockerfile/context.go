package dockerfile

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Limits of one COPY or ADD step (errdefs.ErrResourceExhausted beyond).
const (
	// MaxStepBytes caps the file data of one step.
	MaxStepBytes = 1 << 30
	// MaxStepEntries caps the entries of one step.
	MaxStepEntries = 100_000
)

// maxIgnoreBytes caps .dockerignore.
const maxIgnoreBytes = 1 << 20

// Context is a build context: a directory on the host, opened through an
// os.Root, and its .dockerignore patterns. Its methods may be called from
// several goroutines.
type Context struct {
	root *os.Root
	fsys fs.FS

	mu     sync.Mutex                     // patternmatcher is not safe for concurrent use
	ignore *patternmatcher.PatternMatcher // nil: nothing is ignored
}

// OpenContext opens dir (through os.Root: no path of a step may leave it,
// symlinks inside the context are copied as symlinks, never followed out of
// it) and reads dir/.dockerignore if present (errdefs.ErrInvalid if it
// cannot be read or has a bad pattern). The caller closes the Context.
func OpenContext(dir string) (*Context, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open build context: %w", err)
	}
	c := &Context{root: root, fsys: root.FS()}
	if err := c.readIgnore(); err != nil {
		_ = root.Close()
		return nil, err
	}
	return c, nil
}

// readIgnore reads .dockerignore, if there is one.
func (c *Context) readIgnore() error {
	f, err := c.root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: open .dockerignore: %v", errdefs.ErrInvalid, err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(io.LimitReader(f, maxIgnoreBytes))
	if err != nil {
		return fmt.Errorf("%w: read .dockerignore: %v", errdefs.ErrInvalid, err)
	}
	if len(patterns) == 0 {
		return nil
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return fmt.Errorf("%w: .dockerignore: %v", errdefs.ErrInvalid, err)
	}
	c.ignore = pm
	return nil
}

// Close releases the context directory.
func (c *Context) Close() error { return c.root.Close() }

// ignored says .dockerignore leaves out the context path rel.
func (c *Context) ignored(rel string) bool {
	if c.ignore == nil || rel == "." {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.ignore.MatchesOrParentMatches(rel)
	return err == nil && m
}

// exceptions says .dockerignore has "!" patterns: an ignored directory
// may hold paths that are not ignored.
func (c *Context) exceptions() bool {
	return c.ignore != nil && c.ignore.Exclusions()
}

// entry is one tar entry of a step, or (extract) a local archive whose
// entries go into the step's directory.
type entry struct {
	name    string // relative to the step's directory
	src     string // context path of a regular file or archive
	typ     byte
	mode    int64
	size    int64
	link    string
	mtime   time.Time
	extract bool
	follow  bool // src is a source symlink followed inside the context
}

// copyPlan is what a COPY or ADD step sends: entries relative to dir.
type copyPlan struct {
	line    int
	kind    string
	dir     string
	chmod   int64 // -1: keep modes
	entries []entry
	bytes   int64
}

// add appends e, checking the step's limits.
func (cp *copyPlan) add(e entry) error {
	if len(cp.entries) >= MaxStepEntries {
		return exhausted(cp.line, "%s copies more than %d entries", cp.kind, MaxStepEntries)
	}
	cp.bytes += e.size
	if cp.bytes > MaxStepBytes {
		return exhausted(cp.line, "%s copies more than %d bytes", cp.kind, MaxStepBytes)
	}
	cp.entries = append(cp.entries, e)
	return nil
}

// plan resolves a COPY or ADD step's sources in the context.
func (c *Context) plan(s Step) (*copyPlan, error) {
	if s.Kind != "COPY" && s.Kind != "ADD" {
		return nil, invalid(s.Line, "%s copies no files", s.Kind)
	}
	if !path.IsAbs(s.Dest) {
		return nil, invalid(s.Line, "%s destination %q is not absolute", s.Kind, s.Dest)
	}
	if len(s.Sources) == 0 {
		return nil, invalid(s.Line, "%s names no source", s.Kind)
	}
	cp := &copyPlan{line: s.Line, kind: s.Kind, chmod: -1}
	if s.Chmod != "" {
		m, err := parseChmod(s.Chmod)
		if err != nil {
			return nil, invalid(s.Line, "%s: %v", s.Kind, err)
		}
		cp.chmod = m
	}
	var srcs []source
	wildcard := false
	for _, raw := range s.Sources {
		rel, err := cleanSource(raw)
		if err != nil {
			return nil, invalid(s.Line, "%s: %v", s.Kind, err)
		}
		var rels []string
		ignored := false
		if hasMeta(rel) {
			wildcard = true
			if rels, err = c.glob(rel); err != nil {
				return nil, invalid(s.Line, "%s source %q: %v", s.Kind, raw, err)
			}
			if len(rels) == 0 {
				return nil, invalid(s.Line, "%s source %q matches no file in the build context", s.Kind, raw)
			}
		} else {
			// An ignored directory may still hold "!" exceptions.
			ignored = c.ignored(rel)
			if ignored && !c.exceptions() {
				return nil, invalid(s.Line, "%s source %q is excluded by .dockerignore", s.Kind, raw)
			}
			rels = []string{rel}
		}
		for _, r := range rels {
			fi, err := c.root.Lstat(r)
			if errors.Is(err, fs.ErrNotExist) {
				return nil, invalid(s.Line, "%s source %q not found in the build context", s.Kind, raw)
			}
			if err != nil {
				return nil, invalid(s.Line, "%s source %q: %v", s.Kind, raw, err)
			}
			if ignored && !fi.IsDir() {
				return nil, invalid(s.Line, "%s source %q is excluded by .dockerignore", s.Kind, raw)
			}
			follow := false
			if fi.Mode()&fs.ModeSymlink != 0 {
				// Followed while it stays inside the context (os.Root
				// refuses the rest), as docker follows sources.
				if st, err := c.root.Stat(r); err == nil && (st.IsDir() || st.Mode().IsRegular()) {
					fi, follow = st, true
				}
			}
			srcs = append(srcs, source{r, fi, follow})
		}
	}
	dest := path.Clean(s.Dest)
	destIsDir := strings.HasSuffix(s.Dest, "/") || len(s.Sources) > 1 || wildcard
	single := srcs[0]
	switch {
	case destIsDir || single.fi.IsDir():
		cp.dir = dest
	case s.Kind == "ADD" && single.fi.Mode().IsRegular():
		isArchive, err := c.isArchive(single.rel, single.follow)
		if err != nil {
			return nil, invalid(s.Line, "ADD source %q: %v", single.rel, err)
		}
		if isArchive {
			cp.dir = dest
		} else {
			cp.dir = path.Dir(dest)
		}
	default:
		cp.dir = path.Dir(dest)
	}
	for _, src := range srcs {
		name := path.Base(src.rel)
		if !destIsDir {
			name = path.Base(dest)
		}
		if err := c.source(cp, src, name, s.Kind == "ADD"); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// source is a COPY/ADD source found in the context.
type source struct {
	rel    string
	fi     fs.FileInfo // of the symlink's target when follow
	follow bool
}

// source plans one source: a directory's contents go into cp.dir, a file or
// symlink is named name there, and an archive (ADD) is extracted there.
func (c *Context) source(cp *copyPlan, src source, name string, add bool) error {
	rel, fi := src.rel, src.fi
	m := fi.Mode()
	switch {
	case m.IsDir():
		_, err := c.walk(cp, rel, "")
		return err
	case m.IsRegular():
		if add {
			isArchive, err := c.isArchive(rel, src.follow)
			if err != nil {
				return invalid(cp.line, "ADD source %q: %v", rel, err)
			}
			if isArchive {
				return cp.add(entry{src: rel, extract: true, follow: src.follow})
			}
		}
		e := fileEntry(name, rel, fi)
		e.follow = src.follow
		return cp.add(e)
	case m&fs.ModeSymlink != 0:
		e, err := c.symlinkEntry(name, rel, fi)
		if err != nil {
			return invalid(cp.line, "%s source %q: %v", cp.kind, rel, err)
		}
		return cp.add(e)
	default:
		return invalid(cp.line, "%s source %q is not a file, directory or symlink", cp.kind, rel)
	}
}

// walk plans the tree under context directory rel as name/... ("" for
// the top), leaving out what .dockerignore ignores, and says whether it
// planned anything. Symlinks are entries, never followed; sockets, FIFOs
// and devices are left out.
func (c *Context) walk(cp *copyPlan, rel, name string) (bool, error) {
	des, err := fs.ReadDir(c.fsys, rel)
	if err != nil {
		return false, invalid(cp.line, "%s: read %q: %v", cp.kind, rel, err)
	}
	planned := false
	for _, de := range des {
		childRel := path.Join(rel, de.Name())
		childName := path.Join(name, de.Name())
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			return false, invalid(cp.line, "%s: stat %q: %v", cp.kind, childRel, err)
		}
		ign := c.ignored(childRel)
		m := fi.Mode()
		switch {
		case m.IsDir():
			if ign && !c.exceptions() {
				continue
			}
			mark := len(cp.entries)
			dir := entry{name: childName + "/", typ: tar.TypeDir, mode: modeBits(m), mtime: fi.ModTime()}
			if !ign {
				if err := cp.add(dir); err != nil {
					return false, err
				}
			}
			sub, err := c.walk(cp, childRel, childName)
			if err != nil {
				return false, err
			}
			if ign && sub {
				// An exception inside an ignored directory: the
				// directory comes along, before its entries.
				if err := cp.add(dir); err != nil {
					return false, err
				}
				last := cp.entries[len(cp.entries)-1]
				copy(cp.entries[mark+1:], cp.entries[mark:len(cp.entries)-1])
				cp.entries[mark] = last
			}
			planned = planned || !ign || sub
		case ign:
			continue
		case m.IsRegular():
			if err := cp.add(fileEntry(childName, childRel, fi)); err != nil {
				return false, err
			}
			planned = true
		case m&fs.ModeSymlink != 0:
			e, err := c.symlinkEntry(childName, childRel, fi)
			if err != nil {
				return false, invalid(cp.line, "%s: %q: %v", cp.kind, childRel, err)
			}
			if err := cp.add(e); err != nil {
				return false, err
			}
			planned = true
		}
	}
	return planned, nil
}

// fileEntry is the entry of a regular file.
func fileEntry(name, rel string, fi fs.FileInfo) entry {
	return entry{name: name, src: rel, typ: tar.TypeReg, mode: modeBits(fi.Mode()), size: fi.Size(), mtime: fi.ModTime()}
}

// symlinkEntry is the entry of a symlink: its target as it is.
func (c *Context) symlinkEntry(name, rel string, fi fs.FileInfo) (entry, error) {
	target, err := c.root.Readlink(rel)
	if err != nil {
		return entry{}, err
	}
	return entry{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target, mtime: fi.ModTime()}, nil
}

// modeBits are a tar header's mode bits: permissions, set-id and sticky.
func modeBits(m fs.FileMode) int64 {
	b := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// hasMeta says a source is a wildcard pattern.
func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// glob lists the context paths that pattern matches (path.Match, one
// pattern component per path component), sorted, leaving out ignored ones.
// It never descends through a symlink.
func (c *Context) glob(pattern string) ([]string, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, err
	}
	comps := strings.Split(pattern, "/")
	fixed := 0
	for fixed < len(comps) && !hasMeta(comps[fixed]) {
		fixed++
	}
	base := path.Join(comps[:fixed]...)
	if base == "" {
		base = "."
	}
	if fi, err := c.root.Lstat(base); err != nil || !fi.IsDir() {
		return nil, nil // a missing prefix matches nothing; the caller says so
	}
	var out []string
	var visit func(dir string, depth int) error
	visit = func(dir string, depth int) error {
		des, err := fs.ReadDir(c.fsys, dir)
		if err != nil {
			return err
		}
		for _, de := range des {
			p := path.Join(dir, de.Name())
			if depth+1 == len(comps) {
				if ok, _ := path.Match(pattern, p); ok && !c.ignored(p) {
					out = append(out, p)
					if len(out) > MaxStepEntries {
						return fmt.Errorf("matches more than %d paths", MaxStepEntries)
					}
				}
			} else if de.IsDir() {
				if err := visit(p, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := visit(base, fixed); err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// openFile opens the regular file rel without following a symlink (unless
// follow: a source symlink, followed inside the context only) or blocking
// on a FIFO that replaced it since it was planned.
func (c *Context) openFile(rel string, follow bool) (*os.File, error) {
	flags := os.O_RDONLY | syscall.O_NONBLOCK
	if !follow {
		flags |= syscall.O_NOFOLLOW
	}
	f, err := c.root.OpenFile(rel, flags, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, errors.New("not a regular file any more")
	}
	return f, nil
}

// emitFunc receives one entry's header and, for a regular file, its data
// (exactly h.Size bytes, or an error).
type emitFunc func(h *tar.Header, data io.Reader) error

// emit produces the plan's entries in order.
func (c *Context) emit(cp *copyPlan, fn emitFunc) error {
	n := len(cp.entries)
	bytes := cp.bytes
	for _, e := range cp.entries {
		if e.extract {
			n-- // the archive's entries count, not the archive
			if err := c.extract(cp, e, &n, &bytes, fn); err != nil {
				return err
			}
			continue
		}
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Mode: e.mode, Size: e.size, Linkname: e.link, ModTime: e.mtime, Format: tar.FormatPAX}
		if cp.chmod >= 0 && e.typ != tar.TypeSymlink {
			h.Mode = cp.chmod
		}
		if e.typ != tar.TypeReg {
			if err := fn(h, nil); err != nil {
				return err
			}
			continue
		}
		if err := c.emitFile(cp, e, h, fn); err != nil {
			return err
		}
	}
	return nil
}

// emitFile emits one regular file of the context.
func (c *Context) emitFile(cp *copyPlan, e entry, h *tar.Header, fn emitFunc) error {
	f, err := c.openFile(e.src, e.follow)
	if err != nil {
		return invalid(cp.line, "%s: open %q: %v", cp.kind, e.src, err)
	}
	defer f.Close()
	r := &exactReader{r: f, left: e.size}
	if err := fn(h, r); err != nil {
		if r.err != nil {
			return invalid(cp.line, "%s: read %q: %v", cp.kind, e.src, r.err)
		}
		return err
	}
	return nil
}

// exactReader reads exactly left bytes from r: fewer is an error (the file
// shrank during the build); more are not read.
type exactReader struct {
	r    io.Reader
	left int64
	err  error
}

func (x *exactReader) Read(b []byte) (int, error) {
	if x.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > x.left {
		b = b[:x.left]
	}
	n, err := x.r.Read(b)
	x.left -= int64(n)
	if errors.Is(err, io.EOF) && x.left > 0 {
		x.err = errors.New("file changed during the build (shorter than when planned)")
		return n, x.err
	}
	if err != nil && !errors.Is(err, io.EOF) {
		x.err = err
	}
	return n, err
}

// CopyTar writes to w the tar stream of a COPY or ADD step (s.Kind) for the
// guest's archive extraction at directory dir (returned; the extractor
// makes it and its parents if they are missing), following docker's rules:
// a directory source copies its contents; several sources or a wildcard or
// a Dest ending in "/" make Dest a directory; otherwise a single file
// source is written at Dest itself (dir = path.Dir(Dest), entry =
// path.Base(Dest)). Wildcards are path.Match patterns on context paths.
// .dockerignore'd paths are left out (the Dockerfile and .dockerignore
// themselves are included unless ignored, as in docker). A source outside
// the context ("../x", or through a symlink that leaves it), ignored, or
// matching nothing is an error wrapping errdefs.ErrInvalid naming the line.
// Symlinks below a source are copied as symlinks; a source that is a
// symlink is followed when its target is a file or directory inside the
// context (as docker does), and otherwise copied as the symlink.
// ADD of a local tar archive (plain, gzip or bzip2; detected by content, as
// docker does) extracts it at Dest: its entries are re-rooted under Dest,
// and one with ".." or an absolute name, or a device or FIFO, is refused.
// --chmod (octal) sets the mode of every copied entry but symlinks. Entries
// have uid/gid 0 (the caller chowns --chown names afterwards in the guest,
// since names resolve there): CopyTar also returns the top-level paths it
// wrote (absolute guest paths, in order), for that chown. Limits:
// MaxStepBytes of file data and MaxStepEntries entries (an error wrapping
// errdefs.ErrResourceExhausted). On an error, w may have received part of
// the stream.
func (c *Context) CopyTar(s Step, w io.Writer) (dir string, top []string, err error) {
	cp, err := c.plan(s)
	if err != nil {
		return "", nil, err
	}
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	err = c.emit(cp, func(h *tar.Header, data io.Reader) error {
		first, _, _ := strings.Cut(h.Name, "/")
		if !seen[first] {
			seen[first] = true
			top = append(top, path.Join(cp.dir, first))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write tar: %w", err)
		}
		if data != nil {
			if _, err := io.Copy(tw, data); err != nil {
				return fmt.Errorf("write tar: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	if err := tw.Close(); err != nil {
		return "", nil, fmt.Errorf("write tar: %w", err)
	}
	return cp.dir, top, nil
}
