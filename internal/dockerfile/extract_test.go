package dockerfile

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/archive"
)

// TestCopyTarExtracts checks that the guest's extractor (internal/archive)
// takes CopyTar's streams as they are: directories, files, symlinks that
// point outside (made, not followed), and an ADD archive's hard link.
func TestCopyTarExtracts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{
		"app/main.py":     "print(1)\n",
		"app/lib/util.py": "u\n",
		"app/etc":         "->/etc",
		"app/up":          "->../../..",
	})
	b := tarGz(t, []tar.Header{
		{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "pkg/run.sh", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "pkg/again.sh", Typeflag: tar.TypeLink, Linkname: "pkg/run.sh"},
	}, map[string]string{"pkg/run.sh": "#!/bin/sh\n"})
	if err := os.WriteFile(filepath.Join(dir, "pkg.tgz"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	c := openContext(t, dir)
	guest := t.TempDir()
	for _, src := range []string{"COPY app /srv/app", "ADD pkg.tgz /opt/", "COPY app/main.py /srv/main.py"} {
		var buf bytes.Buffer
		d, _, err := c.CopyTar(step(t, src), &buf)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		target := filepath.Join(guest, filepath.FromSlash(d))
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := archive.Extract(t.Context(), &buf, target, archive.ExtractOptions{}); err != nil {
			t.Fatalf("%s: Extract: %v", src, err)
		}
	}
	for name, want := range map[string]string{
		"srv/app/main.py":     "print(1)\n",
		"srv/app/lib/util.py": "u\n",
		"srv/main.py":         "print(1)\n",
		"opt/pkg/run.sh":      "#!/bin/sh\n",
		"opt/pkg/again.sh":    "#!/bin/sh\n",
	} {
		got, err := os.ReadFile(filepath.Join(guest, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	for name, want := range map[string]string{"srv/app/etc": "/etc", "srv/app/up": "../../.."} {
		if got, err := os.Readlink(filepath.Join(guest, name)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want %q", name, got, err, want)
		}
	}
	a, errA := os.Stat(filepath.Join(guest, "opt/pkg/run.sh"))
	l, errL := os.Stat(filepath.Join(guest, "opt/pkg/again.sh"))
	if errA != nil || errL != nil || !os.SameFile(a, l) {
		t.Errorf("the hard link is not one file: %v %v", errA, errL)
	}
}
