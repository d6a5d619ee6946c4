package main

import (
	"bytes"
	"runtime"
	"testing"
)

// TestVersionCmd: `airlock version` prints the version the build stamped
// (-X main.version, `make build`), the Go toolchain and the platform.
func TestVersionCmd(t *testing.T) {
	t.Parallel()
	root := rootCmd(&globals{})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"--state-dir", t.TempDir(), "version"})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := "airlock " + version + " (" + runtime.Version() + ", " + runtime.GOOS + "/" + runtime.GOARCH + ")\n"
	if out.String() != want {
		t.Fatalf("airlock version printed %q, want %q", out.String(), want)
	}
}
