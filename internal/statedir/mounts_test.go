package statedir

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestRemoveAllNoMounts: removing a directory under which something is
// mounted takes the mount off first and leaves what it showed intact.
func TestRemoveAllNoMounts(t *testing.T) {
	testutil.RequireRoot(t) // bind mounts
	keep := t.TempDir()
	precious := filepath.Join(keep, "precious")
	if err := os.WriteFile(precious, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "run")
	point := filepath.Join(dir, "mounts", "0")
	if err := os.MkdirAll(point, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(keep, point, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(point, unix.MNT_DETACH) })
	if got := MountsUnder(dir); len(got) != 1 || got[0] != point {
		t.Fatalf("MountsUnder = %v", got)
	}
	if err := RemoveAllNoMounts(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("dir left: %v", err)
	}
	if b, err := os.ReadFile(precious); err != nil || string(b) != "data" {
		t.Fatalf("the mounted directory lost its file: %q %v", b, err)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/x\134y`: `/x\y`, `/bad\9`: `/bad\9`} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
