package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestOverlayOptions(t *testing.T) {
	t.Parallel()
	got, err := overlayOptions([]string{"/base", "/l1", "/l2"}, "/t/upper", "/t/work")
	if err != nil {
		t.Fatal(err)
	}
	// The top layer first; nothing that lets a layer point elsewhere.
	if want := "lowerdir=/l2:/l1:/base,upperdir=/t/upper,workdir=/t/work,redirect_dir=off,index=off,metacopy=off,xino=off"; got != want {
		t.Errorf("options:\n got %s\nwant %s", got, want)
	}
	if got, _ := overlayOptions([]string{"/base", "/l1"}, "", ""); got != "lowerdir=/l1:/base,redirect_dir=off,index=off,metacopy=off,xino=off" {
		t.Errorf("read-only options: %s", got)
	}
	for _, bad := range []string{"/a,b", "/a:b", `/a\b`} {
		if _, err := overlayOptions([]string{bad, "/l"}, "", ""); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	var many []string
	for range 200 {
		many = append(many, "/var/lib/airlock/template-layers/0123456789abcdef/0123456789abcdef0123456789abcdef")
	}
	if _, err := overlayOptions(many, "", ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("200 layers: %v", err)
	}
}

// A step's layer: what the guest wrote in the overlay lands in the upper
// layer, the saved copy keeps deletions (whiteouts) and opaque
// directories, and the layers merged read-only show the step's result.
// Device nodes other than whiteouts are refused.
func TestBuildLayers(t *testing.T) {
	testutil.RequireRoot(t)
	m := testManager(t)
	base := t.TempDir()
	for p, body := range map[string]string{"keep.txt": "keep", "gone.txt": "gone", "dir/old.txt": "old", "dir/also.txt": "also"} {
		if err := os.MkdirAll(filepath.Join(base, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root, err := m.mountBuildRoot([]string{base}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The step, as the guest would do it through the root.
	merged := root.merged
	must(t, os.WriteFile(filepath.Join(merged, "new.txt"), []byte("new"), 0o600))
	must(t, os.Chown(filepath.Join(merged, "new.txt"), 1234, 5678))
	must(t, os.Remove(filepath.Join(merged, "gone.txt")))
	must(t, os.RemoveAll(filepath.Join(merged, "dir")))
	must(t, os.Mkdir(filepath.Join(merged, "dir"), 0o755))
	must(t, os.WriteFile(filepath.Join(merged, "dir", "fresh.txt"), []byte("fresh"), 0o644))
	must(t, unmount(root.merged))
	root.mounted = root.mounted[:1]
	layer := m.layerPath("alice", "step-1")
	if err := m.saveLayer(t.Context(), root.upper, layer); err != nil {
		t.Fatal(err)
	}
	root.close(m)
	if _, err := os.Stat(root.dir); !os.IsNotExist(err) {
		t.Errorf("the step's work dir is left: %v", err)
	}
	if fi, err := os.Stat(filepath.Dir(filepath.Dir(layer))); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the layers dir: %v %v", fi, err)
	}

	// Merged read-only: the step's result.
	view := t.TempDir()
	opts, err := overlayOptions([]string{base, layer}, "", "")
	if err != nil {
		t.Fatal(err)
	}
	must(t, unix.Mount("overlay", view, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts))
	t.Cleanup(func() { _ = unmount(view) })
	var got []string
	must(t, filepath.WalkDir(view, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(view, p)
			got = append(got, rel)
		}
		return err
	}))
	if strings.Join(got, " ") != "dir/fresh.txt keep.txt new.txt" {
		t.Errorf("merged tree: %q", got)
	}
	fi, err := os.Stat(filepath.Join(view, "new.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 5678 || fi.Mode().Perm() != 0o600 {
		t.Errorf("new.txt: uid %d gid %d mode %v", st.Uid, st.Gid, fi.Mode())
	}

	// A device node in a step's layer is refused.
	root2, err := m.mountBuildRoot([]string{base}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	must(t, unmount(root2.merged))
	root2.mounted = root2.mounted[:1]
	must(t, unix.Mknod(filepath.Join(root2.upper, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	if err := m.saveLayer(t.Context(), root2.upper, m.layerPath("alice", "step-2")); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "/null") {
		t.Errorf("a device node: %v", err)
	}
	if _, err := os.Stat(m.layerPath("alice", "step-2")); !os.IsNotExist(err) {
		t.Errorf("the refused layer was saved: %v", err)
	}
	root2.close(m)
	// A build that crashed mid-step left its work dir mounted; the next
	// build's work dir cleans it up, and never one in use.
	crashed, err := m.mountBuildRoot([]string{base}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	crashed.lock.Close()
	live, err := m.mountBuildRoot([]string{base}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(crashed.dir); !os.IsNotExist(err) {
		t.Errorf("the crashed build's work dir is left: %v", err)
	}
	again, err := m.newWorkDir("image-")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(live.merged); err != nil {
		t.Errorf("a live build's work dir was cleaned: %v", err)
	}
	again.close(m)
	live.close(m)
	// Prune removes the tenant's layers.
	if n, err := m.pruneLayers("alice"); n != 1 || err != nil {
		t.Errorf("prune: %d %v", n, err)
	}
	if left := statedir.MountsUnder(m.L.Root); len(left) > 0 {
		t.Errorf("mounts left: %q", left)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
