package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestDropBundle: only an admin caller (the control tier) drops a bundle,
// on a node with a bundle store; it is gone afterwards and audited.
func TestDropBundle(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	root := t.TempDir()
	id := statedir.NewID()
	ref, err := bundle.Dir{Root: root}.Put(ctx, id, func(w io.Writer) error { _, err := io.WriteString(w, "a bundle"); return err })
	if err != nil {
		t.Fatal(err)
	}
	files := func() []string {
		m, _ := filepath.Glob(filepath.Join(root, id, "*.tar"))
		return m
	}
	if len(files()) != 1 {
		t.Fatalf("bundle files %v", files())
	}
	if err := r.m.DropBundle(ctx, Caller{Admin: true}, ref); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("without a bundle store: %v", err)
	}
	r.m.Bundles = bundle.Dir{Root: root}
	if err := r.m.DropBundle(ctx, alice, ref); !errors.Is(err, errdefs.ErrPermissionDenied) || len(files()) != 1 {
		t.Fatalf("a tenant's drop: %v; files %v", err, files())
	}
	bad := ref
	bad.Sandbox = "../x"
	if err := r.m.DropBundle(ctx, Caller{Admin: true}, bad); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a ref outside the store: %v", err)
	}
	control := Caller{Tenant: "airlock-control", Admin: true, Via: "api"}
	if err := r.m.DropBundle(ctx, control, ref); err != nil {
		t.Fatal(err)
	}
	if len(files()) != 0 {
		t.Fatalf("after the drop: %v", files())
	}
	if _, err := os.Stat(filepath.Join(root, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's empty bundle dir stays: %v", err)
	}
	if got := strings.Join(r.actions(t, id), ","); got != "bundle.drop airlock-control api" {
		t.Fatalf("audit %q", got)
	}
}

// TestBundled lists the bundles of the paused sandboxes (their
// bundle.ref), for the control tier only.
func TestBundled(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	ref := func(id string, i int) bundle.Ref {
		return bundle.Ref{Sandbox: id, Digest: fmt.Sprintf("sha256:%064x", i), Bytes: int64(100 + i)}
	}
	var paused bundle.Ref
	for i, state := range []store.State{store.StatePaused, store.StateRunning, store.StatePaused} {
		id := statedir.NewID()
		sb := r.Row(id, time.Hour)
		sb.State = state
		if err := r.Store.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(r.m.L.Dir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		if i < 2 { // the last paused one has no bundle
			if err := r.m.keepBundleRef(id, ref(id, i)); err != nil {
				t.Fatal(err)
			}
		}
		if i == 0 {
			paused = ref(id, i)
		}
	}
	if _, err := r.m.Bundled(ctx, alice); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("a tenant lists bundles: %v", err)
	}
	got, err := r.m.Bundled(ctx, Caller{Admin: true})
	if err != nil || len(got) != 1 || got[0] != paused {
		t.Fatalf("Bundled = %+v %v, want [%+v]", got, err, paused)
	}
}
