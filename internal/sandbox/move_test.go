package sandbox

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
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
