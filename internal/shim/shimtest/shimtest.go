// Package shimtest is test support for running sandboxes' shims in-process
// on the fake runtime (internal/runtime/fake): a state dir with boot
// files, one image ("base") and a catalog, into which tests put sandbox
// rows and start a shim for each (Start), or in which a sandbox.Manager
// creates sandboxes whose shims it starts in-process (Starter). The shim's
// own tests and the control plane's (a Manager over the same state dir,
// talking to the shims over their sockets) share it.
//
// It does not import the shim: Start takes the function that runs one, so
// that the shim's in-package tests can use it too.
package shimtest

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
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
	e, err := Prepare(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Store.Close() })
	return e
}

// Prepare makes an Env in dir (an empty directory) for callers that are
// not tests (the cluster simulation of make bench); the caller closes its
// Store.
func Prepare(ctx context.Context, dir string) (*Env, error) {
	e := &Env{L: statedir.Layout{Root: dir}, Runtime: fake.New(), ImageDigest: "sha256:" + strings.Repeat("ab", 32)}
	var err error
	if e.Store, err = store.Open(ctx, e.L.Catalog()); err != nil {
		return nil, err
	}
	fail := func(err error) (*Env, error) {
		e.Store.Close()
		return nil, err
	}
	for _, f := range []string{"vmlinux", "initrd.cpio"} {
		if err := os.WriteFile(filepath.Join(e.L.Root, f), []byte("x"), 0o644); err != nil {
			return fail(err)
		}
	}
	if err := e.L.SaveBootConfig(statedir.BootConfig{Kernel: filepath.Join(e.L.Root, "vmlinux"), Initrd: filepath.Join(e.L.Root, "initrd.cpio")}); err != nil {
		return fail(err)
	}
	blob := e.L.ImagePath(e.ImageDigest)
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return fail(err)
	}
	if err := os.WriteFile(blob, make([]byte, ImageSize), 0o444); err != nil {
		return fail(err)
	}
	if err := e.Store.PutImage(ctx, store.ImageRecord{Name: "base", Digest: e.ImageDigest, Size: ImageSize, Created: time.Now()}); err != nil {
		return fail(err)
	}
	return e, nil
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
	// exited is closed once the shim returned (Starter's shims only).
	exited chan struct{}
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

// RunFunc runs the shim of doc to its end, in-process (shim.Run on the
// Env's runtime), writing its readiness to ready and holding lock.
type RunFunc func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error

// Starter returns a sandbox.Manager.StartShim that starts each shim by
// calling run on a goroutine: a manager built with it creates, resumes and
// forks sandboxes whose shims run in this process, and talks to them over
// their sockets as in production. When t ends, every shim that still runs
// is shut down (shimclient.Shutdown), and t fails if one of them failed or
// did not exit within 20 seconds.
func (e *Env) Starter(t testing.TB, run RunFunc) func(shimconf.Doc, io.WriteCloser, *os.File) error {
	t.Helper()
	var (
		mu    sync.Mutex
		shims = map[string][]*Shim{} // by sandbox id: a resumed one has several
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for id, ss := range shims {
			for _, s := range ss {
				s.stop(t, e.L.Socket(id))
				s.Wait(t)
			}
		}
	})
	return func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error {
		s := &Shim{done: make(chan error, 1), exited: make(chan struct{})}
		mu.Lock()
		shims[doc.ID] = append(shims[doc.ID], s)
		mu.Unlock()
		go func() {
			defer close(s.exited)
			s.done <- run(doc, ready, lock)
		}()
		return nil
	}
}

// stop shuts the shim down if it still runs.
func (s *Shim) stop(t testing.TB, sock string) {
	t.Helper()
	select {
	case <-s.exited:
		return
	default:
	}
	c := shimclient.New(sock)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		// A shim ending on its own (a lifetime's end) closes its socket
		// before it exits.
		select {
		case <-s.exited: // it ended meanwhile
		case <-ctx.Done():
			t.Errorf("shut down the shim at %s: %v", sock, err)
		}
	}
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
