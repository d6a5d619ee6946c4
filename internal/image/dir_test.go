package image

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestDir extracts an ext4 blob into a read-only tree, once, for concurrent
// callers, and removes it.
func TestDir(t *testing.T) {
	testutil.RequireRoot(t)
	s := newTestStore(t)
	img := Image{Name: "t", Digest: "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	writeTestBlob(t, s, img)

	prepared := 0
	var mu sync.Mutex
	// prepare runs on every Dir; like gvisor.PrepareRoot it writes only
	// what is missing.
	prepare := func(root string) error {
		p := filepath.Join(root, "proc")
		if _, err := os.Lstat(p); err == nil {
			return nil
		}
		mu.Lock()
		prepared++
		mu.Unlock()
		return os.Mkdir(p, 0o755)
	}
	var wg sync.WaitGroup
	dirs := make([]string, 3)
	errs := make([]error, 3)
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = s.Dir(t.Context(), img, prepare) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil || dirs[i] != s.DirPath(img) {
			t.Fatalf("Dir %d = %q, %v", i, dirs[i], errs[i])
		}
	}
	if prepared != 1 {
		t.Errorf("prepare created its directory %d times, want 1", prepared)
	}
	d := dirs[0]
	if b, err := os.ReadFile(filepath.Join(d, "link")); err != nil || string(b) != "hi\n" {
		t.Errorf("read through link = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(d, "etc/hello")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode kept: %v, %v", fi, err)
	}
	for _, p := range []string{"proc"} {
		if _, err := os.Stat(filepath.Join(d, p)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(d, "lost+found")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lost+found: %v", err)
	}
	// Read-only even for root.
	if err := os.WriteFile(filepath.Join(d, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the tree = %v, want EROFS", err)
	}
	// A newer prepare adds what an older one did not: the tree's
	// read-only bind comes off for it and goes back on.
	newer := func(root string) error {
		if err := prepare(root); err != nil {
			return err
		}
		p := filepath.Join(root, "newer")
		if _, err := os.Lstat(p); err == nil {
			return nil
		}
		return os.Mkdir(p, 0o755)
	}
	if got, err := s.Dir(t.Context(), img, newer); err != nil || got != d {
		t.Fatalf("Dir with a newer prepare = %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(d, "newer")); err != nil {
		t.Errorf("the newer prepare's directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(d, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into the updated tree = %v, want EROFS", err)
	}
	ents, _ := os.ReadDir(filepath.Dir(d))
	for _, e := range ents {
		if e.IsDir() && e.Name() != filepath.Base(d) {
			t.Errorf("staging left behind: %s", e.Name())
		}
	}
	if err := s.RemoveDir(img); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after RemoveDir: %v", err)
	}
}

// writeTestBlob writes a small ext4 blob for img (etc/hello, and a link to
// it) into s; a cleanup removes img's extracted tree.
func writeTestBlob(t *testing.T, s *Store, img Image) {
	t.Helper()
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "etc/hello"), []byte("hi\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("etc/hello", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(s.blobPath(img.Digest)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := mkfsExt4(t.Context(), src, s.blobPath(img.Digest)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.RemoveDir(img) })
}

// TestRemoveAndPruneTakeTrees: removing an image's last name removes its
// extracted tree with its blob, and Prune removes trees that no name
// refers to unless they are in use.
func TestRemoveAndPruneTakeTrees(t *testing.T) {
	testutil.RequireRoot(t)
	s := newTestStore(t)
	named := Image{Name: "named", Digest: "sha256:" + strings.Repeat("1", 64)}
	orphan := Image{Name: "orphan", Digest: "sha256:" + strings.Repeat("2", 64)}
	for _, img := range []Image{named, orphan} {
		writeTestBlob(t, s, img)
		if _, err := s.Dir(t.Context(), img, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.idx.PutImage(t.Context(), named); err != nil {
		t.Fatal(err)
	}
	// The orphan's tree is in use: Prune keeps it, and keeps the named one.
	inUse := true
	if _, err := s.Prune(t.Context(), func(d string) bool { return inUse && d == orphan.Digest }); err != nil {
		t.Fatal(err)
	}
	for _, img := range []Image{named, orphan} {
		if _, err := os.Stat(s.DirPath(img)); err != nil {
			t.Fatalf("Prune removed %s's tree: %v", img.Name, err)
		}
	}
	inUse = false
	removed, err := s.Prune(t.Context(), func(string) bool { return inUse })
	if err != nil || !slices.Contains(removed, orphan.Digest) {
		t.Fatalf("Prune = %v, %v; want the orphan's digest", removed, err)
	}
	if _, err := os.Stat(s.DirPath(orphan)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("orphan tree after Prune: %v", err)
	}
	if err := s.Remove(t.Context(), "named"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.DirPath(named)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree after Remove: %v", err)
	}
}
