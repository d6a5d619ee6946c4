package dockerfile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// writeTree makes files under dir: a name ending in "/" is a directory, a
// value starting with "->" a symlink to the rest.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(body, "->"):
			err = os.Symlink(body[2:], p)
		default:
			err = os.WriteFile(p, []byte(body), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func openContext(t *testing.T, dir string) *Context {
	t.Helper()
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatalf("OpenContext: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// step parses "FROM base\n"+src and returns its last step.
func step(t *testing.T, src string) Step {
	t.Helper()
	p := mustParse(t, "FROM base\n"+src, nil)
	return p.Steps[len(p.Steps)-1]
}

// tarEntry is what a test sees of one entry.
type tarEntry struct {
	typ  byte
	mode int64
	body string // file data or link target
}

// copyTar runs CopyTar and reads the stream back.
func copyTar(t *testing.T, c *Context, s Step) (string, []string, map[string]tarEntry, []string) {
	t.Helper()
	var buf bytes.Buffer
	dir, top, err := c.CopyTar(s, &buf)
	if err != nil {
		t.Fatalf("CopyTar(%s): %v", s.Text, err)
	}
	got := map[string]tarEntry{}
	var order []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner %d:%d %q:%q, want 0:0", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		e := tarEntry{typ: h.Typeflag, mode: h.Mode}
		switch h.Typeflag {
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			e.body = string(b)
		case tar.TypeSymlink, tar.TypeLink:
			e.body = h.Linkname
		}
		got[h.Name] = e
		order = append(order, h.Name)
	}
	return dir, top, got, order
}

func names(m map[string]tarEntry) []string { return slices.Sorted(maps.Keys(m)) }

func TestCopyTar(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"a.txt":          "A",
		"b.txt":          "BB",
		"c.md":           "C",
		"src/main.py":    "print(1)",
		"src/lib/x.py":   "x",
		"src/empty/":     "",
		"sub/one/f.py":   "1",
		"sub/two/f.py":   "2",
		"sub/two/g.txt":  "g",
		"Dockerfile":     "FROM base",
		"nested/deep/z":  "z",
		"nested/other/y": "y",
	})
	c := openContext(t, dir)
	for _, tc := range []struct {
		name  string
		src   string
		dir   string
		top   []string
		files map[string]string // name -> body ("/" suffix: a directory)
	}{
		{
			name: "directory copies its contents",
			src:  "COPY src /app",
			dir:  "/app", top: []string{"/app/empty", "/app/lib", "/app/main.py"},
			files: map[string]string{"empty/": "", "lib/": "", "lib/x.py": "x", "main.py": "print(1)"},
		},
		{
			name: "file to a file path",
			src:  "COPY a.txt /etc/app.conf",
			dir:  "/etc", top: []string{"/etc/app.conf"},
			files: map[string]string{"app.conf": "A"},
		},
		{
			name: "file into a directory",
			src:  "WORKDIR /srv\nCOPY a.txt .",
			dir:  "/srv", top: []string{"/srv/a.txt"},
			files: map[string]string{"a.txt": "A"},
		},
		{
			name: "several sources make a directory",
			src:  "COPY a.txt src/lib /opt",
			dir:  "/opt", top: []string{"/opt/a.txt", "/opt/x.py"},
			files: map[string]string{"a.txt": "A", "x.py": "x"},
		},
		{
			name: "wildcard",
			src:  "COPY *.txt /w",
			dir:  "/w", top: []string{"/w/a.txt", "/w/b.txt"},
			files: map[string]string{"a.txt": "A", "b.txt": "BB"},
		},
		{
			name: "wildcard in a directory component",
			src:  "COPY sub/*/f.py /w/",
			dir:  "/w", top: []string{"/w/f.py"},
			files: map[string]string{"f.py": "2"}, // both named f.py: the later one wins on extraction
		},
		{
			name: "wildcard matching a directory copies its contents",
			src:  "COPY nest?d /n/",
			dir:  "/n", top: []string{"/n/deep", "/n/other"},
			files: map[string]string{"deep/": "", "deep/z": "z", "other/": "", "other/y": "y"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			gotDir, top, got, _ := copyTar(t, c, step(t, tc.src))
			if gotDir != tc.dir {
				t.Errorf("dir = %q, want %q", gotDir, tc.dir)
			}
			if !reflect.DeepEqual(top, tc.top) {
				t.Errorf("top = %q, want %q", top, tc.top)
			}
			want := map[string]tarEntry{}
			for name, body := range tc.files {
				if strings.HasSuffix(name, "/") {
					want[name] = tarEntry{typ: tar.TypeDir, mode: 0o755}
				} else {
					want[name] = tarEntry{typ: tar.TypeReg, mode: 0o644, body: body}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("entries =\n%v\nwant\n%v", got, want)
			}
		})
	}
}

func TestCopyTarChmodAndOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"d/e/f": "f", "d/l": "->e/f"})
	c := openContext(t, dir)
	_, _, got, order := copyTar(t, c, step(t, "COPY --chmod=0750 d /x"))
	want := map[string]tarEntry{
		"e/":  {typ: tar.TypeDir, mode: 0o750},
		"e/f": {typ: tar.TypeReg, mode: 0o750, body: "f"},
		"l":   {typ: tar.TypeSymlink, mode: 0o777, body: "e/f"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries = %v, want %v", got, want)
	}
	if want := []string{"e/", "e/f", "l"}; !reflect.DeepEqual(order, want) {
		t.Errorf("order = %q, want %q (directories before their entries)", order, want)
	}
}

func TestCopyTarDockerignore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		".dockerignore":     "# comment\n*.log\n/secret\nbuild\n!build/keep.txt\n**/*.tmp\n",
		"Dockerfile":        "FROM base",
		"app.py":            "app",
		"debug.log":         "log",
		"secret/key":        "k",
		"build/out.bin":     "bin",
		"build/keep.txt":    "keep",
		"build/sub/x.txt":   "x",
		"pkg/a.tmp":         "tmp",
		"pkg/a.py":          "a",
		"pkg/deeper/b.tmp":  "tmp",
		"pkg/deeper/b.py":   "b",
		"notsecret/key.txt": "fine",
	})
	c := openContext(t, dir)
	_, _, got, order := copyTar(t, c, step(t, "COPY . /app/"))
	want := []string{
		".dockerignore", "Dockerfile", "app.py",
		"build/", "build/keep.txt",
		"notsecret/", "notsecret/key.txt",
		"pkg/", "pkg/a.py", "pkg/deeper/", "pkg/deeper/b.py",
	}
	if !reflect.DeepEqual(names(got), want) {
		t.Errorf("entries = %q, want %q", names(got), want)
	}
	if i, j := indexOf(order, "build/"), indexOf(order, "build/keep.txt"); i < 0 || i > j {
		t.Errorf("build/ comes after its entry: %q", order)
	}
	// Named sources that are ignored, and wildcards, leave them out too.
	for _, src := range []string{"COPY debug.log /x", "COPY secret/key /x", "COPY build/out.bin /x"} {
		_, _, err := c.CopyTar(step(t, src), io.Discard)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "excluded by .dockerignore") {
			t.Errorf("%s: err = %v, want an exclusion", src, err)
		}
	}
	if _, _, err := c.CopyTar(step(t, "COPY *.log /x/"), io.Discard); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "matches no file") {
		t.Errorf("COPY *.log: err = %v, want matches no file", err)
	}
	_, _, got, _ = copyTar(t, c, step(t, "COPY build /b"))
	if !reflect.DeepEqual(names(got), []string{"keep.txt"}) {
		t.Errorf("ignored directory with an exception: entries %q", names(got))
	}
	_, _, got, _ = copyTar(t, c, step(t, "COPY build/keep.txt /k"))
	if !reflect.DeepEqual(names(got), []string{"k"}) {
		t.Errorf("re-included file: entries %q", names(got))
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestCopyTarSymlinksStayInside(t *testing.T) {
	t.Parallel()
	outside := t.TempDir()
	writeTree(t, outside, map[string]string{"secret": "SECRET", "dir/file": "SECRET"})
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"tree/rel":   "->" + filepath.Join("..", "..", filepath.Base(outside), "secret"),
		"tree/abs":   "->" + filepath.Join(outside, "secret"),
		"tree/ok":    "->../inside",
		"inside":     "in",
		"out":        "->" + filepath.Join(outside, "dir"),
		"link-alone": "->" + filepath.Join(outside, "secret"),
		"rel-out":    "->" + filepath.Join("..", filepath.Base(outside), "secret"),
		"in-file":    "->inside",
		"in-dir":     "->sub/d",
		"sub/d/f":    "F",
		"sub/d/l":    "->f",
	})
	c := openContext(t, dir)
	_, _, got, _ := copyTar(t, c, step(t, "COPY tree /t"))
	want := map[string]tarEntry{
		"abs": {typ: tar.TypeSymlink, mode: 0o777, body: filepath.Join(outside, "secret")},
		"ok":  {typ: tar.TypeSymlink, mode: 0o777, body: "../inside"},
		"rel": {typ: tar.TypeSymlink, mode: 0o777, body: filepath.Join("..", "..", filepath.Base(outside), "secret")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries = %v, want %v", got, want)
	}
	// A symlink source is copied as a link, not followed.
	dest, top, got, _ := copyTar(t, c, step(t, "COPY link-alone /etc/x"))
	if dest != "/etc" || !reflect.DeepEqual(top, []string{"/etc/x"}) || got["x"].typ != tar.TypeSymlink || got["x"].body != filepath.Join(outside, "secret") {
		t.Errorf("COPY link-alone: dir %q top %q entries %v", dest, top, got)
	}
	// A source symlink that stays inside is followed, as docker does (the
	// symlinks below it are not); one that leaves is copied as a link.
	_, _, got, _ = copyTar(t, c, step(t, "COPY in-file /x"))
	if e := got["x"]; e.typ != tar.TypeReg || e.body != "in" {
		t.Errorf("COPY in-file: entries %v", got)
	}
	_, _, got, _ = copyTar(t, c, step(t, "COPY in-dir /y"))
	if want := (map[string]tarEntry{"f": {tar.TypeReg, 0o644, "F"}, "l": {tar.TypeSymlink, 0o777, "f"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("COPY in-dir: entries %v, want %v", got, want)
	}
	_, _, got, _ = copyTar(t, c, step(t, "COPY rel-out /z"))
	if e := got["z"]; e.typ != tar.TypeSymlink {
		t.Errorf("COPY rel-out: entries %v, want the link", got)
	}
	// A path through a symlink that leaves the context is refused.
	for _, src := range []string{"COPY out/file /x", "COPY out/* /x/"} {
		var buf bytes.Buffer
		_, _, err := c.CopyTar(step(t, src), &buf)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", src, err)
		}
		if bytes.Contains(buf.Bytes(), []byte("SECRET")) {
			t.Errorf("%s: the stream holds the outside file's data", src)
		}
	}
}

func TestCopyTarRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"a": "a"})
	c := openContext(t, dir)
	for _, tc := range []struct {
		name string
		s    Step
		msg  string
	}{
		{"dot dot", Step{Line: 4, Kind: "COPY", Sources: []string{"../a"}, Dest: "/x"}, "outside the build context"},
		{"dot dot inside", Step{Line: 4, Kind: "COPY", Sources: []string{"a/../../a"}, Dest: "/x"}, "outside the build context"},
		{"missing", Step{Line: 4, Kind: "COPY", Sources: []string{"nope"}, Dest: "/x"}, "not found"},
		{"no match", Step{Line: 4, Kind: "COPY", Sources: []string{"*.none"}, Dest: "/x"}, "matches no file"},
		{"bad pattern", Step{Line: 4, Kind: "COPY", Sources: []string{"[a"}, Dest: "/x"}, "syntax error"},
		{"relative dest", Step{Line: 4, Kind: "COPY", Sources: []string{"a"}, Dest: "x"}, "not absolute"},
		{"not a copy", Step{Line: 4, Kind: "RUN", Argv: []string{"true"}}, "copies no files"},
	} {
		_, _, err := c.CopyTar(tc.s, io.Discard)
		le, ok := errors.AsType[*LineError](err)
		if !errors.Is(err, errdefs.ErrInvalid) || !ok || le.Line != 4 || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want ErrInvalid on line 4 with %q", tc.name, err, tc.msg)
		}
	}
}

func TestCopyTarByteLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "big"))
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: the limit is checked on sizes before any byte is read.
	if err := f.Truncate(MaxStepBytes + 1); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	c := openContext(t, dir)
	var buf bytes.Buffer
	_, _, err = c.CopyTar(step(t, "COPY big /big"), &buf)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "Dockerfile:2:") {
		t.Fatalf("err = %v, want ErrResourceExhausted naming line 2", err)
	}
	if buf.Len() != 0 {
		t.Errorf("%d bytes written before the refusal", buf.Len())
	}
}

// tarGz builds a gzip-compressed tar of hdrs (bodies for regular files).
func tarGz(t *testing.T, entries []tar.Header, bodies map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range entries {
		body := bodies[h.Name]
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestAddArchive(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	archive := tarGz(t, []tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./pkg/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "./pkg/run.sh", Typeflag: tar.TypeReg, Mode: 0o4755},
		{Name: "pkg/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		{Name: "pkg/hard", Typeflag: tar.TypeLink, Linkname: "./pkg/run.sh"},
		{Name: "README", Typeflag: tar.TypeReg, Mode: 0o600},
	}, map[string]string{"./pkg/run.sh": "#!/bin/sh\n", "README": "read me"})
	if err := os.WriteFile(filepath.Join(dir, "vendor.tar.gz"), archive, 0o644); err != nil {
		t.Fatal(err)
	}
	writeTree(t, dir, map[string]string{"notes.gz": "not really gzip", "plain.txt": "plain"})
	c := openContext(t, dir)

	dest, top, got, _ := copyTar(t, c, step(t, "ADD vendor.tar.gz /opt/vendor"))
	if dest != "/opt/vendor" || !reflect.DeepEqual(top, []string{"/opt/vendor/pkg", "/opt/vendor/README"}) {
		t.Errorf("dir %q top %q", dest, top)
	}
	want := map[string]tarEntry{
		"pkg/":       {typ: tar.TypeDir, mode: 0o755},
		"pkg/run.sh": {typ: tar.TypeReg, mode: 0o4755, body: "#!/bin/sh\n"},
		"pkg/link":   {typ: tar.TypeSymlink, body: "/etc/passwd"},
		"pkg/hard":   {typ: tar.TypeLink, body: "pkg/run.sh"},
		"README":     {typ: tar.TypeReg, mode: 0o600, body: "read me"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("entries =\n%v\nwant\n%v", got, want)
	}
	// COPY never extracts; ADD of a non-archive copies it as it is.
	_, _, got, _ = copyTar(t, c, step(t, "COPY vendor.tar.gz /v.tgz"))
	if e := got["v.tgz"]; e.typ != tar.TypeReg || e.body != string(archive) {
		t.Errorf("COPY of an archive: entries %v", names(got))
	}
	for _, src := range []string{"notes.gz", "plain.txt"} {
		_, _, got, _ = copyTar(t, c, step(t, "ADD "+src+" /d/"))
		if e, ok := got[src]; !ok || e.typ != tar.TypeReg {
			t.Errorf("ADD %s: entries %v", src, got)
		}
	}
	// --chmod applies to the extracted entries.
	_, _, got, _ = copyTar(t, c, step(t, "ADD --chmod=0700 vendor.tar.gz /v/"))
	if got["README"].mode != 0o700 || got["pkg/"].mode != 0o700 {
		t.Errorf("--chmod: entries %v", got)
	}
}

func TestAddArchiveRefusesEscapes(t *testing.T) {
	t.Parallel()
	for _, h := range []tar.Header{
		{Name: "../evil", Typeflag: tar.TypeReg},
		{Name: "a/../../evil", Typeflag: tar.TypeReg},
		{Name: "/etc/evil", Typeflag: tar.TypeReg},
		{Name: "hard", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"},
		{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		{Name: "fifo", Typeflag: tar.TypeFifo},
	} {
		dir := t.TempDir()
		b := tarGz(t, []tar.Header{{Name: "ok", Typeflag: tar.TypeReg}, h}, map[string]string{"ok": "ok", h.Name: "evil"})
		if err := os.WriteFile(filepath.Join(dir, "x.tgz"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		c := openContext(t, dir)
		_, _, err := c.CopyTar(step(t, "ADD x.tgz /x"), io.Discard)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), "Dockerfile:2: ") {
			t.Errorf("entry %q: err = %v, want ErrInvalid on line 2", h.Name, err)
		}
		p := mustParse(t, "FROM base\nADD x.tgz /x\n", nil)
		if err := p.Keys(c, "base"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("entry %q: Keys = %v, want ErrInvalid", h.Name, err)
		}
	}
}

// keysOf parses src, computes keys on the context dir and returns them.
func keysOf(t *testing.T, dir, base, src string, args map[string]string) []string {
	t.Helper()
	p := mustParse(t, src, args)
	c := openContext(t, dir)
	if err := p.Keys(c, base); err != nil {
		t.Fatalf("Keys: %v", err)
	}
	var out []string
	for _, s := range p.Steps {
		if !strings.HasPrefix(s.Key, "sha256:") || len(s.Key) != len("sha256:")+64 {
			t.Fatalf("key %q", s.Key)
		}
		out = append(out, s.Key)
	}
	return out
}

// firstChange is the index of the first key that differs, or -1.
func firstChange(t *testing.T, a, b []string) int {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d keys vs %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			for j := i; j < len(a); j++ {
				if a[j] == b[j] {
					t.Errorf("key %d changed but key %d did not", i, j)
				}
			}
			return i
		}
	}
	return -1
}

func TestKeys(t *testing.T) {
	t.Parallel()
	files := map[string]string{
		"requirements.txt": "flask==3.0\n",
		"app/main.py":      "print('hi')\n",
		"app/static/x.css": "body{}",
		"app/link":         "->main.py",
		".dockerignore":    "**/*.pyc\n", // docker patterns are anchored: "*.pyc" is only the top
		"app/cache.pyc":    "junk",
	}
	src := `FROM base
ARG PIP=pip3
ENV A=1
COPY requirements.txt /srv/
RUN $PIP install -r /srv/requirements.txt
WORKDIR /srv/app
COPY app .
ENV B=2
CMD ["python3", "main.py"]
`
	one, two := t.TempDir(), t.TempDir()
	writeTree(t, one, files)
	writeTree(t, two, files)
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{"requirements.txt", "app/main.py", "app/static", "app"} {
		if err := os.Chtimes(filepath.Join(two, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	base := keysOf(t, one, "sha256:base", src, nil)
	if got := keysOf(t, two, "sha256:base", src, nil); !reflect.DeepEqual(got, base) {
		t.Errorf("equal content, other mtimes: keys differ\n%q\n%q", got, base)
	}
	if i := firstChange(t, base, keysOf(t, one, "sha256:other", src, nil)); i != 0 {
		t.Errorf("another base changed keys from step %d, want 0", i)
	}

	// Each edit changes its step's key and every later one, no earlier one.
	for _, tc := range []struct {
		name  string
		src   string
		args  map[string]string
		edit  func(dir string)
		first int
	}{
		{name: "late CMD", src: strings.Replace(src, `"main.py"`, `"app.py"`, 1), first: 7},
		{name: "late ENV", src: strings.Replace(src, "ENV B=2", "ENV B=3", 1), first: 6},
		{name: "early ENV", src: strings.Replace(src, "ENV A=1", "ENV A=0", 1), first: 1},
		{name: "RUN text", src: strings.Replace(src, "install -r", "install -U -r", 1), first: 3},
		{name: "build arg", src: src, args: map[string]string{"PIP": "pip"}, first: 0},
		{name: "file in the second COPY", edit: func(d string) { writeTree(t, d, map[string]string{"app/main.py": "print('bye')\n"}) }, first: 5},
		{name: "new file in the second COPY", edit: func(d string) { writeTree(t, d, map[string]string{"app/new.py": ""}) }, first: 5},
		{name: "mode in the second COPY", edit: func(d string) { _ = os.Chmod(filepath.Join(d, "app/main.py"), 0o755) }, first: 5},
		{name: "link target", edit: func(d string) {
			_ = os.Remove(filepath.Join(d, "app/link"))
			writeTree(t, d, map[string]string{"app/link": "->static"})
		}, first: 5},
		{name: "requirements", edit: func(d string) { writeTree(t, d, map[string]string{"requirements.txt": "flask==3.1\n"}) }, first: 2},
		{name: "ignored file", edit: func(d string) { writeTree(t, d, map[string]string{"app/cache.pyc": "other junk"}) }, first: -1},
		{name: "file outside every COPY", edit: func(d string) { writeTree(t, d, map[string]string{"README": "x"}) }, first: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := t.TempDir()
			writeTree(t, d, files)
			if tc.edit != nil {
				tc.edit(d)
			}
			s := src
			if tc.src != "" {
				s = tc.src
			}
			if got := firstChange(t, base, keysOf(t, d, "sha256:base", s, tc.args)); got != tc.first {
				t.Errorf("first changed key = %d, want %d", got, tc.first)
			}
		})
	}
}

func TestKeysNeedAContext(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "FROM base\nRUN true\n", nil)
	if err := p.Keys(nil, "b"); err != nil || p.Steps[0].Key == "" {
		t.Errorf("Keys without COPY: %v %q", err, p.Steps[0].Key)
	}
	p = mustParse(t, "FROM base\nRUN true\nCOPY a /a\n", nil)
	if err := p.Keys(nil, "b"); !errors.Is(err, errdefs.ErrInvalid) || p.Steps[0].Key != "" {
		t.Errorf("Keys(nil) with COPY = %v, key %q; want ErrInvalid and no key set", err, p.Steps[0].Key)
	}
}

func TestAddArchiveCompressions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"pkg.tar.bz2", "pkg.tar.xz"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := openContext(t, dir)
	_, top, got, _ := copyTar(t, c, step(t, "ADD pkg.tar.bz2 /opt/"))
	want := map[string]tarEntry{
		"d/":          {typ: tar.TypeDir, mode: 0o755},
		"d/hello.txt": {typ: tar.TypeReg, mode: 0o644, body: "hello\n"},
	}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(top, []string{"/opt/d"}) {
		t.Errorf("bzip2: top %q entries %v, want %v", top, got, want)
	}
	// xz is not in the standard library: refused rather than copied as
	// it is, since docker would have extracted it.
	_, _, err := c.CopyTar(step(t, "ADD pkg.tar.xz /opt/"), io.Discard)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "not extracted") {
		t.Errorf("xz: err = %v", err)
	}
	// COPY copies it as it is.
	_, _, got, _ = copyTar(t, c, step(t, "COPY pkg.tar.xz /opt/"))
	if got["pkg.tar.xz"].typ != tar.TypeReg {
		t.Errorf("COPY of xz: %v", names(got))
	}
}
