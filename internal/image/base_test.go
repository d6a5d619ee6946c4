package image

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestParseDeb822Sources(t *testing.T) {
	t.Parallel()
	src := []byte(`Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main contrib

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm

Types: deb
Enabled: no
URIs: http://example.com/debian
Suites: bookworm

Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
`)
	want := []string{
		"deb http://deb.debian.org/debian bookworm main",
		"deb http://deb.debian.org/debian bookworm-updates main",
		"deb http://deb.debian.org/debian-security bookworm-security main contrib",
	}
	if got := parseDeb822Sources(src); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestParseSourcesList(t *testing.T) {
	t.Parallel()
	src := []byte(`# comment
deb http://mirror.example/debian bookworm main contrib # trailing
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian-security bookworm-security main
deb-src http://mirror.example/debian bookworm main
deb cdrom:[Debian]/ bookworm main
deb http://mirror.example/debian bullseye main
`)
	want := []string{
		"deb http://mirror.example/debian bookworm main contrib",
		"deb http://mirror.example/debian-security bookworm-security main",
	}
	if got := parseSourcesList(src); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestFinishBaseTree(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "host-resolv.conf")
	if err := os.WriteFile(outside, []byte("nameserver 10.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	// mmdebstrap or a package may leave resolv.conf as a symlink: it must
	// be replaced, never written through.
	if err := os.Symlink(outside, filepath.Join(root, "etc", "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	if err := finishBaseTree(root); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(root, "etc", "resolv.conf"))
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Fatalf("resolv.conf: %v %v", fi, err)
	}
	if readFile(t, filepath.Dir(outside), filepath.Base(outside)) != "nameserver 10.0.0.1\n" {
		t.Fatal("host file written through the symlink")
	}
	if readFile(t, root, "etc/hostname") != "airlock\n" {
		t.Fatal("hostname")
	}
}

func TestMkfsSize(t *testing.T) {
	t.Parallel()
	size, inodes := mkfsSize(treeUsage{bytes: 1000 << 20, inodes: 50_000})
	if size != 1278<<20 || inodes != 1278<<20/mkfsBytesPerIn {
		t.Errorf("1000 MiB tree: size %d MiB, inodes %d", size>>20, inodes)
	}
	// Many small files: inodes follow the tree, not the size.
	_, inodes = mkfsSize(treeUsage{bytes: 10 << 20, inodes: 100_000})
	if inodes != 100_000+25_000+4096 {
		t.Errorf("small files: inodes %d", inodes)
	}
	if size, _ := mkfsSize(treeUsage{}); size != 128<<20 {
		t.Errorf("empty tree: %d", size)
	}
}

// TestBuildBaseHost builds the real base image with mmdebstrap (about a
// minute and a half; needs the host's apt mirror).
func TestBuildBaseHost(t *testing.T) {
	testutil.RequireRoot(t)
	s := NewStore(filepath.Join(t.TempDir(), "state"), NewMemIndex(), nil)
	var progress bytes.Buffer
	start := time.Now()
	img, err := s.BuildBase(t.Context(), "base", &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base image %s: %d MiB in %s", img.Digest, img.Size>>20, time.Since(start).Round(time.Second))
	if img.Source != BaseSource {
		t.Errorf("source %q", img.Source)
	}
	if err := s.Verify(t.Context(), img); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.dir, tmpDir)); len(ents) != 0 {
		t.Errorf("staging left behind: %v", ents)
	}
}
