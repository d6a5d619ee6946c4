package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/archive"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

// dirFS is a sandbox whose guest filesystem is a host directory; tarOut,
// if set, is what readArchive sends instead of the real archive (a
// hostile guest).
type dirFS struct {
	root   string
	disk   int64
	tarOut []byte
}

func (d dirFS) kind(_ context.Context, p string) (guestKind, error) {
	fi, err := os.Lstat(filepath.Join(d.root, p))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return guestMissing, nil
	case err != nil:
		return 0, err
	case fi.IsDir():
		return guestDir, nil
	case fi.Mode().IsRegular():
		return guestFile, nil
	case fi.Mode()&fs.ModeSymlink != 0:
		return guestSymlink, nil
	}
	return guestOther, nil
}

func (d dirFS) writeArchive(ctx context.Context, dir string, r io.Reader) (guest.ArchiveResult, error) {
	p := filepath.Join(d.root, dir)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return guest.ArchiveResult{}, err
	}
	st, err := archive.Extract(ctx, r, p, archive.ExtractOptions{})
	return guest.ArchiveResult{Entries: int64(st.Entries()), Bytes: st.Bytes}, err
}

func (d dirFS) readArchive(ctx context.Context, p string, w io.Writer) error {
	if d.tarOut != nil {
		_, err := w.Write(d.tarOut)
		return err
	}
	_, err := archive.Write(ctx, w, filepath.Join(d.root, p), archive.WriteOptions{Name: path.Base(p)})
	return err
}

func (d dirFS) diskBytes(context.Context) (int64, error) { return d.disk, nil }

// tree lists the files and directories under dir as "name" (file, with
// its content after "=") and "name/" (directory).
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case e.IsDir():
			out = append(out, rel+"/")
		case e.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out = append(out, rel+"->"+l)
		default:
			b, _ := os.ReadFile(p)
			out = append(out, rel+"="+string(b))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mkSrc(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"sub"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("A"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "b"), []byte("B"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/b", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
}

// TestCopyTreeWhereThingsLand: docker cp's rules, both ways.
func TestCopyTreeWhereThingsLand(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	contents := []string{"a=A", "l->sub/b", "sub/", "sub/b=B"}

	// In: a missing DST is made and gets the contents; an existing one
	// gets the directory itself, or its contents with "/.".
	host := t.TempDir()
	src := filepath.Join(host, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	mkSrc(t, src)
	g := dirFS{root: t.TempDir(), disk: 1 << 20}
	if _, err := copyTreeIn(ctx, g, nil, nil, src, "/new"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(g.root, "new")); !slices.Equal(got, contents) {
		t.Errorf("into a missing dir: %v", got)
	}
	if _, err := copyTreeIn(ctx, g, nil, nil, src, "/new"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(g.root, "new", "src")); !slices.Equal(got, contents) {
		t.Errorf("into an existing dir: %v", got)
	}
	if fi, err := os.Stat(filepath.Join(g.root, "new", "src")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("the copied directory's mode: %v, %v", fi, err)
	}
	if err := os.Mkdir(filepath.Join(g.root, "dot"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := copyTreeIn(ctx, g, nil, nil, src+"/.", "/dot"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(g.root, "dot")); !slices.Equal(got, contents) {
		t.Errorf("src/. into an existing dir: %v", got)
	}
	if err := os.WriteFile(filepath.Join(g.root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := copyTreeIn(ctx, g, nil, nil, src, "/file"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("into a file: %v, want ErrInvalid", err)
	}
	if _, err := copyTreeIn(ctx, g, nil, nil, filepath.Join(src, "a"), "/x"); !errors.Is(err, errNotDir) {
		t.Errorf("a file source: %v, want errNotDir (plain cp)", err)
	}
	var tb bytes.Buffer
	if _, err := archive.Write(ctx, &tb, src, archive.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := copyTreeIn(ctx, g, &tb, nil, "-", "/stdin"); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(g.root, "stdin")); !slices.Equal(got, contents) {
		t.Errorf("a tar on stdin: %v", got)
	}

	// Out, the same rules.
	g = dirFS{root: t.TempDir(), disk: 1 << 20}
	if err := os.Mkdir(filepath.Join(g.root, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	mkSrc(t, filepath.Join(g.root, "app"))
	host = t.TempDir()
	out := filepath.Join(host, "out")
	if _, err := copyTreeOut(ctx, g, nil, nil, "/app", out); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, out); !slices.Equal(got, contents) {
		t.Errorf("out to a missing dir: %v", got)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("the made directory has mode %v (%v), want the source's 0750", fi.Mode(), err)
	}
	if _, err := copyTreeOut(ctx, g, nil, nil, "/app", out); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, filepath.Join(out, "app")); !slices.Equal(got, contents) {
		t.Errorf("out to an existing dir: %v", got)
	}
	dot := filepath.Join(host, "dot")
	if err := os.Mkdir(dot, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := copyTreeOut(ctx, g, nil, nil, "/app/.", dot); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, dot); !slices.Equal(got, contents) {
		t.Errorf("out /app/. to an existing dir: %v", got)
	}
	if _, err := copyTreeOut(ctx, g, nil, nil, "/app", filepath.Join(out, "a")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("out onto a file: %v, want ErrInvalid", err)
	}
	if _, err := copyTreeOut(ctx, g, nil, nil, "/app/a", filepath.Join(host, "x")); !errors.Is(err, errNotDir) {
		t.Errorf("out of a file: %v, want errNotDir (plain cp)", err)
	}
	if _, err := copyTreeOut(ctx, g, nil, nil, "/nope", filepath.Join(host, "x")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("out of a missing path: %v, want ErrNotFound", err)
	}
	var stdout bytes.Buffer
	if _, err := copyTreeOut(ctx, g, &stdout, nil, "/app", "-"); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&stdout)
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if !slices.Equal(names, []string{"app/", "app/a", "app/l", "app/sub/", "app/sub/b"}) {
		t.Errorf("the tar on stdout: %v", names)
	}

	// Progress goes to the writer it is given, and ends its line.
	var prog bytes.Buffer
	p := &progress{out: &prog}
	p.add(3 << 20)
	p.done()
	if !strings.HasSuffix(prog.String(), "3.0M copied\n") {
		t.Errorf("progress %q", prog.String())
	}
}

func hostileTar(t *testing.T, hs ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hs {
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		body := "pwned"
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte(body))
		}
	}
	_ = tw.Close()
	return b.Bytes()
}

// TestCopyTreeOutHostileGuest: a guest that sends names that climb out,
// absolute names, a symlink then a file through it, a device node, a name
// outside the path asked for, or more file data than its disk, gets an
// error, and nothing lands outside the destination (nor, when the copy
// made the destination and nothing was extracted, anything at all).
func TestCopyTreeOutHostileGuest(t *testing.T) {
	t.Parallel()
	// firstRefused: the first entry is refused, so a destination the copy
	// made is removed again.
	firstRefused := map[string]bool{"dotdot": true, "absolute": true, "hard link out": true, "device": true, "not under app": true}
	cases := map[string][]byte{
		"dotdot":   hostileTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "app/../../escape"}),
		"absolute": hostileTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "/tmp/airlock-cp-escape"}),
		"symlink then file": hostileTar(t,
			tar.Header{Typeflag: tar.TypeDir, Name: "app/"},
			tar.Header{Typeflag: tar.TypeSymlink, Name: "app/up", Linkname: "../.."},
			tar.Header{Typeflag: tar.TypeReg, Name: "app/up/escape"}),
		"absolute symlink then file": hostileTar(t,
			tar.Header{Typeflag: tar.TypeSymlink, Name: "app/tmp", Linkname: "/tmp"},
			tar.Header{Typeflag: tar.TypeReg, Name: "app/tmp/airlock-cp-escape"}),
		"hard link out": hostileTar(t, tar.Header{Typeflag: tar.TypeLink, Name: "app/h", Linkname: "../canary"}),
		"device":        hostileTar(t, tar.Header{Typeflag: tar.TypeChar, Name: "app/null", Devmajor: 1, Devminor: 3}),
		"not under app": hostileTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "other"}),
		"over the disk": hostileTar(t,
			tar.Header{Typeflag: tar.TypeReg, Name: "app/1"}, tar.Header{Typeflag: tar.TypeReg, Name: "app/2"}),
	}
	for name, tb := range cases {
		for _, existing := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				host := t.TempDir()
				canary := filepath.Join(host, "canary")
				if err := os.WriteFile(canary, []byte("canary"), 0o600); err != nil {
					t.Fatal(err)
				}
				dest := filepath.Join(host, "dest")
				if existing {
					if err := os.Mkdir(dest, 0o755); err != nil {
						t.Fatal(err)
					}
				}
				g := dirFS{root: t.TempDir(), disk: 8, tarOut: tb}
				if err := os.Mkdir(filepath.Join(g.root, "app"), 0o755); err != nil {
					t.Fatal(err)
				}
				_, err := copyTreeOut(t.Context(), g, nil, nil, "/app", dest)
				if !errors.Is(err, archive.ErrInvalid) && !errors.Is(err, archive.ErrLimit) {
					t.Errorf("copy out: %v, want ErrInvalid or ErrLimit", err)
				}
				var got []string
				for _, e := range tree(t, host) {
					if e != "canary=canary" && !strings.HasPrefix(e, "dest") {
						got = append(got, e)
					}
				}
				if len(got) != 0 {
					t.Errorf("outside the destination: %v", got)
				}
				if b, _ := os.ReadFile(canary); string(b) != "canary" {
					t.Errorf("canary = %q", b)
				}
				if _, err := os.Lstat("/tmp/airlock-cp-escape"); err == nil {
					t.Error("/tmp/airlock-cp-escape exists")
				}
				if _, err := os.Stat(dest); !existing && firstRefused[name] && !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the destination the copy made stays after a refused archive: %v", err)
				}
			})
		}
	}
}
