package main

// cp -r: directories in and out of a sandbox as tar streams, with docker
// cp's rules for where things land (SRC is the side copied from, DST the
// side copied to, either of them ID:/PATH):
//
//   - DST does not exist: it is made, and gets SRC's contents;
//   - DST is a directory: SRC lands in it as DST/base(SRC), or, when SRC
//     ends in "/." (or is "."), SRC's contents land in DST;
//   - DST exists and is not a directory: an error.
//
// A regular file SRC is copied as plain cp copies it. "-" as SRC extracts a
// tar from stdin into DST (a directory, made if missing); "-" as DST writes
// the tar of SRC (entries base(SRC)/...) to stdout.
//
// What comes out of a guest is extracted with internal/archive's defences
// (the guest is hostile): nothing lands outside DST, at most the sandbox's
// disk size of file data, no devices, no set-id bits, owned by the caller.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/archive"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// guestKind is what a guest path is, as far as cp -r cares.
type guestKind int

const (
	guestMissing guestKind = iota
	guestDir
	guestFile
	guestSymlink
	guestOther
)

// sandboxFS is what cp -r needs of one sandbox: the manager locally, the
// Go SDK remotely (AIRLOCK_HOST).
type sandboxFS interface {
	// kind describes guest path p without following a final symlink.
	kind(ctx context.Context, p string) (guestKind, error)
	// writeArchive extracts the tar stream r into guest directory dir.
	writeArchive(ctx context.Context, dir string, r io.Reader) (guest.ArchiveResult, error)
	// readArchive writes the guest's tar of p (base(p)/...) to w.
	readArchive(ctx context.Context, p string, w io.Writer) error
	// diskBytes is the sandbox's disk size: the most file data a copy out
	// of it may hold.
	diskBytes(ctx context.Context) (int64, error)
}

type apiFS struct {
	c  *airlock.Client
	id string
}

func (r apiFS) kind(ctx context.Context, p string) (guestKind, error) {
	fi, err := r.c.Stat(ctx, r.id, p)
	if errors.Is(err, airlock.ErrNotFound) {
		return guestMissing, nil
	}
	if err != nil {
		return 0, errors.New(apiMsg(err))
	}
	switch fi.Type {
	case "dir":
		return guestDir, nil
	case "file":
		return guestFile, nil
	case "symlink":
		return guestSymlink, nil
	}
	return guestOther, nil
}

func (r apiFS) writeArchive(ctx context.Context, dir string, in io.Reader) (guest.ArchiveResult, error) {
	res, err := r.c.WriteArchive(ctx, r.id, dir, in)
	if err != nil {
		return guest.ArchiveResult{}, errors.New(apiMsg(err))
	}
	return guest.ArchiveResult{Entries: res.Entries, Bytes: res.Size}, nil
}

func (r apiFS) readArchive(ctx context.Context, p string, w io.Writer) error {
	rc, err := r.c.ReadArchive(ctx, r.id, p)
	if err != nil {
		return errors.New(apiMsg(err))
	}
	defer rc.Close()
	// The server caps what a guest sends; this cap keeps a client whose
	// server does not from reading forever.
	disk, err := r.diskBytes(ctx)
	if err != nil {
		return err
	}
	limit := sandbox.ArchiveLimit(disk)
	n, err := io.Copy(w, io.LimitReader(rc, limit+1))
	if err == nil && n > limit {
		err = fmt.Errorf("%w: the archive of %s is larger than %d bytes", errdefs.ErrResourceExhausted, p, limit)
	}
	return err
}

func (r apiFS) diskBytes(ctx context.Context) (int64, error) {
	sb, err := r.c.Get(ctx, r.id)
	if err != nil {
		return 0, err
	}
	return int64(sb.DiskMB) << 20, nil
}

// contentsOnly reports whether a source path asks for its contents rather
// than itself: it ends in "/." or is ".".
func contentsOnly(p string) bool { return p == "." || len(p) >= 2 && p[len(p)-2:] == "/." }

// copyTreeIn copies local (a directory, a file, or "-" for a tar on
// stdin) to guest path remote, and returns what the guest made.
func copyTreeIn(ctx context.Context, sfs sandboxFS, stdin io.Reader, progressOut io.Writer, local, remote string) (guest.ArchiveResult, error) {
	dst := path.Clean(remote)
	if err := shim.ValidateGuestPath(dst); err != nil {
		return guest.ArchiveResult{}, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	prog := &progress{out: progressOut}
	defer prog.done()
	if local == "-" {
		return sfs.writeArchive(ctx, dst, progressReader{stdin, prog})
	}
	fi, err := os.Stat(local)
	if err != nil {
		return guest.ArchiveResult{}, err
	}
	if !fi.IsDir() {
		return guest.ArchiveResult{}, errNotDir
	}
	name := filepath.Base(local)
	if contentsOnly(local) {
		name = ""
	}
	switch k, err := sfs.kind(ctx, dst); {
	case err != nil:
		return guest.ArchiveResult{}, err
	case k == guestMissing:
		name = "" // dst is made and gets the contents
	case k != guestDir && k != guestSymlink: // a symlink must lead to a directory: the guest checks
		return guest.ArchiveResult{}, fmt.Errorf("%w: %s exists and is not a directory", errdefs.ErrInvalid, dst)
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrote := make(chan error, 1)
	go func() {
		_, err := archive.Write(ctx, pw, local, archive.WriteOptions{Name: name})
		pw.CloseWithError(err)
		wrote <- err
	}()
	res, err := sfs.writeArchive(ctx, dst, progressReader{pr, prog})
	pr.CloseWithError(errStopped)
	if werr := <-wrote; werr != nil && !errors.Is(werr, errStopped) {
		// The archive is incomplete: its reason comes first.
		return res, fmt.Errorf("archive %s: %w", local, werr)
	}
	return res, err
}

var (
	// errNotDir sends a single file from cp -r to plain cp.
	errNotDir = errors.New("not a directory")
	// errStopped ends a copy's pipe when its other side is done.
	errStopped = errors.New("the copy stopped")
)

// maxTarTrailer caps what may follow a guest's end-of-archive marker (tar
// pads to a 10 KiB record; more is not padding).
const maxTarTrailer = 1 << 20

// copyTreeOut copies guest path remote to local (made if missing, or "-"
// for the tar on w), extracting the guest's tar as hostile input. It
// returns the file bytes written.
func copyTreeOut(ctx context.Context, sfs sandboxFS, stdout, progressOut io.Writer, remote, local string) (archive.Stats, error) {
	src := path.Clean(remote)
	if err := shim.ValidateGuestPath(src); err != nil {
		return archive.Stats{}, fmt.Errorf("%w: %v", errdefs.ErrInvalid, err)
	}
	prog := &progress{out: progressOut}
	defer prog.done()
	if local == "-" {
		return archive.Stats{}, sfs.readArchive(ctx, src, progressWriter{stdout, prog})
	}
	switch k, err := sfs.kind(ctx, src); {
	case err != nil:
		return archive.Stats{}, err
	case k == guestMissing:
		return archive.Stats{}, fmt.Errorf("%w: %s does not exist", errdefs.ErrNotFound, src)
	case k == guestFile:
		return archive.Stats{}, errNotDir
	case k == guestOther:
		return archive.Stats{}, fmt.Errorf("%w: %s is not a file or directory", errdefs.ErrInvalid, src)
	}
	disk, err := sfs.diskBytes(ctx)
	if err != nil {
		return archive.Stats{}, err
	}
	opt := archive.ExtractOptions{Limits: archive.Limits{MaxBytes: disk}, From: path.Base(src), To: path.Base(src)}
	if contentsOnly(remote) {
		opt.To = ""
	}
	made := false
	switch fi, err := os.Stat(local); {
	case errors.Is(err, fs.ErrNotExist):
		// Made private, then given the source directory's mode.
		if err := os.Mkdir(local, 0o700); err != nil {
			return archive.Stats{}, err
		}
		made, opt.To, opt.RootMeta = true, "", true
	case err != nil:
		return archive.Stats{}, err
	case !fi.IsDir():
		return archive.Stats{}, fmt.Errorf("%w: %s exists and is not a directory", errdefs.ErrInvalid, local)
	}
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	read := make(chan error, 1)
	go func() {
		err := sfs.readArchive(ctx, src, pw)
		pw.CloseWithError(err)
		read <- err
	}()
	st, err := archive.Extract(ctx, progressReader{pr, prog}, local, opt)
	if err == nil {
		// What follows the end marker is tar padding: read it so the
		// guest's stream ends cleanly, and learn whether it did.
		var n int64
		if n, err = io.Copy(io.Discard, io.LimitReader(pr, maxTarTrailer+1)); err == nil && n > maxTarTrailer {
			err = fmt.Errorf("%w: more than %d bytes after the end of the archive", archive.ErrInvalid, maxTarTrailer)
		}
	}
	pr.CloseWithError(errStopped)
	rerr := <-read
	if rerr != nil && !errors.Is(rerr, errStopped) {
		err = rerr // the guest's side failed first
	}
	if err != nil && made && st.Entries() == 0 {
		_ = os.Remove(local)
	}
	return st, err
}

// progress reports the bytes of a long copy on a terminal: at most four
// times a second, and once at the end (done).
type progress struct {
	out   io.Writer // nil: no report
	n     int64
	last  time.Time
	shown bool
}

func (p *progress) add(n int) {
	p.n += int64(n)
	if p.out == nil || time.Since(p.last) < 250*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.shown = true
	fmt.Fprintf(p.out, "\r%s copied", humanBytes(p.n))
}

// done ends the report line, if one was shown.
func (p *progress) done() {
	if p.out != nil && p.shown {
		fmt.Fprintf(p.out, "\r%s copied\n", humanBytes(p.n))
	}
}

type progressReader struct {
	r io.Reader
	*progress
}

func (pr progressReader) Read(b []byte) (int, error) {
	n, err := pr.r.Read(b)
	pr.add(n)
	return n, err
}

type progressWriter struct {
	w io.Writer
	*progress
}

func (pw progressWriter) Write(b []byte) (int, error) {
	n, err := pw.w.Write(b)
	pw.add(n)
	return n, err
}

// terminalOrNil returns w if it is a terminal, else nil (no progress).
func terminalOrNil(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return w
	}
	return nil
}
