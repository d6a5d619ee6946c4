package bootfiles

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestParseDepends(t *testing.T) {
	t.Parallel()
	out := []byte(`linux-image-cloud-amd64
  Depends: linux-image-6.1.0-56-cloud-amd64
 |Depends: <linux-image-virtual>
  Recommends: firmware-linux
`)
	got, err := parseDepends(out, "linux-image-cloud-amd64")
	if err != nil || got != "linux-image-6.1.0-56-cloud-amd64" {
		t.Fatalf("got %q, %v", got, err)
	}
	alt := []byte("linux-image-amd64\n |Depends: <linux-image-virtual>\n |Depends: linux-image-6.1.0-57-amd64\n  Depends: linux-image-6.1.0-56-amd64\n")
	if got, err := parseDepends(alt, "linux-image-amd64"); err != nil || got != "linux-image-6.1.0-57-amd64" {
		t.Fatalf("alternatives: got %q, %v", got, err)
	}
	for _, bad := range []string{
		"",
		"linux-image-cloud-amd64\n  Depends: linux-base\n",
		"linux-image-cloud-amd64\n  Depends: linux-image-../../etc\n",
	} {
		if got, err := parseDepends([]byte(bad), "linux-image-cloud-amd64"); err == nil {
			t.Errorf("%q: got %q, want error", bad, got)
		}
	}
}

func TestParseCandidate(t *testing.T) {
	t.Parallel()
	out := []byte("linux-image-6.1.0-56-cloud-amd64:\n  Installed: (none)\n  Candidate: 6.1.192-2\n  Version table:\n")
	if v, err := parseCandidate(out); err != nil || v != "6.1.192-2" {
		t.Fatalf("got %q, %v", v, err)
	}
	if _, err := parseCandidate([]byte("x:\n  Installed: (none)\n  Candidate: (none)\n")); err == nil {
		t.Fatal("(none) accepted")
	}
}

func TestFindKernel(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	_, err := FindKernel(state, "")
	if !errors.Is(err, ErrNotInstalled) || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "airlock setup") {
		t.Fatalf("empty state: err = %v", err)
	}
	if _, err := FindKernel(state, "rt"); !errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, ErrNotInstalled) {
		t.Fatalf("unknown flavor: err = %v", err)
	}

	// Install a fake release by hand, as EnsureKernel lays it out.
	const release = "6.1.0-99-cloud-amd64"
	dir := filepath.Join(state, kernelsDir, release)
	if err := os.MkdirAll(filepath.Join(dir, "lib", "modules", release), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, vmlinuxFile), buildELF(t, fakeELF{notes: pvhNote()}), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, metaFile), []byte(`{"flavor":"cloud","release":"`+release+`","package":"linux-image-`+release+`","version":"1"}`), 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := FindKernel(state, FlavorCloud); !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("no current pointer: err = %v", err)
	}
	if err := setCurrent(filepath.Join(state, kernelsDir), FlavorCloud, release); err != nil {
		t.Fatal(err)
	}
	k, err := FindKernel(state, "")
	if err != nil {
		t.Fatal(err)
	}
	if k.Release != release || k.Flavor != FlavorCloud || !filepath.IsAbs(k.Vmlinux) ||
		k.ModulesDir != filepath.Join(filepath.Dir(k.Vmlinux), "lib", "modules", release) {
		t.Fatalf("kernel = %+v", k)
	}
	if _, err := FindKernel(state, FlavorGeneric); !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("generic: err = %v", err)
	}

	// A pointer to a release whose files are gone is "not installed".
	os.Remove(filepath.Join(dir, vmlinuxFile))
	if _, err := FindKernel(state, ""); !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("missing vmlinux: err = %v", err)
	}
}

// TestEnsureKernelHost installs the real cloud kernel with apt into a temp
// state dir, then builds an initramfs for it.
func TestEnsureKernelHost(t *testing.T) {
	testutil.RequireRoot(t)
	state := t.TempDir()
	var progress bytes.Buffer
	k, err := EnsureKernel(t.Context(), state, FlavorCloud, &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(k.Release, "-cloud-amd64") || k.Flavor != FlavorCloud {
		t.Fatalf("kernel = %+v", k)
	}
	f, err := os.Open(k.Vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := checkVmlinux(f); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Mode().Perm() != 0o444 || fi.Size() < 10<<20 {
		t.Fatalf("vmlinux mode %v size %d", fi.Mode(), fi.Size())
	}
	for _, m := range []string{"virtio_blk", "virtio_console", "virtio_mmio"} {
		if ms, _ := filepath.Glob(filepath.Join(k.ModulesDir, "kernel", "drivers", "*", m+".ko*")); len(ms) != 1 {
			t.Errorf("module %s: found %v", m, ms)
		}
	}
	found, err := FindKernel(state, "")
	if err != nil || found != k {
		t.Fatalf("FindKernel = %+v, %v; want %+v", found, err, k)
	}
	// A second call finds it installed and downloads nothing.
	progress.Reset()
	if _, err := EnsureKernel(t.Context(), state, FlavorCloud, &progress); err != nil || !strings.Contains(progress.String(), "already installed") {
		t.Fatalf("second EnsureKernel: %v\n%s", err, progress.String())
	}

	agent, err := exec.LookPath("busybox") // any static ELF will do
	if err != nil {
		t.Fatal("busybox-static is not installed (make deps)")
	}
	p, err := BuildInitramfs(t.Context(), state, k, agent)
	if err != nil {
		t.Fatal(err)
	}
	m := readCPIO(t, p)
	if len(strings.Fields(string(m["mods/order"].data))) < 8 {
		t.Fatalf("mods/order = %q", m["mods/order"].data)
	}
}
