package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func unpackEntries(t *testing.T, root string, lim Limits, entries ...ent) (unpackStats, error) {
	t.Helper()
	return unpack(t.Context(), bytes.NewReader(tarOf(t, entries...)), root,
		unpackOptions{limits: lim, chown: os.Geteuid() == 0})
}

// sandbox returns an empty root to unpack into, next to an "outside"
// directory holding a file that no entry may touch.
func sandbox(t *testing.T) (root, outside string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 || readFile(t, outside, "secret") != "secret" {
			t.Errorf("outside dir changed: %v", ents)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(outside, "secret"), &st); err != nil || st.Nlink != 1 {
			t.Errorf("outside/secret gained links: nlink %d, %v", st.Nlink, err)
		}
		_ = removeAll(root)
	})
	return root, outside
}

func TestUnpackTree(t *testing.T) {
	t.Parallel()
	root, _ := sandbox(t)
	st, err := unpackEntries(t, root, DefaultLimits,
		dir("./"),
		dir("usr/"), dir("usr/bin/"),
		ent{name: "usr/bin/su", body: "su", mode: 0o4755},
		ent{name: "usr/bin/wall", body: "wall", mode: 0o2755, gid: 5},
		ent{name: "deep/implicit/parent/file", body: "p", mode: 0o640},
		symlink("usr/bin/sh", "dash"),
		symlink("lib64", "/usr/lib64"),
		hardlink("usr/bin/su2", "usr/bin/su"),
		ent{name: "home/", typ: tar.TypeDir, mode: 0o1777},
		ent{name: "home/u", body: "u", mode: 0o600, uid: 1000, gid: 1001},
		ent{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		file("ro/inside", "still written"),
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		ent{name: "fifo", typ: tar.TypeFifo, mode: 0o644},
		ent{name: "caps", body: "ping", mode: 0o755, pax: map[string]string{
			"SCHILY.xattr.user.test": "v", "SCHILY.xattr.trusted.evil": "x",
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if st.skipped != 2 || st.hardlinks != 1 || st.symlinks != 2 || st.files != 6 {
		t.Errorf("stats = %+v", st)
	}
	mode := func(rel string) fs.FileMode {
		fi, err := os.Lstat(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode()
	}
	if m := mode("usr/bin/su"); m&fs.ModeSetuid == 0 || m.Perm() != 0o755 {
		t.Errorf("su mode %v", m)
	}
	if m := mode("usr/bin/wall"); m&fs.ModeSetgid == 0 {
		t.Errorf("wall mode %v", m)
	}
	if m := mode("home"); m&fs.ModeSticky == 0 || m.Perm() != 0o777 {
		t.Errorf("home mode %v", m)
	}
	if m := mode("ro"); m.Perm() != 0o555 || readFile(t, root, "ro/inside") != "still written" {
		t.Errorf("ro mode %v", m)
	}
	if m := mode("deep/implicit"); !m.IsDir() || m.Perm() != 0o755 {
		t.Errorf("implicit parent mode %v", m)
	}
	if l, _ := os.Readlink(filepath.Join(root, "lib64")); l != "/usr/lib64" {
		t.Errorf("lib64 -> %q", l)
	}
	if l, _ := os.Readlink(filepath.Join(root, "usr/bin/sh")); l != "dash" {
		t.Errorf("sh -> %q", l)
	}
	a, _ := os.Stat(filepath.Join(root, "usr/bin/su"))
	b, _ := os.Stat(filepath.Join(root, "usr/bin/su2"))
	if !os.SameFile(a, b) {
		t.Error("su2 is not a hard link to su")
	}
	if exists(root, "dev/null") || exists(root, "fifo") {
		t.Error("special files were created")
	}
	if fi, _ := os.Stat(filepath.Join(root, "usr/bin/su")); !fi.ModTime().Equal(testTime) {
		t.Errorf("mtime %v", fi.ModTime())
	}
	if fi, _ := os.Stat(filepath.Join(root, "usr")); !fi.ModTime().Equal(testTime) {
		t.Errorf("dir mtime %v (set before its children?)", fi.ModTime())
	}
	if m := mode("."); m.Perm() != 0o755 {
		t.Errorf("root mode %v", m)
	}
	buf := make([]byte, 16)
	if n, err := syscall.Getxattr(filepath.Join(root, "caps"), "user.test", buf); err == nil && string(buf[:n]) != "v" {
		t.Errorf("user.test = %q", buf[:n])
	}
	if _, err := syscall.Getxattr(filepath.Join(root, "caps"), "trusted.evil", buf); err == nil {
		t.Error("trusted.* xattr was applied")
	}
	if os.Geteuid() == 0 {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(root, "home/u"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 {
			t.Errorf("home/u owner %d:%d, %v", st.Uid, st.Gid, err)
		}
		if err := syscall.Lstat(filepath.Join(root, "usr/bin/wall"), &st); err != nil || st.Gid != 5 || st.Mode&syscall.S_ISGID == 0 {
			t.Errorf("wall owner/mode lost: gid %d mode %o", st.Gid, st.Mode)
		}
	}
}

func TestUnpackRefusesDotDot(t *testing.T) {
	t.Parallel()
	for _, tc := range [][]ent{
		{file("../escape", "x")},
		{file("a/../../escape", "x")},
		{dir("a/"), hardlink("a/h", "../outside/secret")},
	} {
		root, _ := sandbox(t)
		_, err := unpackEntries(t, root, DefaultLimits, tc...)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc[len(tc)-1].name, err)
		}
		if exists(filepath.Dir(root), "escape") {
			t.Errorf("%s: escaped", tc[0].name)
		}
	}
}

func TestUnpackAbsolutePathsStayInside(t *testing.T) {
	t.Parallel()
	root, outside := sandbox(t)
	_, err := unpackEntries(t, root, DefaultLimits,
		file(filepath.Join(outside, "pwned"), "x"), // absolute host path
		file("/etc/passwd", "root:x:0:0"),
	)
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, root, "etc/passwd") != "root:x:0:0" || readFile(t, root, filepath.Join(outside, "pwned")) != "x" {
		t.Fatal("absolute entries not placed under the root")
	}
}

func TestUnpackSymlinkParentsResolveInRoot(t *testing.T) {
	t.Parallel()
	root, outside := sandbox(t)
	_, err := unpackEntries(t, root, DefaultLimits,
		dir("etc/"),
		symlink("a", "/etc"),                     // absolute: the image's /etc
		file("a/passwd", "through a"),            // lands in root/etc/passwd
		symlink("b", "../../../../../../../etc"), // relative, climbing: still the image's /etc
		file("b/group", "through b"),
		symlink("out", outside), // absolute path of the host's outside dir
		dir(outside[1:]+"/"),    // ...which exists inside the root too
		file("out/pwned", "x"),  // lands in root/<outside>/pwned
		symlink("up", ".."),
		file("up/top", "top"), // ".." of the root is the root
	)
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, root, "etc/passwd") != "through a" || readFile(t, root, "etc/group") != "through b" ||
		readFile(t, root, outside[1:]+"/pwned") != "x" || readFile(t, root, "top") != "top" {
		t.Fatal("writes through symlinked parents did not land inside the root")
	}
	// Symlinks themselves are kept verbatim.
	if l, _ := os.Readlink(filepath.Join(root, "b")); l != "../../../../../../../etc" {
		t.Errorf("b -> %q", l)
	}
}

func TestUnpackDanglingSymlinkParent(t *testing.T) {
	t.Parallel()
	root, outside := sandbox(t)
	// outside/newdir does not exist anywhere; the parent cannot be created
	// through the symlink.
	_, err := unpackEntries(t, root, DefaultLimits,
		symlink("x", filepath.Join(outside, "newdir")),
		file("x/f", "x"),
	)
	if err == nil {
		t.Fatal("write through a dangling symlink parent succeeded")
	}
}

func TestUnpackReplacesFinalSymlink(t *testing.T) {
	t.Parallel()
	root, outside := sandbox(t)
	target := filepath.Join(outside, "secret")
	_, err := unpackEntries(t, root, DefaultLimits,
		symlink("f", target), file("f", "replaced"),
		symlink("d", outside), dir("d/"),
		symlink("h", target), file("real", "r"), hardlink("h", "real"),
		symlink("s", target), symlink("s", "/new"),
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"f", "d", "h"} {
		if fi, err := os.Lstat(filepath.Join(root, rel)); err != nil || fi.Mode()&fs.ModeSymlink != 0 {
			t.Errorf("%s is still a symlink (%v)", rel, err)
		}
	}
	if readFile(t, root, "f") != "replaced" {
		t.Error("f content")
	}
	if l, _ := os.Readlink(filepath.Join(root, "s")); l != "/new" {
		t.Errorf("s -> %q", l)
	}
}

func TestUnpackHardlinks(t *testing.T) {
	t.Parallel()
	root, outside := sandbox(t)
	st, err := unpackEntries(t, root, DefaultLimits,
		hardlink("early", "later"), // target comes later in the stream
		file("later", "L"),
		hardlink("abs", filepath.Join(outside, "secret")), // resolves in root: missing, skipped
		symlink("evil", outside),
		hardlink("via", "evil/secret"), // parent symlink resolves in root: missing, skipped
		symlink("sl", "/nowhere"),
		hardlink("hsl", "sl"), // links the symlink itself
	)
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, root, "early") != "L" {
		t.Error("deferred hard link missing")
	}
	if exists(root, "abs") || exists(root, "via") || st.skipped != 2 {
		t.Errorf("links to missing targets created; stats %+v", st)
	}
	if l, err := os.Readlink(filepath.Join(root, "hsl")); err != nil || l != "/nowhere" {
		t.Errorf("hsl -> %q, %v", l, err)
	}

	root2, _ := sandbox(t)
	if _, err := unpackEntries(t, root2, DefaultLimits, dir("d/"), hardlink("x", "d")); !errors.Is(err, ErrInvalid) {
		t.Errorf("hard link to a directory: err = %v", err)
	}
}

func TestUnpackLimits(t *testing.T) {
	t.Parallel()
	root, _ := sandbox(t)
	_, err := unpackEntries(t, root, Limits{MaxBytes: 10, MaxEntries: 100}, file("a", "12345"), file("b", "123456"))
	if !errors.Is(err, ErrLimit) {
		t.Errorf("bytes: err = %v", err)
	}
	root, _ = sandbox(t)
	_, err = unpackEntries(t, root, Limits{MaxBytes: 1 << 20, MaxEntries: 3}, dir("a/"), dir("b/"), dir("c/"), dir("d/"))
	if !errors.Is(err, ErrLimit) {
		t.Errorf("entries: err = %v", err)
	}
	if _, err := unpackEntries(t, root, Limits{}, file("a", "x")); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero limits: err = %v", err)
	}
}

func TestUnpackTruncatedStream(t *testing.T) {
	t.Parallel()
	root, _ := sandbox(t)
	b := tarOf(t, file("big", strings.Repeat("x", 4096)))
	_, err := unpack(t.Context(), bytes.NewReader(b[:1024]), root, unpackOptions{limits: DefaultLimits})
	if err == nil {
		t.Fatal("truncated tar accepted")
	}
}

func TestCleanEntryName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"./":            "",
		"/":             "",
		"./etc/passwd":  "etc/passwd",
		"/etc//passwd/": "etc/passwd",
		"a/./b":         "a/b",
	} {
		if got, err := cleanEntryName(in); err != nil || got != want {
			t.Errorf("cleanEntryName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "..", "../x", "a/../../x", "a/..", "x\x00y", strings.Repeat("a", 5000)} {
		if got, err := cleanEntryName(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("cleanEntryName(%q) = %q, %v; want ErrInvalid", bad, got, err)
		}
	}
}
