// Package shimtest is test support for running sandboxes' shims in-process
// on the fake runtime (internal/runtime/fake): a state dir with boot
// files, one image ("base") and a catalog, into which tests put sandbox
// rows and start a shim for each. The shim's own tests and the control
// plane's (a Manager over the same state dir, talking to the shims over
// their sockets) share it.
//
// It does not import the shim: Start takes the function that runs one, so
// that the shim's in-package tests can use it too.
package shimtest

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// ImageSize is the size of the image "base" of an Env.
const ImageSize = 1 << 20

// Env is a state dir ready for sandboxes of image "base" on the fake
// runtime.
type Env struct {
	L       statedir.Layout
	Store   *store.Store
	Runtime *fake.Runtime
	// ImageDigest is the digest of the image "base".
	ImageDigest string
}

// New makes an Env in a fresh temporary directory; the catalog closes when
// t ends. It needs qemu-img (the shim makes real qcow2 overlays).
func New(t testing.TB) *Env {
	t.Helper()
	testutil.NeedTool(t, "qemu-img", "make deps")
	ctx := t.Context()
	e := &Env{L: statedir.Layout{Root: t.TempDir()}, Runtime: fake.New(), ImageDigest: "sha256:" + strings.Repeat("ab", 32)}
	var err error
	if e.Store, err = store.Open(ctx, e.L.Catalog()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Store.Close() })
	for _, f := range []string{"vmlinux", "initrd.cpio"} {
		if err := os.WriteFile(filepath.Join(e.L.Root, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.L.SaveBootConfig(statedir.BootConfig{Kernel: filepath.Join(e.L.Root, "vmlinux"), Initrd: filepath.Join(e.L.Root, "initrd.cpio")}); err != nil {
		t.Fatal(err)
	}
	blob := e.L.ImagePath(e.ImageDigest)
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blob, make([]byte, ImageSize), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := e.Store.PutImage(ctx, store.ImageRecord{Name: "base", Digest: e.ImageDigest, Size: ImageSize, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return e
}

// Row returns the catalog row of a new sandbox id of image "base" (1 vCPU,
// 256 MiB, the template's disk size) that lives for lifetime, as the
// control plane records it before it starts the shim.
func (e *Env) Row(id string, lifetime time.Duration) store.Sandbox {
	now := time.Now()
	return store.Sandbox{ID: id, State: store.StateCreating, Image: "base", ImageDigest: e.ImageDigest,
		CPUs: 1, MemoryMiB: 256, DiskMiB: template.DiskMiB(ImageSize), TimeoutSec: int(lifetime / time.Second),
		CreatedAt: now, ExpiresAt: now.Add(lifetime)}
}

// Shim is one shim started by Start.
type Shim struct {
	done chan error
}

// Start records sb, makes its directory and calls run (which runs the
// sandbox's shim, writing its readiness to ready) on a goroutine. It
// returns once the shim reported ready, and fails t if it reported
// anything else.
func (e *Env) Start(t testing.TB, sb store.Sandbox, run func(ready io.WriteCloser) error) *Shim {
	t.Helper()
	if err := e.Store.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(e.L.Dir(sb.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	s := &Shim{done: make(chan error, 1)}
	pr, pw := io.Pipe()
	go func() { s.done <- run(pw) }()
	line, _ := bufio.NewReader(pr).ReadString('\n')
	if strings.TrimSpace(line) != "ok" {
		t.Fatalf("shim readiness: %q", line)
	}
	return s
}

// Done delivers the shim's result once it exited.
func (s *Shim) Done() <-chan error { return s.done }

// Wait waits for the shim to exit and fails t if it failed or took more
// than 20 seconds.
func (s *Shim) Wait(t testing.TB) {
	t.Helper()
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("shim: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("shim did not exit")
	}
}
