package image

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Limits caps what Import and Pull accept from an image.
type Limits struct {
	// MaxBytes caps the bytes of file content unpacked, and separately the
	// compressed bytes downloaded or read. Default 64 GiB.
	MaxBytes int64
	// MaxEntries caps the number of tar entries unpacked. Default 2,000,000.
	MaxEntries int64
}

// DefaultLimits are the Limits a new Store starts with.
var DefaultLimits = Limits{MaxBytes: 64 << 30, MaxEntries: 2_000_000}

// Validate reports whether l is usable.
func (l Limits) Validate() error {
	if l.MaxBytes <= 0 || l.MaxEntries <= 0 {
		return fmt.Errorf("image limits: %w: MaxBytes and MaxEntries must be positive", ErrInvalid)
	}
	return nil
}

// Layout under stateDir.
const (
	imagesDir  = "images"
	blobsDir   = "blobs"
	tmpDir     = "tmp"
	lockName   = "lock"
	blobPrefix = "sha256-"
	blobSuffix = ".ext4"
	// staleTemp is how old a leftover staging dir must be before a later
	// build removes it (a crashed run leaves it behind).
	staleTemp = 24 * time.Hour
)

// Store keeps images under stateDir/images and their names in an Index.
// Its methods are safe for concurrent use, also by several processes
// sharing a state dir: changes to names and blobs hold a lock file.
type Store struct {
	dir string // stateDir/images
	idx Index
	log *slog.Logger
	now func() time.Time

	// Limits caps what Import and Pull accept. Set it before first use;
	// zero fields mean DefaultLimits.
	Limits Limits

	// allowUnprivileged lets tests build images without root (file
	// ownership is then not preserved).
	allowUnprivileged bool

	// mu serialises name and blob changes within the process; lockFile
	// does it across processes.
	mu sync.Mutex
}

// NewStore returns a Store for stateDir with names kept in idx. log may be
// nil (discard). It creates no files until an image is built.
func NewStore(stateDir string, idx Index, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{
		dir:    filepath.Join(stateDir, imagesDir),
		idx:    idx,
		log:    log,
		now:    time.Now,
		Limits: DefaultLimits,
	}
}

func (s *Store) limits() Limits {
	l := s.Limits
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultLimits.MaxEntries
	}
	return l
}

// Path returns the absolute path of img's ext4 blob, or "" if img.Digest is
// not a sha256 digest. The file is read-only and must never be written;
// attach it read-only or as a qcow2 backing file.
func (s *Store) Path(img Image) string {
	if !validDigest(img.Digest) {
		return ""
	}
	p := s.blobPath(img.Digest)
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

func (s *Store) blobPath(digest string) string {
	return filepath.Join(s.dir, blobsDir, blobPrefix+strings.TrimPrefix(digest, "sha256:")+blobSuffix)
}

// Get returns the image called name. An unknown name gives an error
// wrapping ErrNotFound; a malformed one, ErrInvalid.
func (s *Store) Get(ctx context.Context, name string) (Image, error) {
	if err := ValidName(name); err != nil {
		return Image{}, err
	}
	img, err := s.idx.GetImage(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return Image{}, fmt.Errorf("image %q: %w (see `airlock image ls`)", name, ErrNotFound)
	}
	if err != nil {
		return Image{}, fmt.Errorf("get image %q: %w", name, err)
	}
	return img, nil
}

// List returns all images sorted by name.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	imgs, err := s.idx.ListImages(ctx)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	slices.SortFunc(imgs, func(a, b Image) int { return cmp.Compare(a.Name, b.Name) })
	return imgs, nil
}

// Remove deletes the name, and the blob when no other name refers to it.
// The Store does not know which sandboxes use a blob: the caller must make
// sure none does (their overlays name it as backing file).
func (s *Store) Remove(ctx context.Context, name string) error {
	img, err := s.Get(ctx, name)
	if err != nil {
		return err
	}
	unlock, err := s.lock()
	if err != nil {
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	defer unlock()
	if err := s.idx.DeleteImage(ctx, name); err != nil {
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	imgs, err := s.idx.ListImages(ctx)
	if err != nil {
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	for _, o := range imgs {
		if o.Digest == img.Digest {
			s.log.Info("image name removed; blob kept", "image", name, "digest", img.Digest, "still_named", o.Name)
			return nil
		}
	}
	if p := s.Path(img); p != "" {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove image %q: %w", name, err)
		}
	}
	if err := s.RemoveDir(img); err != nil {
		return fmt.Errorf("remove image %q: %w", name, err)
	}
	s.log.Info("image removed", "image", name, "digest", img.Digest)
	return nil
}

// Prune removes blobs that no name refers to and for which inUse (which
// may be nil) returns false, and staging dirs left by crashed builds. It
// returns the digests removed.
func (s *Store) Prune(ctx context.Context, inUse func(digest string) bool) ([]string, error) {
	unlock, err := s.lock()
	if err != nil {
		return nil, fmt.Errorf("prune images: %w", err)
	}
	defer unlock()
	imgs, err := s.idx.ListImages(ctx)
	if err != nil {
		return nil, fmt.Errorf("prune images: %w", err)
	}
	named := map[string]bool{}
	for _, img := range imgs {
		named[img.Digest] = true
	}
	ents, err := os.ReadDir(filepath.Join(s.dir, blobsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("prune images: %w", err)
	}
	var removed []string
	for _, e := range ents {
		hexd, ok := strings.CutPrefix(e.Name(), blobPrefix)
		hexd, ok2 := strings.CutSuffix(hexd, blobSuffix)
		d := "sha256:" + hexd
		if !ok || !ok2 || !validDigest(d) || named[d] || (inUse != nil && inUse(d)) {
			continue
		}
		if err := os.Remove(s.blobPath(d)); err != nil {
			return removed, fmt.Errorf("prune images: %w", err)
		}
		removed = append(removed, d)
	}
	// Extracted trees (gvisor) of digests that no name refers to.
	dirs, _ := os.ReadDir(filepath.Join(s.dir, dirsDir))
	for _, e := range dirs {
		hexd, ok := strings.CutPrefix(e.Name(), blobPrefix)
		d := "sha256:" + hexd
		if !ok || !e.IsDir() || !validDigest(d) || named[d] || (inUse != nil && inUse(d)) {
			continue
		}
		if err := s.RemoveDir(Image{Digest: d}); err != nil {
			return removed, fmt.Errorf("prune images: %w", err)
		}
		if !slices.Contains(removed, d) {
			removed = append(removed, d)
		}
	}
	s.cleanStaleTemp(0)
	return removed, nil
}

// Verify re-hashes img's blob and compares it with img.Digest and img.Size.
// A mismatch gives an error wrapping ErrCorrupt.
func (s *Store) Verify(ctx context.Context, img Image) error {
	p := s.Path(img)
	if p == "" {
		return fmt.Errorf("verify image %q: %w: bad digest %q", img.Name, ErrInvalid, img.Digest)
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("verify image %q: %w", img.Name, err)
	}
	defer f.Close()
	d, n, err := hashReader(ctx, f)
	if err != nil {
		return fmt.Errorf("verify image %q: %w", img.Name, err)
	}
	if d != img.Digest || (img.Size != 0 && n != img.Size) {
		return fmt.Errorf("verify image %q: %w: blob is %s (%d bytes), want %s (%d bytes)", img.Name, ErrCorrupt, d, n, img.Digest, img.Size)
	}
	return nil
}

// hashReader returns "sha256:<hex>" and the length of r, checking ctx
// between chunks.
func hashReader(ctx context.Context, r io.Reader) (string, int64, error) {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return "", n, err
		}
		m, err := r.Read(buf)
		h.Write(buf[:m])
		n += int64(m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", n, err
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// lock takes the store's in-process mutex and its lock file.
func (s *Store) lock() (func(), error) {
	s.mu.Lock()
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(s.dir, lockName), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		s.mu.Unlock()
		return nil, fmt.Errorf("lock image store: %w", err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
		s.mu.Unlock()
	}, nil
}

// stagingDir makes a fresh directory under images/tmp for one build. The
// caller removes it with removeAll.
func (s *Store) stagingDir(prefix string) (string, error) {
	// images/ is traverse-only for everyone: the unprivileged VMM uids open
	// blobs (as qcow2 backing files) by path, but need not list them.
	if err := os.MkdirAll(s.dir, 0o711); err != nil {
		return "", err
	}
	_ = os.Chmod(s.dir, 0o711)
	t := filepath.Join(s.dir, tmpDir)
	if err := os.MkdirAll(t, 0o700); err != nil {
		return "", err
	}
	s.cleanStaleTemp(staleTemp)
	return os.MkdirTemp(t, prefix)
}

// cleanStaleTemp removes staging dirs older than age. Best effort.
func (s *Store) cleanStaleTemp(age time.Duration) {
	t := filepath.Join(s.dir, tmpDir)
	ents, err := os.ReadDir(t)
	if err != nil {
		return
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || s.now().Sub(fi.ModTime()) < max(age, time.Hour) {
			continue
		}
		p := filepath.Join(t, e.Name())
		if err := removeAll(p); err != nil {
			s.log.Warn("remove stale staging dir", "path", p, "err", err)
		}
	}
}

// requirePrivilege refuses to build images without root, which would lose
// file ownership.
func (s *Store) requirePrivilege(op string) error {
	if os.Geteuid() != 0 && !s.allowUnprivileged {
		return fmt.Errorf("%s: must run as root to preserve file ownership in the image", op)
	}
	return nil
}

// commit hashes the finished ext4 file at tmpPath, moves it into the blob
// store (read-only) and records it under name.
func (s *Store) commit(ctx context.Context, name, source, tmpPath string) (Image, error) {
	return s.storeBlob(ctx, name, source, tmpPath, true)
}

// storeBlob moves the ext4 file at tmpPath into the blob store (keeping an
// existing blob of the same digest) and, with record, names it in the
// index.
func (s *Store) storeBlob(ctx context.Context, name, source, tmpPath string, record bool) (Image, error) {
	f, err := os.Open(tmpPath)
	if err != nil {
		return Image{}, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return Image{}, err
	}
	digest, size, err := hashReader(ctx, f)
	if err != nil {
		return Image{}, fmt.Errorf("hash image: %w", err)
	}
	if err := os.Chmod(tmpPath, 0o444); err != nil {
		return Image{}, err
	}
	img := Image{Name: name, Digest: digest, Size: size, Created: s.now().UTC(), Source: source}

	unlock, err := s.lock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	bdir := filepath.Join(s.dir, blobsDir)
	if err := os.MkdirAll(bdir, 0o755); err != nil {
		return Image{}, err
	}
	dst := s.blobPath(digest)
	if _, err := os.Lstat(dst); err == nil {
		// Same bytes already stored (content-addressed): keep the old file.
		if err := os.Remove(tmpPath); err != nil {
			return Image{}, err
		}
	} else {
		if err := os.Rename(tmpPath, dst); err != nil {
			return Image{}, err
		}
		if err := syncDir(bdir); err != nil {
			return Image{}, err
		}
	}
	if !record {
		return img, nil
	}
	if err := s.idx.PutImage(ctx, img); err != nil {
		return Image{}, fmt.Errorf("record image: %w", err)
	}
	return img, nil
}

// CommitTree makes an ext4 image of the directory tree dir (which it only
// reads; symlinks are copied, never followed) and stores it as a blob that
// no name refers to: the caller keeps its digest (a gvisor template's
// image) and keeps it from Prune (inUse). Needs root.
func (s *Store) CommitTree(ctx context.Context, dir, source string) (Image, error) {
	if err := s.requirePrivilege("make an image"); err != nil {
		return Image{}, err
	}
	stage, err := s.stagingDir("tree-")
	if err != nil {
		return Image{}, err
	}
	defer s.removeStaging(stage)
	ext4 := filepath.Join(stage, "image.ext4")
	if _, err := mkfsExt4(ctx, dir, ext4); err != nil {
		return Image{}, err
	}
	return s.storeBlob(ctx, "", source, ext4, false)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeAll removes path like os.RemoveAll, first making directories
// writable where a read-only directory (from an image) blocks removal by a
// non-root user.
func removeAll(path string) error {
	err := os.RemoveAll(path)
	if err == nil || os.Geteuid() == 0 {
		return err
	}
	_ = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(path)
}

// progressMu serialises progress lines: layers download concurrently, and
// a caller's writer need not be safe for concurrent use.
var progressMu sync.Mutex

// progressf writes one progress line with the time elapsed since start.
func progressf(w io.Writer, start time.Time, format string, args ...any) {
	if w == nil {
		return
	}
	line := fmt.Sprintf("%s (%.1fs)\n", fmt.Sprintf(format, args...), time.Since(start).Seconds())
	progressMu.Lock()
	defer progressMu.Unlock()
	_, _ = io.WriteString(w, line)
}

// humanBytes formats n for progress lines.
func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
