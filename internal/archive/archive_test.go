package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// ent is one entry of a tar built by mkTar.
type ent struct {
	typ  byte
	name string
	body string
	link string
	mode int64
}

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode, ModTime: time.Unix(1_600_000_000, 0)}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// snapshot lists every path under dir with its type, mode and content (or
// link target), to prove that a refused archive changed nothing there.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			v += " -> " + l
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExtractHostile: archives that try to write outside the destination
// fail with ErrInvalid, and nothing outside the destination changes (the
// side that would be harmed is checked, not only the error).
func TestExtractHostile(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ents []ent
		// plant runs on the destination before the extraction.
		plant func(t *testing.T, dest, outside string)
	}{
		{name: "dotdot", ents: []ent{{typ: tar.TypeReg, name: "../escape", body: "x"}}},
		{name: "dotdot inside", ents: []ent{{typ: tar.TypeReg, name: "a/../../escape", body: "x"}}},
		{name: "absolute", ents: []ent{{typ: tar.TypeReg, name: "/escape", body: "x"}}},
		{name: "absolute dir", ents: []ent{{typ: tar.TypeDir, name: "/tmp/escape/"}}},
		{name: "symlink dotdot then file", ents: []ent{
			{typ: tar.TypeSymlink, name: "up", link: ".."},
			{typ: tar.TypeReg, name: "up/escape", body: "x"},
		}},
		{name: "absolute symlink then file", ents: []ent{
			{typ: tar.TypeSymlink, name: "abs", link: "OUTSIDE"},
			{typ: tar.TypeReg, name: "abs/escape", body: "x"},
		}},
		{name: "symlink then dir through it", ents: []ent{
			{typ: tar.TypeSymlink, name: "up", link: "../outside"},
			{typ: tar.TypeDir, name: "up/newdir/"},
		}},
		{name: "symlink then symlink through it", ents: []ent{
			{typ: tar.TypeSymlink, name: "up", link: "../outside"},
			{typ: tar.TypeSymlink, name: "up/escape", link: "/etc/passwd"},
		}},
		{name: "nested symlink chain", ents: []ent{
			{typ: tar.TypeDir, name: "d/"},
			{typ: tar.TypeSymlink, name: "d/l1", link: "../l2"},
			{typ: tar.TypeSymlink, name: "l2", link: "../outside"},
			{typ: tar.TypeReg, name: "d/l1/escape", body: "x"},
		}},
		{name: "planted symlink in the destination", ents: []ent{
			{typ: tar.TypeReg, name: "planted/escape", body: "x"},
		}, plant: func(t *testing.T, dest, outside string) {
			if err := os.Symlink(outside, filepath.Join(dest, "planted")); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "hard link outside", ents: []ent{{typ: tar.TypeLink, name: "hl", link: "../outside/secret"}}},
		{name: "hard link absolute", ents: []ent{{typ: tar.TypeLink, name: "hl", link: "/etc/passwd"}}},
		{name: "hard link through a symlink", ents: []ent{
			{typ: tar.TypeSymlink, name: "up", link: "../outside"},
			{typ: tar.TypeLink, name: "hl", link: "up/secret"},
		}},
		{name: "hard link to a file the archive did not make", ents: []ent{
			{typ: tar.TypeLink, name: "hl", link: "existing"},
		}, plant: func(t *testing.T, dest, _ string) {
			if err := os.WriteFile(filepath.Join(dest, "existing"), []byte("mine"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "hard link to a directory", ents: []ent{
			{typ: tar.TypeDir, name: "d/"},
			{typ: tar.TypeLink, name: "hl", link: "d"},
		}},
		{name: "char device", ents: []ent{{typ: tar.TypeChar, name: "null"}}},
		{name: "block device", ents: []ent{{typ: tar.TypeBlock, name: "sda"}}},
		{name: "fifo", ents: []ent{{typ: tar.TypeFifo, name: "p"}}},
		{name: "long name", ents: []ent{{typ: tar.TypeReg, name: strings.Repeat("a/", 2100) + "f", body: "x"}}},
		{name: "long component", ents: []ent{{typ: tar.TypeReg, name: strings.Repeat("a", 256), body: "x"}}},
		{name: "too deep", ents: []ent{{typ: tar.TypeReg, name: strings.Repeat("a/", MaxDepth) + "f", body: "x"}}},
		{name: "file over directory", ents: []ent{
			{typ: tar.TypeDir, name: "d/"},
			{typ: tar.TypeReg, name: "d", body: "x"},
		}},
		{name: "directory over file", ents: []ent{
			{typ: tar.TypeReg, name: "f", body: "x"},
			{typ: tar.TypeDir, name: "f/"},
		}},
		{name: "file as the destination", ents: []ent{{typ: tar.TypeReg, name: ".", body: "x"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			parent := t.TempDir()
			outside := filepath.Join(parent, "outside")
			dest := filepath.Join(parent, "dest")
			for _, d := range []string{outside, dest} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("canary"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.plant != nil {
				tc.plant(t, dest, outside)
			}
			for i := range tc.ents {
				tc.ents[i].link = strings.ReplaceAll(tc.ents[i].link, "OUTSIDE", outside)
			}
			before := snapshot(t, outside)
			beforeParent, _ := os.ReadDir(parent)
			_, err := Extract(t.Context(), bytes.NewReader(mkTar(t, tc.ents...)), dest, ExtractOptions{})
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("Extract = %v, want ErrInvalid", err)
			}
			t.Log(err)
			if after := snapshot(t, outside); !mapsEqual(before, after) {
				t.Errorf("outside changed:\nbefore %v\nafter  %v", before, after)
			}
			if afterParent, _ := os.ReadDir(parent); len(afterParent) != len(beforeParent) {
				t.Errorf("the destination's parent has %d entries, had %d", len(afterParent), len(beforeParent))
			}
			if _, err := os.Lstat("/escape"); err == nil {
				t.Fatal("/escape exists")
			}
			if tmp, _ := filepath.Glob(filepath.Join(dest, "**", tempPrefix+"*")); len(tmp) != 0 {
				t.Errorf("temporary entries left: %v", tmp)
			}
		})
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestExtractReplacesSymlinkNotTarget: a file entry whose name is an
// existing symlink (from the archive or planted) replaces the link; the
// link's target, outside the destination, stays as it was.
func TestExtractReplacesSymlinkNotTarget(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	dest := filepath.Join(parent, "dest")
	secret := filepath.Join(parent, "secret")
	if err := os.Mkdir(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("canary"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dest, "planted")); err != nil {
		t.Fatal(err)
	}
	tb := mkTar(t,
		ent{typ: tar.TypeSymlink, name: "evil", link: "../secret"},
		ent{typ: tar.TypeReg, name: "evil", body: "mine"},
		ent{typ: tar.TypeReg, name: "planted", body: "mine too"},
	)
	st, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "canary" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	for name, want := range map[string]string{"evil": "mine", "planted": "mine too"} {
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s: %v, %v; want a regular file", name, fi, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, name)); string(b) != want {
			t.Errorf("%s = %q, want %q", name, b, want)
		}
	}
	if st.Files != 2 || st.Symlinks != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestExtractInsideSymlink: a symlink that stays inside the destination
// may be written through (os.Root resolves it there).
func TestExtractInsideSymlink(t *testing.T) {
	t.Parallel()
	dest := t.TempDir()
	tb := mkTar(t,
		ent{typ: tar.TypeDir, name: "real/", mode: 0o755},
		ent{typ: tar.TypeSymlink, name: "alias", link: "real"},
		ent{typ: tar.TypeReg, name: "alias/f", body: "x"},
	)
	if _, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "real", "f")); err != nil || string(b) != "x" {
		t.Fatalf("real/f: %q, %v", b, err)
	}
}

func TestExtractLimits(t *testing.T) {
	t.Parallel()
	tb := mkTar(t,
		ent{typ: tar.TypeReg, name: "a", body: "12345"},
		ent{typ: tar.TypeReg, name: "b", body: "12345"},
		ent{typ: tar.TypeReg, name: "c", body: "12345"},
	)
	for _, l := range []Limits{{MaxEntries: 2}, {MaxBytes: 9}} {
		dest := t.TempDir()
		if _, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{Limits: l}); !errors.Is(err, ErrLimit) {
			t.Errorf("limits %+v: %v, want ErrLimit", l, err)
		}
	}
	dest := t.TempDir()
	if _, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{Limits: Limits{MaxEntries: 3, MaxBytes: 15}}); err != nil {
		t.Errorf("at the limits: %v", err)
	}
	// Parents made for an entry count as entries.
	deep := mkTar(t, ent{typ: tar.TypeReg, name: "a/b/c/d/f", body: "x"})
	if _, err := Extract(t.Context(), bytes.NewReader(deep), t.TempDir(), ExtractOptions{Limits: Limits{MaxEntries: 3}}); !errors.Is(err, ErrLimit) {
		t.Errorf("4 parents and a file under 3 entries: %v, want ErrLimit", err)
	}
	// MaxDepth directories deep is fine.
	deep = mkTar(t, ent{typ: tar.TypeReg, name: strings.Repeat("a/", MaxDepth-1) + "f", body: "x"})
	if st, err := Extract(t.Context(), bytes.NewReader(deep), t.TempDir(), ExtractOptions{}); err != nil || st.Dirs != MaxDepth-1 {
		t.Errorf("a name %d deep: %+v, %v", MaxDepth, st, err)
	}
	// A truncated archive is refused.
	if _, err := Extract(t.Context(), bytes.NewReader(tb[:515]), t.TempDir(), ExtractOptions{}); err == nil {
		t.Error("truncated archive extracted")
	}
}

func TestCleanName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"a": "a", "./a/b/": "a/b", ".": "", "./": "", "a//b/./c": "a/b/c",
	} {
		if got, err := CleanName(in); err != nil || got != want {
			t.Errorf("CleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/a", "..", "a/..", "a/../b", "a\x00b", strings.Repeat("x", 4097)} {
		if _, err := CleanName(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("CleanName(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

// mkTree builds the tree that the round trip archives.
func mkTree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "sub", "deep"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "plain.txt"), []byte("hello\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "sub", "private"), []byte("secret"), 0o600))
	must(os.WriteFile(filepath.Join(dir, "sub", "deep", "empty"), nil, 0o640))
	must(os.WriteFile(filepath.Join(dir, "suid"), []byte("x"), 0o755))
	must(os.Chmod(filepath.Join(dir, "suid"), 0o755|fs.ModeSetuid))
	must(os.Symlink("sub/private", filepath.Join(dir, "rel-link")))
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "abs-link")))
	must(os.Symlink("nowhere", filepath.Join(dir, "dangling")))
	must(os.Link(filepath.Join(dir, "plain.txt"), filepath.Join(dir, "sub", "hard.txt")))
	must(syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	must(os.Mkdir(filepath.Join(dir, "sticky"), 0o755))
	must(os.Chmod(filepath.Join(dir, "sticky"), 0o777|fs.ModeSticky))
	must(os.Mkdir(filepath.Join(dir, "ro"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "ro", "inside"), []byte("ro"), 0o444))
	must(os.Chmod(filepath.Join(dir, "ro"), 0o555))
	mt := time.Unix(1_500_000_000, 0)
	must(os.Chtimes(filepath.Join(dir, "plain.txt"), mt, mt))
	must(os.Chtimes(filepath.Join(dir, "sub", "deep"), mt, mt))
}

// TestWriteExtractRoundTrip: modes (but set-id bits), symlinks (as they
// are), hard links, mtimes and read-only directories survive Write then
// Extract; a FIFO is skipped.
func TestWriteExtractRoundTrip(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "src")
	mkTree(t, src)
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(src, "ro"), 0o755) })
	var b bytes.Buffer
	ws, err := Write(t.Context(), &b, src, WriteOptions{Name: "top"})
	if err != nil {
		t.Fatal(err)
	}
	if ws.Skipped != 1 || ws.Links != 1 || ws.Symlinks != 3 {
		t.Errorf("write stats %+v", ws)
	}
	names := tarNames(t, b.Bytes())
	if !slices.Contains(names, "top/") || !slices.Contains(names, "top/sub/deep/empty") || slices.Contains(names, "top/fifo") {
		t.Errorf("names %v", names)
	}
	for _, n := range names {
		if n != "top/" && !strings.HasPrefix(n, "top/") {
			t.Errorf("entry %q is not under top/", n)
		}
	}

	dest := t.TempDir()
	es, err := Extract(t.Context(), bytes.NewReader(b.Bytes()), dest, ExtractOptions{From: "top", To: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dest, "copy")
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(out, "ro"), 0o755) })
	if es.Entries() != ws.Entries() || es.Bytes != ws.Bytes {
		t.Errorf("extract stats %+v, write stats %+v", es, ws)
	}
	modes := map[string]fs.FileMode{
		"plain.txt": 0o644, "run.sh": 0o755, "sub/private": 0o600, "sub/deep/empty": 0o640,
		"suid": 0o755, "ro": fs.ModeDir | 0o555, "ro/inside": 0o444, "sticky": fs.ModeDir | fs.ModeSticky | 0o777,
		"rel-link": fs.ModeSymlink, "abs-link": fs.ModeSymlink, "dangling": fs.ModeSymlink,
	}
	for name, want := range modes {
		fi, err := os.Lstat(filepath.Join(out, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got := fi.Mode()
		if got&fs.ModeSymlink != 0 {
			got = fs.ModeSymlink
		}
		if got != want {
			t.Errorf("%s: mode %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string]string{"rel-link": "sub/private", "abs-link": "/etc/passwd", "dangling": "nowhere"} {
		if l, err := os.Readlink(filepath.Join(out, name)); err != nil || l != want {
			t.Errorf("%s -> %q, %v; want %q", name, l, err, want)
		}
	}
	a, err1 := os.Stat(filepath.Join(out, "plain.txt"))
	h, err2 := os.Stat(filepath.Join(out, "sub", "hard.txt"))
	if err1 != nil || err2 != nil || !os.SameFile(a, h) {
		t.Errorf("plain.txt and sub/hard.txt are not one file: %v %v", err1, err2)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "sub", "private")); string(b) != "secret" {
		t.Errorf("sub/private = %q", b)
	}
	for _, name := range []string{"plain.txt", "sub/deep"} {
		if fi, err := os.Stat(filepath.Join(out, name)); err != nil || !fi.ModTime().Equal(time.Unix(1_500_000_000, 0)) {
			t.Errorf("%s mtime: %v, %v", name, fi.ModTime(), err)
		}
	}
	if _, err := os.Lstat(filepath.Join(out, "fifo")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fifo: %v, want it skipped", err)
	}

	// Contents only (no Name): entries are relative to src.
	b.Reset()
	if _, err := Write(t.Context(), &b, filepath.Join(src, "sub"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := tarNames(t, b.Bytes()); !slices.Equal(got, []string{"deep/", "deep/empty", "hard.txt", "private"}) {
		t.Errorf("contents names %v", got)
	}
	// A single file.
	b.Reset()
	if _, err := Write(t.Context(), &b, filepath.Join(src, "run.sh"), WriteOptions{Name: "run.sh"}); err != nil {
		t.Fatal(err)
	}
	if got := tarNames(t, b.Bytes()); !slices.Equal(got, []string{"run.sh"}) {
		t.Errorf("file names %v", got)
	}
}

// TestExtractRebase: with From set, a name outside From is refused; To ""
// puts From's contents in the destination itself.
func TestExtractRebase(t *testing.T) {
	t.Parallel()
	tb := mkTar(t, ent{typ: tar.TypeDir, name: "src/", mode: 0o750}, ent{typ: tar.TypeReg, name: "src/a", body: "a"})
	dest := t.TempDir()
	if _, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{From: "src"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "a")); err != nil || string(b) != "a" {
		t.Errorf("a: %q, %v", b, err)
	}
	if fi, err := os.Stat(dest); err != nil || fi.Mode().Perm() == 0o750 {
		t.Errorf("the destination took the archive's mode without RootMeta: %v, %v", fi, err)
	}
	tb = mkTar(t, ent{typ: tar.TypeDir, name: "src/", mode: 0o750}, ent{typ: tar.TypeReg, name: "src/a", body: "a"})
	dest = t.TempDir()
	if _, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{From: "src", RootMeta: true}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dest); err != nil || fi.Mode().Perm() != 0o750 || !fi.ModTime().Equal(time.Unix(1_600_000_000, 0)) {
		t.Errorf("RootMeta: the destination has %v, %v", fi, err)
	}
	tb = mkTar(t, ent{typ: tar.TypeReg, name: "src/a", body: "a"}, ent{typ: tar.TypeReg, name: "other", body: "o"})
	if _, err := Extract(t.Context(), bytes.NewReader(tb), t.TempDir(), ExtractOptions{From: "src"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("an entry outside From: %v, want ErrInvalid", err)
	}
	tb = mkTar(t, ent{typ: tar.TypeReg, name: "srcx", body: "a"})
	if _, err := Extract(t.Context(), bytes.NewReader(tb), t.TempDir(), ExtractOptions{From: "src"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a sibling with From as prefix: %v, want ErrInvalid", err)
	}
}

func TestExtractChown(t *testing.T) {
	t.Parallel()
	testutil.NeedRoot(t) // chown
	dest := t.TempDir()
	tb := mkTar(t,
		ent{typ: tar.TypeReg, name: "implicit/f", body: "x", mode: 0o4755},
		ent{typ: tar.TypeSymlink, name: "l", link: "implicit/f"},
		ent{typ: tar.TypeDir, name: "d/"},
	)
	if _, err := Extract(t.Context(), bytes.NewReader(tb), dest, ExtractOptions{Chown: true, UID: 1234, GID: 5678}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"implicit", "implicit/f", "l", "d"} {
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("%s owned by %d:%d", name, st.Uid, st.Gid)
		}
	}
	if fi, _ := os.Stat(filepath.Join(dest, "implicit", "f")); fi.Mode() != 0o755 {
		t.Errorf("implicit/f mode %v, want 0755 without setuid", fi.Mode())
	}
}

func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	return names
}
