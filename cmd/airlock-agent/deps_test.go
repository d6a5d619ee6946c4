package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps the guest agent small and free of host code: it may link
// only the standard library, airlock's agent and agentapi packages,
// airlock's archive package (standard library only: the tar defences the
// host uses on what a guest sends are the same code), the
// protocol's own dependencies, the pure-Go ZeroMQ that code contexts use
// to speak to Jupyter kernels, creack/pty (terminals) and fsnotify (file
// watches).
func TestDeps(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := []string{
		"github.com/airlock-sandbox/airlock/cmd/airlock-agent",
		"github.com/airlock-sandbox/airlock/internal/agent",
		"github.com/airlock-sandbox/airlock/internal/agentapi",
		"github.com/airlock-sandbox/airlock/internal/archive",
		"golang.org/x/sys/",
		"golang.org/x/net/",
		"golang.org/x/text/",
		"connectrpc.com/connect",
		"google.golang.org/protobuf/",
		"github.com/go-zeromq/zmq4",
		"golang.org/x/sync/",
		"github.com/creack/pty",
		"github.com/fsnotify/fsnotify",
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) == 0 {
		t.Fatal("go list found no dependencies at all")
	}
	for _, pkg := range pkgs {
		ok := false
		for _, a := range allowed {
			if pkg == strings.TrimSuffix(a, "/") || strings.HasPrefix(pkg, a) {
				ok = true
				break
			}
		}
		if !ok {
			t.Errorf("airlock-agent depends on %s", pkg)
		}
	}
}
