package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// TestFindAgent: the guest agent is found next to airlock (a build tree's
// bin/), else in ../lib/airlock (`make install`, the `make dist` tarball);
// next to airlock wins; neither is a failed precondition naming both.
func TestFindAgent(t *testing.T) {
	t.Parallel()
	write := func(p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("agent"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	prefix := t.TempDir()
	bin := filepath.Join(prefix, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := findAgent(bin)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), filepath.Join(bin, "airlock-agent")) ||
		!strings.Contains(err.Error(), filepath.Join(bin, "..", "lib", "airlock", "airlock-agent")) {
		t.Fatalf("no agent: %v", err)
	}

	installed := filepath.Join(prefix, "lib", "airlock", "airlock-agent")
	write(installed)
	if p, err := findAgent(bin); err != nil || p != installed {
		t.Fatalf("installed layout: %q, %v; want %q", p, err, installed)
	}

	beside := filepath.Join(bin, "airlock-agent")
	write(beside)
	if p, err := findAgent(bin); err != nil || p != beside {
		t.Fatalf("build-tree layout: %q, %v; want %q", p, err, beside)
	}

	// A directory of that name is not the agent.
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, "bin", "airlock-agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := findAgent(filepath.Join(other, "bin")); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("directory named airlock-agent: %v", err)
	}
}
