package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// dirsDir holds the extracted trees (the gvisor runtime's image form):
// images/dirs/sha256-<hex>/, each a read-only bind mount of itself.
const dirsDir = "dirs"

// DirPath returns where Dir puts img's tree, or "" for a bad digest. It
// does not say whether the tree exists.
func (s *Store) DirPath(img Image) string {
	if !validDigest(img.Digest) {
		return ""
	}
	p := filepath.Join(s.dir, dirsDir, blobPrefix+strings.TrimPrefix(img.Digest, "sha256:"))
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// Dir returns img's root tree as a directory, extracting its ext4 blob the
// first time: the blob is loop-mounted read-only, copied with `cp -a` into
// a staging dir, prepare (if not nil) runs on the copy (the gvisor runtime
// passes gvisor.PrepareRoot, which adds its mount points), and the copy is
// renamed into place. prepare also runs on every later Dir of the tree, so
// that a tree an older airlock made gets what a newer prepare adds: it must
// be idempotent and write nothing to a tree that has what it adds. The tree is then made a read-only bind mount of
// itself, so nothing on the host can write it by accident; Dir re-applies
// that after a reboot. One tree per digest, shared by every sandbox of the
// image; the gvisor runtime writes each sandbox's changes elsewhere.
//
// Safe for concurrent use, also across processes (a lock file per digest).
// Needs root (mount).
func (s *Store) Dir(ctx context.Context, img Image, prepare func(root string) error) (string, error) {
	final := s.DirPath(img)
	if final == "" {
		return "", fmt.Errorf("image dir: %w: bad digest", ErrInvalid)
	}
	blob := s.Path(img)
	if _, err := os.Stat(blob); err != nil {
		return "", fmt.Errorf("image dir: blob: %w", err)
	}
	parent := filepath.Dir(final)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("image dir: %w", err)
	}
	unlock, err := lockPath(final + ".lock")
	if err != nil {
		return "", fmt.Errorf("image dir: %w", err)
	}
	defer unlock()

	if _, err := os.Stat(final); err == nil {
		if err := reprepare(final, prepare); err != nil {
			return "", err
		}
		return final, ensureReadOnly(final)
	}
	staging, err := os.MkdirTemp(parent, ".tmp-")
	if err != nil {
		return "", fmt.Errorf("image dir: %w", err)
	}
	defer func() { _ = os.RemoveAll(staging) }()
	mnt := filepath.Join(staging, "mnt")
	tree := filepath.Join(staging, "tree")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return "", fmt.Errorf("image dir: %w", err)
	}
	if err := run(ctx, "mount", "-t", "ext4", "-o", "ro,loop,noload", blob, mnt); err != nil {
		return "", fmt.Errorf("image dir: %w", err)
	}
	cpErr := run(ctx, "cp", "-a", "--", mnt, tree)
	if err := unix.Unmount(mnt, 0); err != nil {
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if cpErr != nil {
		return "", fmt.Errorf("image dir: %w", cpErr)
	}
	_ = os.RemoveAll(filepath.Join(tree, "lost+found"))
	if prepare != nil {
		if err := prepare(tree); err != nil {
			return "", fmt.Errorf("image dir: %w", err)
		}
	}
	if err := os.Rename(tree, final); err != nil {
		return "", fmt.Errorf("image dir: %w", err)
	}
	s.log.Info("image dir extracted", "digest", img.Digest, "dir", final)
	return final, ensureReadOnly(final)
}

// RemoveDir removes img's tree, if any (unmounting its read-only bind).
// The caller makes sure no sandbox uses it.
func (s *Store) RemoveDir(img Image) error {
	final := s.DirPath(img)
	if final == "" {
		return fmt.Errorf("image dir: %w: bad digest", ErrInvalid)
	}
	if _, err := os.Stat(final); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := lockPath(final + ".lock")
	if err != nil {
		return fmt.Errorf("remove image dir: %w", err)
	}
	defer unlock()
	for isMountPoint(final) {
		if err := unix.Unmount(final, 0); err != nil {
			return fmt.Errorf("remove image dir: unmount: %w", err)
		}
	}
	if err := os.RemoveAll(final); err != nil {
		return fmt.Errorf("remove image dir: %w", err)
	}
	_ = os.Remove(final + ".lock")
	return nil
}

// ensureReadOnly bind-mounts dir read-only onto itself unless it already is.
func ensureReadOnly(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Flags&unix.ST_RDONLY != 0 && isMountPoint(dir) {
		return nil
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("image dir: bind: %w", err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", dir, "", flags, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("image dir: remount read-only: %w", err)
	}
	return nil
}

// reprepare runs prepare on an existing tree, which writes nothing if the
// tree has what it adds. A tree made by an older airlock may lack
// something newer one adds: then its read-only bind is taken off while
// prepare adds it (ensureReadOnly puts it back; sandboxes already running
// keep their own view).
func reprepare(dir string, prepare func(root string) error) error {
	if prepare == nil {
		return nil
	}
	err := prepare(dir)
	for i := 0; i < 4 && errors.Is(err, unix.EROFS) && isMountPoint(dir); i++ {
		if uerr := unix.Unmount(dir, unix.MNT_DETACH); uerr != nil {
			return fmt.Errorf("image dir: unmount to update: %w", uerr)
		}
		err = prepare(dir)
	}
	if err != nil {
		return fmt.Errorf("image dir: prepare: %w", err)
	}
	return nil
}

// isMountPoint reports whether dir is the root of a mount (it appears in
// mountinfo, binds included).
func isMountPoint(dir string) bool { return slices.Contains(statedir.MountsUnder(dir), dir) }

// lockPath takes an exclusive flock on path (created if missing).
func lockPath(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

func run(ctx context.Context, name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, tail(out.String(), 512))
	}
	return nil
}
