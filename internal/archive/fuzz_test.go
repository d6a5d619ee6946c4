package archive

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// FuzzExtract: whatever the archive, Extract leaves the destination's
// parent as it was (only the destination and a canary in it) and makes
// no set-id file, device or FIFO.
func FuzzExtract(f *testing.F) {
	f.Add(mkTar(f, ent{typ: tar.TypeDir, name: "d/", mode: 0o755}, ent{typ: tar.TypeReg, name: "d/a", body: "a"},
		ent{typ: tar.TypeLink, name: "d/h", link: "d/a"}, ent{typ: tar.TypeSymlink, name: "s", link: "d"}))
	f.Add(mkTar(f, ent{typ: tar.TypeSymlink, name: "up", link: ".."}, ent{typ: tar.TypeReg, name: "up/escape", body: "x"}))
	f.Add(mkTar(f, ent{typ: tar.TypeSymlink, name: "abs", link: "/tmp"}, ent{typ: tar.TypeReg, name: "abs/escape", body: "x"}))
	f.Add(mkTar(f, ent{typ: tar.TypeReg, name: "../escape", body: "x"}))
	f.Add(mkTar(f, ent{typ: tar.TypeLink, name: "h", link: "../canary"}))
	f.Add(mkTar(f, ent{typ: tar.TypeReg, name: "x", body: "x", mode: 0o6755}))
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		dest := filepath.Join(parent, "dest")
		if err := os.Mkdir(dest, 0o755); err != nil {
			t.Fatal(err)
		}
		canary := filepath.Join(parent, "canary")
		if err := os.WriteFile(canary, []byte("canary"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _ = Extract(t.Context(), bytes.NewReader(data), dest, ExtractOptions{Limits: Limits{MaxEntries: 64, MaxBytes: 1 << 20}})
		ents, err := os.ReadDir(parent)
		if err != nil || len(ents) != 2 {
			t.Fatalf("the parent holds %v (%v)", ents, err)
		}
		if b, _ := os.ReadFile(canary); string(b) != "canary" {
			t.Fatalf("canary = %q", b)
		}
		_ = filepath.WalkDir(dest, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return nil
			}
			m := fi.Mode()
			if m&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
				t.Fatalf("%s has mode %v", p, m)
			}
			return nil
		})
		_ = filepath.WalkDir(dest, func(p string, _ fs.DirEntry, _ error) error {
			_ = os.Chmod(p, 0o755) // let TempDir's cleanup remove read-only directories
			return nil
		})
	})
}
