package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCodeContexts is the acceptance test of code contexts through the
// CLI: state kept between calls, a matplotlib PNG, an exception with a
// traceback, a timeout that leaves the state alone, and javascript and bash
// contexts that keep state too. Needs the base image's python (with
// ipykernel and matplotlib) and node.
func TestCodeContexts(t *testing.T) {
	e := setup(t)
	id := e.create(t, "--memory", "1024M")

	e.must(t, "code", id, "x = 21")
	if out := strings.TrimSpace(e.must(t, "code", id, "x * 2")); out != "42" {
		t.Fatalf("x * 2 = %q, want 42", out)
	}

	dir := t.TempDir()
	plot := "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
	r := e.run(t, nil, "code", "--out", dir, id, plot)
	if r.code != 0 {
		t.Fatalf("plot: exit %d\n%s", r.code, r.stderr)
	}
	pngs, _ := filepath.Glob(filepath.Join(dir, "*.png"))
	if len(pngs) == 0 {
		t.Fatalf("plot saved no PNG; stderr: %s", r.stderr)
	}
	b, err := os.ReadFile(pngs[0])
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("%s is not a PNG (%d bytes, %v)", pngs[0], len(b), err)
	}

	r = e.run(t, nil, "code", id, "1/0")
	if r.code != 1 || !strings.Contains(r.stderr, "ZeroDivisionError") || !strings.Contains(r.stderr, "Traceback") {
		t.Fatalf("1/0: exit %d\nstderr: %s", r.code, r.stderr)
	}

	r = e.run(t, nil, "code", "--timeout", "2s", id, "while True: pass")
	if r.code != 124 {
		t.Fatalf("timeout: exit %d\nstderr: %s", r.code, r.stderr)
	}
	if out := strings.TrimSpace(e.must(t, "code", id, "x")); out != "21" {
		t.Fatalf("x after the timeout = %q, want 21", out)
	}

	e.must(t, "code", "--lang", "javascript", id, "let y = 5")
	if out := strings.TrimSpace(e.must(t, "code", "--lang", "javascript", id, "y * 3")); out != "15" {
		t.Fatalf("javascript y * 3 = %q, want 15", out)
	}
	e.must(t, "code", "--lang", "bash", id, "cd /tmp && export Z=7")
	if out := strings.TrimSpace(e.must(t, "code", "--lang", "bash", id, `echo "$Z $(pwd)"`)); out != "7 /tmp" {
		t.Fatalf("bash state = %q, want \"7 /tmp\"", out)
	}

	cid := strings.TrimSpace(e.must(t, "contexts", "create", "--lang", "python", id))
	e.must(t, "code", "--context", cid, id, "x = 1")
	if out := strings.TrimSpace(e.must(t, "code", id, "x")); out != "21" {
		t.Fatalf("default context changed by another context: %q", out)
	}
	if !strings.Contains(e.must(t, "contexts", "ls", id), cid) {
		t.Fatal("contexts ls misses the new context")
	}
	e.must(t, "contexts", "rm", id, cid)

	// --context NAME creates the context on first use (README example),
	// in --lang, and says so on stderr; the next call finds its state.
	r = e.run(t, nil, "code", "--context", "scratch-1", "--lang", "bash", id, "export W=9")
	if r.code != 0 || !strings.Contains(r.stderr, "created context scratch-1 (bash)") {
		t.Fatalf("first use of --context scratch-1: exit %d stderr %q", r.code, r.stderr)
	}
	r = e.run(t, nil, "code", "--context", "scratch-1", id, "echo $W")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "9" || strings.Contains(r.stderr, "created") {
		t.Fatalf("second use of --context scratch-1: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
}
