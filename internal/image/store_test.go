package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestValidName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"base", "python-3.12-slim", "a", "0", "x_y.z", strings.Repeat("a", 64)} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", ".x", "_x", "Base", "a b", "a/b", "../x", strings.Repeat("a", 65), "é"} {
		if err := ValidName(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidName(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestDefaultName(t *testing.T) {
	t.Parallel()
	for ref, want := range map[string]string{
		"python:3.12-slim":                          "python-3.12-slim",
		"docker.io/library/python":                  "python-latest",
		"ghcr.io/org/team/tool_x:V1.2":              "tool_x-v1.2",
		"localhost:5000/a/b:c":                      "b-c",
		"alpine@sha256:" + strings.Repeat("ab", 32): "alpine-abababababab",
	} {
		got, err := DefaultName(ref)
		if err != nil || got != want {
			t.Errorf("DefaultName(%q) = %q, %v; want %q", ref, got, err, want)
		}
	}
	if _, err := DefaultName("UPPER:x"); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad ref: %v", err)
	}
	long := "r/" + strings.Repeat("a", 80) + ":t"
	if got, err := DefaultName(long); err != nil || len(got) != 64 {
		t.Errorf("long ref: %q, %v", got, err)
	}
}

func TestMemIndex(t *testing.T) {
	t.Parallel()
	var m MemIndex
	ctx := t.Context()
	if _, err := m.GetImage(ctx, "x"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if err := m.DeleteImage(ctx, "x"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	a := Image{Name: "a", Digest: "sha256:" + strings.Repeat("1", 64)}
	if err := m.PutImage(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, err := m.GetImage(ctx, "a"); err != nil || got != a {
		t.Fatal(got, err)
	}
	if l, _ := m.ListImages(ctx); len(l) != 1 {
		t.Fatal(l)
	}
	if err := m.DeleteImage(ctx, "a"); err != nil {
		t.Fatal(err)
	}
}

// fakeBlob commits a small file as image name and returns it.
func fakeBlob(t *testing.T, s *Store, name, content string) Image {
	t.Helper()
	stage, err := s.stagingDir("test-")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(stage, "image.ext4")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := s.commit(t.Context(), name, "test", p)
	if err != nil {
		t.Fatal(err)
	}
	s.removeStaging(stage)
	return img
}

func TestStoreGetListRemove(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	ctx := t.Context()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s.now = func() time.Time { return now }

	_, err := s.Get(ctx, "nope")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "airlock image ls") {
		t.Fatalf("Get unknown: %v", err)
	}
	if _, err := s.Get(ctx, "No Pe"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Get bad name: %v", err)
	}

	a := fakeBlob(t, s, "b-second", "same bytes")
	b := fakeBlob(t, s, "a-first", "same bytes")
	c := fakeBlob(t, s, "c", "other bytes")
	if a.Digest != b.Digest || a.Digest == c.Digest || !a.Created.Equal(now) || a.Size != int64(len("same bytes")) {
		t.Fatalf("images %+v %+v %+v", a, b, c)
	}
	p := s.Path(a)
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o444 || !filepath.IsAbs(p) {
		t.Fatalf("blob %s: %v %v", p, fi, err)
	}
	if s.Path(Image{Digest: "sha256:../../etc"}) != "" {
		t.Fatal("Path accepted a bad digest")
	}

	list, err := s.List(ctx)
	if err != nil || len(list) != 3 || list[0].Name != "a-first" || list[2].Name != "c" {
		t.Fatalf("List = %+v, %v", list, err)
	}

	// Two names share a blob: removing one keeps it.
	if err := s.Remove(ctx, "a-first"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("shared blob removed: %v", err)
	}
	if err := s.Remove(ctx, "b-second"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("blob kept after its last name went: %v", err)
	}
	if err := s.Remove(ctx, "b-second"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Remove twice: %v", err)
	}

	// Renaming "c" to new content orphans its blob until Prune.
	old := s.Path(c)
	fakeBlob(t, s, "c", "newer bytes")
	removed, err := s.Prune(ctx, func(d string) bool { return false })
	if err != nil || len(removed) != 1 || removed[0] != c.Digest {
		t.Fatalf("Prune = %v, %v", removed, err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("orphan blob kept")
	}
	cur, _ := s.Get(ctx, "c")
	if _, err := os.Stat(s.Path(cur)); err != nil {
		t.Fatal("named blob pruned")
	}
	inUse := fakeBlob(t, s, "x", "x")
	if err := s.idx.DeleteImage(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if removed, _ := s.Prune(ctx, func(d string) bool { return d == inUse.Digest }); len(removed) != 0 {
		t.Fatalf("Prune removed an in-use blob: %v", removed)
	}
}

func TestStoreVerify(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	img := fakeBlob(t, s, "v", "good")
	if err := s.Verify(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	p := s.Path(img)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("evil"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(t.Context(), img); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify after tampering: %v", err)
	}
	if err := s.Verify(t.Context(), Image{Name: "x", Digest: "md5:1"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad digest: %v", err)
	}
}

func TestStoreRequiresRootToBuild(t *testing.T) {
	t.Parallel()
	s := NewStore(t.TempDir(), NewMemIndex(), nil)
	err := s.requirePrivilege("import")
	if (os.Geteuid() == 0) != (err == nil) {
		t.Fatalf("requirePrivilege as uid %d: %v", os.Geteuid(), err)
	}
}
