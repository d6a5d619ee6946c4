package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// ent is one tar entry for tests.
type ent struct {
	name string
	typ  byte // tar.TypeReg if zero
	body string
	link string
	mode int64
	uid  int
	gid  int
	pax  map[string]string
}

var testTime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

func dir(name string) ent        { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, body string) ent { return ent{name: name, body: body, mode: 0o644} }
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, link: target, mode: 0o777}
}
func hardlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeLink, link: target, mode: 0o644}
}

// tarOf encodes entries as an uncompressed tar stream.
func tarOf(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		h := &tar.Header{
			Name: e.name, Typeflag: typ, Linkname: e.link, Mode: e.mode,
			Uid: e.uid, Gid: e.gid, ModTime: testTime, PAXRecords: e.pax,
			Format: tar.FormatPAX,
		}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if typ == tar.TypeReg {
			if _, err := io.WriteString(tw, e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// layerOf makes a gzip-compressed image layer from entries.
func layerOf(t testing.TB, entries ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf stacks layers into a linux/amd64 image.
func imageOf(t testing.TB, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testImage has two layers exercising whiteouts and opaque directories:
//
//	layer 1: etc/a, etc/b, opaque/old, keep/x, del.txt, bin/su (setuid, uid 0), home/u/f (uid 1000)
//	layer 2: etc/a (changed), etc/.wh.b, opaque/.wh..wh..opq + opaque/new, .wh.del.txt, link -> etc/a
func testImage(t testing.TB) v1.Image {
	t.Helper()
	l1 := layerOf(t,
		dir("etc/"), file("etc/a", "a1"), file("etc/b", "b1"),
		dir("opaque/"), file("opaque/old", "old"),
		dir("keep/"), file("keep/x", "x"),
		file("del.txt", "delete me"),
		dir("bin/"), ent{name: "bin/su", body: "#!su", mode: 0o4755},
		dir("home/"), ent{name: "home/u/", typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1000},
		ent{name: "home/u/f", body: "mine", mode: 0o600, uid: 1000, gid: 1000},
	)
	l2 := layerOf(t,
		file("etc/a", "a2"), file("etc/.wh.b", ""),
		dir("opaque/"), file("opaque/.wh..wh..opq", ""), file("opaque/new", "new"),
		file(".wh.del.txt", ""),
		symlink("link", "etc/a"),
		hardlink("keep/y", "keep/x"),
	)
	return imageOf(t, "amd64", l1, l2)
}

// readFile returns the contents of root/rel, failing the test if missing.
func readFile(t testing.TB, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(root, rel string) bool {
	_, err := os.Lstat(filepath.Join(root, rel))
	return err == nil
}

// newTestStore returns a Store in a temp state dir that may build images
// without root.
func newTestStore(t testing.TB) *Store {
	s := NewStore(t.TempDir(), NewMemIndex(), nil)
	s.allowUnprivileged = true
	t.Cleanup(func() { _ = removeAll(s.dir) })
	return s
}
