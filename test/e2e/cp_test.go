package e2e

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// mkCopyTree builds the tree TestCopyDirectories copies: modes, a nested
// directory, a read-only directory, an empty one, relative and absolute
// symlinks and a hard link.
func mkCopyTree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "deep", "er"), 0o750))
	must(os.MkdirAll(filepath.Join(dir, "empty"), 0o700))
	must(os.MkdirAll(filepath.Join(dir, "ro"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "a.txt"), []byte("alpha\n"), 0o640))
	must(os.WriteFile(filepath.Join(dir, "bin", "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "deep", "er", "x"), bytes.Repeat([]byte("x"), 300<<10), 0o600))
	must(os.WriteFile(filepath.Join(dir, "ro", "f"), []byte("read only\n"), 0o444))
	must(os.Chmod(filepath.Join(dir, "ro"), 0o555))
	must(os.Symlink("bin/run.sh", filepath.Join(dir, "link")))
	must(os.Symlink("/etc/hostname", filepath.Join(dir, "abs")))
	must(os.Link(filepath.Join(dir, "a.txt"), filepath.Join(dir, "deep", "hard")))
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dir, "ro"), 0o755) })
}

// describe lists a tree as "path mode [-> target | size]" lines, sorted,
// for comparing a copy with its original.
func describe(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		line := rel + " " + fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case fi.Mode().IsRegular():
			line += " " + sha256File(t, p)[:12]
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func hostileTar(t *testing.T, hs ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hs {
		body := "pwned\n"
		h.Mode = 0o644
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

// TestCopyDirectories: cp -r in and out of a sandbox, locally and through
// the API server: modes, symlinks, hard links and contents survive the
// round trip, docker cp's rules say where things land, a tar goes through
// stdin and stdout, and hostile archives put nothing outside the
// destination in the guest.
func TestCopyDirectories(t *testing.T) {
	e := setup(t)
	id := e.create(t)
	host := t.TempDir()
	src := filepath.Join(host, "proj")
	if err := os.Mkdir(src, 0o750); err != nil {
		t.Fatal(err)
	}
	mkCopyTree(t, src)
	want := describe(t, src)

	// In: /root exists, so the directory lands as /root/proj.
	e.must(t, "cp", "-r", src, id+":/root")
	got := e.must(t, "exec", id, "--", "sh", "-c",
		"cd /root/proj && stat -c '%n %a %U' . a.txt bin/run.sh deep deep/er/x empty ro ro/f && "+
			"readlink link abs && bin/run.sh && [ $(stat -c %i a.txt) = $(stat -c %i deep/hard) ] && echo linked")
	for _, line := range []string{". 750 root", "a.txt 640 root", "bin/run.sh 755 root", "deep 750 root", "deep/er/x 600 root",
		"empty 700 root", "ro 555 root", "ro/f 444 root", "bin/run.sh\n/etc/hostname", "ran", "linked"} {
		if !strings.Contains(got, line) {
			t.Errorf("in the guest, missing %q in:\n%s", line, got)
		}
	}
	// Out: a missing local directory is made and gets the contents, with
	// the source directory's mode; a set-id bit in the guest is not kept.
	e.must(t, "exec", id, "--", "chmod", "u+s", "/root/proj/bin/run.sh")
	out := filepath.Join(host, "out")
	e.must(t, "cp", "-r", id+":/root/proj", out)
	if got := describe(t, out); !slices.Equal(got, want) {
		t.Errorf("round trip differs:\n got %q\nwant %q", got, want)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(out, "ro"), 0o755) })
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("the made directory: %v, %v; want mode 0750", fi, err)
	}
	a, _ := os.Stat(filepath.Join(out, "a.txt"))
	h, _ := os.Stat(filepath.Join(out, "deep", "hard"))
	if a == nil || h == nil || !os.SameFile(a, h) {
		t.Error("a.txt and deep/hard are not one file after the copy out")
	}
	// "/." copies the contents into an existing directory.
	e.must(t, "exec", id, "--", "mkdir", "/tmp/dot")
	e.must(t, "cp", "-r", src+"/.", id+":/tmp/dot")
	if got := e.must(t, "exec", id, "--", "cat", "/tmp/dot/a.txt"); got != "alpha\n" {
		t.Errorf("/tmp/dot/a.txt = %q", got)
	}
	// A tar on stdout, entries named proj/...
	r := e.run(t, nil, "cp", "-r", id+":/root/proj", "-")
	if r.code != 0 {
		t.Fatalf("cp -r to stdout: exit %d: %s", r.code, r.stderr)
	}
	var names []string
	tr := tar.NewReader(strings.NewReader(r.stdout))
	for hd, err := tr.Next(); err == nil; hd, err = tr.Next() {
		names = append(names, hd.Name)
	}
	if len(names) != len(want)+1 || names[0] != "proj/" {
		t.Errorf("the tar on stdout has %v", names)
	}

	// Hostile archives on stdin: refused, nothing outside the destination.
	for name, tb := range map[string][]byte{
		"dotdot":   hostileTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "../airlock-escape"}),
		"absolute": hostileTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "/etc/airlock-pwned"}),
		"symlink then file": hostileTar(t,
			tar.Header{Typeflag: tar.TypeSymlink, Name: "up", Linkname: "/etc"},
			tar.Header{Typeflag: tar.TypeReg, Name: "up/airlock-pwned"}),
		"relative symlink then file": hostileTar(t,
			tar.Header{Typeflag: tar.TypeSymlink, Name: "up", Linkname: "../.."},
			tar.Header{Typeflag: tar.TypeReg, Name: "up/etc/airlock-pwned"}),
		"hard link out": hostileTar(t, tar.Header{Typeflag: tar.TypeLink, Name: "shadow", Linkname: "../../etc/shadow"}),
		"device":        hostileTar(t, tar.Header{Typeflag: tar.TypeBlock, Name: "vda", Devmajor: 254}),
	} {
		r := e.run(t, bytes.NewReader(tb), "cp", "-r", "-", id+":/tmp/hostile/in")
		if r.code == 0 || !strings.Contains(r.stderr, "invalid") {
			t.Errorf("%s: exit %d, stderr %q; want a refusal", name, r.code, r.stderr)
		}
	}
	landed := e.must(t, "exec", id, "--", "sh", "-c", `for p in /etc/airlock-pwned /tmp/airlock-escape /tmp/hostile/airlock-escape \
		/tmp/hostile/in/shadow /tmp/hostile/in/vda /tmp/hostile/in/up/airlock-pwned /tmp/hostile/in/up/etc/airlock-pwned; do
		[ -e "$p" ] && echo "LANDED $p"; done; true`)
	if landed != "" {
		t.Errorf("hostile archives wrote:\n%s", landed)
	}

	// Through the API server: the same copies with AIRLOCK_HOST.
	s := startServe(t, e)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-cp-r"))
	rr := remoteRun(t, e, s, key, nil, "create")
	if rr.code != 0 {
		t.Fatalf("remote create: exit %d: %s", rr.code, rr.stderr)
	}
	rid := strings.TrimSpace(rr.stdout)
	t.Cleanup(func() { remoteRun(t, e, s, key, nil, "rm", rid) })
	if rr := remoteRun(t, e, s, key, nil, "cp", "-r", src, rid+":/srv/new"); rr.code != 0 {
		t.Fatalf("remote cp -r in: exit %d: %s", rr.code, rr.stderr)
	}
	rout := filepath.Join(host, "remote")
	if err := os.Mkdir(rout, 0o755); err != nil {
		t.Fatal(err)
	}
	if rr := remoteRun(t, e, s, key, nil, "cp", "-r", rid+":/srv/new", rout); rr.code != 0 {
		t.Fatalf("remote cp -r out: exit %d: %s", rr.code, rr.stderr)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(rout, "new", "ro"), 0o755) })
	if got := describe(t, filepath.Join(rout, "new")); !slices.Equal(got, want) {
		t.Errorf("remote round trip differs:\n got %q\nwant %q", got, want)
	}
	if rr := remoteRun(t, e, s, key, nil, "events", "--sandbox", rid); !strings.Contains(rr.stdout, `"action":"file.extract"`) {
		t.Errorf("no file.extract event: %s", rr.stdout)
	}
	// Nothing a copy out wrote is set-id or owned by anyone but us.
	for _, dir := range []string{out, rout} {
		checkOwnedAndPlain(t, dir)
	}
}

// checkOwnedAndPlain fails for anything under dir that is set-id or owned
// by another uid than ours.
func checkOwnedAndPlain(t *testing.T, dir string) {
	t.Helper()
	_ = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if fi, lerr := os.Lstat(p); err == nil && lerr == nil {
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
				t.Errorf("%s: uid %d, mode %v", p, st.Uid, fi.Mode())
			}
		}
		return nil
	})
}
