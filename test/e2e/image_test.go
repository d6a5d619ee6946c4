package e2e

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// writeBusyboxImage writes a docker-save tarball of a one-layer image whose
// root holds only the host's static busybox.
func writeBusyboxImage(t *testing.T, path string) {
	t.Helper()
	tag, err := name.NewTag("example.test/tiny:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, tag, busyboxImage(t)); err != nil {
		t.Fatal(err)
	}
}

// busyboxImage is a one-layer image whose root holds only the host's
// static busybox (and /bin/sh).
func busyboxImage(t *testing.T) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("needs busybox-static (make deps): %v", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write(bb); err != nil {
		t.Fatal(err)
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox"}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImportedImageBootsAndIsRemovable(t *testing.T) {
	e := setup(t)
	tarPath := filepath.Join(t.TempDir(), "tiny.tar")
	writeBusyboxImage(t, tarPath)
	const img = "e2e-tiny"
	e.run(t, nil, "image", "rm", img) // leftovers of an earlier run
	out := strings.Fields(e.must(t, "image", "import", "--name", img, tarPath))
	if len(out) != 2 || !strings.HasPrefix(out[1], "sha256:") {
		t.Fatalf("import printed %q", out)
	}
	digest := out[1]
	t.Cleanup(func() { e.run(t, nil, "image", "rm", img) })
	if !strings.Contains(e.must(t, "image", "ls"), img) {
		t.Fatal("imported image not listed")
	}
	r := e.run(t, nil, "run", "--image", img, "--", "/bin/sh", "-c", "echo hello from busybox; ls /bin")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "hello from busybox\nbusybox\nsh\n") {
		t.Fatalf("run in imported image: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	// An image in use cannot be removed; once unused it can, with its templates.
	id := e.create(t, "--image", img)
	if r := e.run(t, nil, "image", "rm", img); r.code == 0 || !strings.Contains(r.stderr, id) {
		t.Fatalf("image rm while in use: exit %d %q", r.code, r.stderr)
	}
	tree := filepath.Join(e.state, "images", "dirs", "sha256-"+strings.TrimPrefix(digest, "sha256:"))
	if _, err := os.Stat(tree); onGVisor() && err != nil {
		t.Fatalf("gvisor sandbox ran without the image's extracted tree: %v", err)
	}
	e.must(t, "rm", id)
	e.must(t, "image", "rm", img)
	if _, err := os.Stat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("extracted tree of the removed image is left: %v", err)
	}
	if strings.Contains(e.must(t, "image", "ls"), img) {
		t.Fatal("image still listed after rm")
	}
	metas, _ := filepath.Glob(filepath.Join(e.state, "templates", "*", "meta.json"))
	for _, m := range metas {
		if b, _ := os.ReadFile(m); strings.Contains(string(b), digest) {
			t.Fatalf("template %s of the removed image is left", filepath.Dir(m))
		}
	}
}

// TestBaseImageHasPip: the default image has pip and venv, and `pip
// install` works in a sandbox as an agent runs it (no PEP 668 refusal):
// here a package built from a local directory, with no network.
func TestBaseImageHasPip(t *testing.T) {
	e := setup(t)
	out := e.must(t, "run", "--", "sh", "-c", `set -e
python3 -m pip --version
mkdir -p /tmp/hello && cd /tmp/hello
echo 'def hi(): return "hello from a pip-installed package"' > airlock_hello.py
printf 'from setuptools import setup\nsetup(name="airlock-hello", version="1.0", py_modules=["airlock_hello"])\n' > setup.py
python3 -m pip install --no-index --no-build-isolation --quiet /tmp/hello 2>&1 | grep -v -i "warning" || true
cd / && python3 -c 'import airlock_hello; print(airlock_hello.hi())'
python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'import sys; print("venv", sys.prefix)'`)
	for _, want := range []string{"pip ", "hello from a pip-installed package", "venv /tmp/venv"} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
}
