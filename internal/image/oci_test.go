package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// checkTestTree checks the flattened testImage tree at root.
func checkTestTree(t *testing.T, root string) {
	t.Helper()
	if got := readFile(t, root, "etc/a"); got != "a2" {
		t.Errorf("etc/a = %q, want the upper layer's a2", got)
	}
	for _, gone := range []string{"etc/b", "opaque/old", "del.txt", "etc/.wh.b", ".wh.del.txt", "opaque/.wh..wh..opq"} {
		if exists(root, gone) {
			t.Errorf("%s exists; whiteout not applied", gone)
		}
	}
	if readFile(t, root, "opaque/new") != "new" || readFile(t, root, "keep/x") != "x" || readFile(t, root, "keep/y") != "x" {
		t.Error("opaque/new, keep/x or keep/y wrong")
	}
	if l, err := os.Readlink(filepath.Join(root, "link")); err != nil || l != "etc/a" {
		t.Errorf("link -> %q, %v", l, err)
	}
	fi, err := os.Lstat(filepath.Join(root, "bin/su"))
	if err != nil || fi.Mode()&fs.ModeSetuid == 0 {
		t.Errorf("bin/su lost setuid: %v %v", fi.Mode(), err)
	}
	if os.Geteuid() == 0 {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(root, "home/u/f"), &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("home/u/f owner %d:%d %v", st.Uid, st.Gid, err)
		}
	}
}

func TestUnpackImageFlattens(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	root := t.TempDir()
	var progress bytes.Buffer
	st, err := s.unpackImage(t.Context(), testImage(t), true, root, &progress, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	checkTestTree(t, root)
	if st.files == 0 || !strings.Contains(progress.String(), "unpack: layer 2/2") {
		t.Errorf("stats %+v progress:\n%s", st, progress.String())
	}
}

// badDiffIDLayer claims a diff id its content does not have.
type badDiffIDLayer struct{ v1.Layer }

func (badDiffIDLayer) DiffID() (v1.Hash, error) {
	return v1.NewHash("sha256:" + strings.Repeat("0", 64))
}

func TestUnpackImageChecksDiffIDs(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	good := layerOf(t, file("f", "content"))
	img := imageOf(t, "amd64", good)
	layers, _ := img.Layers()
	bad := &swappedImage{Image: img, layers: []v1.Layer{badDiffIDLayer{layers[0]}}}
	_, err := s.unpackImage(t.Context(), bad, false, t.TempDir(), nil, time.Now())
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "diff id") {
		t.Fatalf("err = %v, want a diff id mismatch", err)
	}
}

// swappedImage replaces an image's layers.
type swappedImage struct {
	v1.Image
	layers []v1.Layer
}

func (s *swappedImage) Layers() ([]v1.Layer, error) { return s.layers, nil }

func TestUnpackImageRejectsOtherArch(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	img := imageOf(t, "arm64", layerOf(t, file("f", "x")))
	if _, err := s.unpackImage(t.Context(), img, true, t.TempDir(), nil, time.Now()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
}

func TestImportDockerSave(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	p := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("example.com/team/tool:1.0")
	if err := tarball.WriteToFile(p, tag, testImage(t)); err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	img, err := s.Import(t.Context(), "tool", p, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Logf("progress:\n%s", progress.String())
	if img.Name != "tool" || img.Source != "import:img.tar" || !validDigest(img.Digest) {
		t.Fatalf("image = %+v", img)
	}
	checkExt4(t, s, img)
	if err := s.Verify(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(t.Context(), "tool"); err != nil || got != img {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.dir, tmpDir)); len(ents) != 0 {
		t.Errorf("staging left behind: %v", ents)
	}

	// No name: taken from the archive's tag.
	img, err = s.Import(t.Context(), "", p, nil)
	if err != nil || img.Name != "tool-1.0" {
		t.Fatalf("Import without a name: %+v, %v", img, err)
	}
}

func TestImportName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ ref, path, want string }{
		{"docker.io/library/python:3.12", "/x/py.tar", "python-3.12"},
		{"3.12", "/x/My Image.tar", "my-image"}, // a bare OCI ref.name is only a tag
		{"", "/x/base.oci.tar", "base"},
		{"", "/x/ok.docker", "ok"},
	} {
		if got, err := importName(tc.ref, tc.path); err != nil || got != tc.want {
			t.Errorf("importName(%q, %q) = %q, %v; want %q", tc.ref, tc.path, got, err, tc.want)
		}
	}
	if got, err := importName("", "/x/.tar"); !errors.Is(err, ErrInvalid) {
		t.Errorf("importName for .tar = %q, %v", got, err)
	}
}

// checkExt4 checks the blob of an image built from testImage with debugfs.
func checkExt4(t *testing.T, s *Store, img Image) {
	t.Helper()
	p := s.Path(img)
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o444 || fi.Size() != img.Size {
		t.Fatalf("blob %s: %v %v", p, fi, err)
	}
	debugfs := func(req string) string {
		out, err := exec.Command("debugfs", "-R", req, p).CombinedOutput()
		if err != nil {
			t.Fatalf("debugfs %s: %v\n%s", req, err, out)
		}
		return string(out)
	}
	if out := debugfs("cat /etc/a"); !strings.Contains(out, "a2") {
		t.Errorf("cat /etc/a: %q", out)
	}
	ls := debugfs("ls -l /")
	for _, want := range []string{"etc", "opaque", "keep", "bin", "home", "link"} {
		if !strings.Contains(ls, " "+want) {
			t.Errorf("ls / lacks %s:\n%s", want, ls)
		}
	}
	if strings.Contains(ls, "del.txt") {
		t.Errorf("del.txt survived:\n%s", ls)
	}
	if out := debugfs("stat /bin/su"); !strings.Contains(out, "Mode:  04755") {
		t.Errorf("stat /bin/su:\n%s", out)
	}
	if os.Geteuid() == 0 {
		if out := debugfs("stat /home/u/f"); !strings.Contains(out, "User:  1000") {
			t.Errorf("stat /home/u/f:\n%s", out)
		}
	}
	if out := debugfs("stats"); !strings.Contains(out, "Filesystem volume name:   "+Label) || !strings.Contains(out, "Reserved block count:     0") {
		t.Errorf("superblock:\n%s", out)
	}
}

// tarDir writes the files under dir into a tarball.
func tarDir(t *testing.T, dir, out string) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestImportOCILayout(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	// A multi-platform index: the arm64 image must be ignored.
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: imageOf(t, "arm64", layerOf(t, file("arm", "x"))), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: testImage(t), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "oci.tar")
	tarDir(t, dir, p)

	img, err := s.Import(t.Context(), "", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "oci" {
		t.Errorf("default name %q, want oci (from oci.tar)", img.Name)
	}
	checkExt4(t, s, img)

}

func TestImportOCILayoutTamperedBlob(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	dir := t.TempDir()
	lp, _ := layout.Write(dir, empty.Index)
	img := imageOf(t, "amd64", layerOf(t, file("f", "original")))
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	// Swap the layer blob for another valid gzip tar of the same name.
	evil, _ := layerOf(t, file("f", "evil")).Compressed()
	b, _ := io.ReadAll(evil)
	blob := filepath.Join(dir, "blobs", "sha256", d.Hex)
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "oci.tar")
	tarDir(t, dir, p)
	_, err := s.Import(t.Context(), "evil", p, nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("err = %v, want a digest mismatch", err)
	}
	if _, err := s.Get(t.Context(), "evil"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("image recorded after a failed import: %v", err)
	}
}

func TestImportRejects(t *testing.T) {
	t.Parallel()
	s := newTestStore(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gz := write("x.tar.gz", []byte{0x1f, 0x8b, 8, 0, 0, 0})
	plain := write("plain.tar", tarOf(t, file("hello", "x")))
	notTar := write("junk.tar", bytes.Repeat([]byte("junk"), 300))
	for _, p := range []string{gz, plain, notTar} {
		if _, err := s.Import(t.Context(), "x", p, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v", filepath.Base(p), err)
		}
	}
	if _, err := s.Import(t.Context(), "Bad Name", plain, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad name: err = %v", err)
	}
	// A docker-save archive whose layers unpack past the limit.
	s.Limits = Limits{MaxBytes: 4, MaxEntries: 100}
	p := filepath.Join(dir, "big.tar")
	tag, _ := name.NewTag("big:1")
	if err := tarball.WriteToFile(p, tag, imageOf(t, "amd64", layerOf(t, file("f", "0123456789")))); err != nil {
		t.Fatal(err)
	}
	_, err := s.Import(t.Context(), "big", p, nil)
	if !errors.Is(err, ErrLimit) || !errors.Is(err, errdefs.ErrResourceExhausted) || errdefs.Category(err) != "resource_exhausted" {
		t.Errorf("limit: err = %v (category %s)", err, errdefs.Category(err))
	}
}

func TestPull(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	ref, err := name.ParseReference(u.Host + "/team/python:3.12-slim")
	if err != nil {
		t.Fatal(err)
	}
	src := testImage(t)
	if err := remote.Write(ref, src); err != nil {
		t.Fatal(err)
	}
	digest, _ := src.Digest()

	s := newTestStore(t)
	var progress bytes.Buffer
	img, err := s.Pull(t.Context(), ref.String(), "", &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Logf("progress:\n%s", progress.String())
	if img.Name != "python-3.12-slim" || img.Source != "pull:"+ref.String()+"@"+digest.String() {
		t.Fatalf("image = %+v", img)
	}
	checkExt4(t, s, img)

	if _, err := s.Pull(t.Context(), u.Host+"/team/missing:1", "", nil); err == nil || !strings.HasPrefix(err.Error(), "pull ") {
		t.Fatalf("missing repo: err = %v", err)
	}
	if _, err := s.Pull(t.Context(), "UPPER/case:x", "", nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad ref: err = %v", err)
	}
	s.Limits = Limits{MaxBytes: 10, MaxEntries: 10}
	if _, err := s.Pull(t.Context(), ref.String(), "small", nil); !errors.Is(err, ErrLimit) {
		t.Fatalf("limit: err = %v", err)
	}
}
