package image

import (
	"errors"
	"os"
	"path/filepath"
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
	img := Image{Name: "t", Digest: "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	if err := os.MkdirAll(filepath.Dir(s.blobPath(img.Digest)), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := mkfsExt4(t.Context(), src, s.blobPath(img.Digest)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.RemoveDir(img) })

	prepared := 0
	var mu sync.Mutex
	prepare := func(root string) error {
		mu.Lock()
		prepared++
		mu.Unlock()
		return os.Mkdir(filepath.Join(root, "proc"), 0o755)
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
		t.Errorf("prepare ran %d times, want 1", prepared)
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
