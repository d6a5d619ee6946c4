package main

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// The helper process for TestShimCmdReadsItsDocument: this test binary
// run as `airlock shim --id ID`.
func init() {
	if os.Getenv("AIRLOCK_SHIMCMD_HELPER") != "1" {
		return
	}
	main()
	os.Exit(0)
}

// runShimCmd starts `airlock shim --id id` with doc (nil: no descriptor 4)
// as its configuration and returns the line it wrote on its readiness pipe.
func runShimCmd(t *testing.T, id string, doc []byte) string {
	t.Helper()
	rr, rw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	cmd := exec.Command(os.Args[0], "shim", "--id", id)
	cmd.Env = append(os.Environ(), "AIRLOCK_SHIMCMD_HELPER=1")
	cmd.ExtraFiles = []*os.File{rw}
	var cw *os.File
	if doc != nil {
		var cr *os.File
		if cr, cw, err = os.Pipe(); err != nil {
			t.Fatal(err)
		}
		defer cr.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, cr)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rw.Close()
	if cw != nil {
		go func() {
			defer cw.Close()
			_, _ = cw.Write(doc)
		}()
	}
	line, _ := bufio.NewReader(io.LimitReader(rr, 4096)).ReadString('\n')
	if err := cmd.Wait(); err == nil {
		t.Errorf("the shim exited 0 after %q", line)
	}
	return strings.TrimSpace(line)
}

// TestShimCmdReadsItsDocument: `airlock shim` takes every setting from its
// configuration document on descriptor 4, and reports a missing, malformed
// or mismatched one on its readiness pipe before doing anything else.
func TestShimCmdReadsItsDocument(t *testing.T) {
	t.Parallel()
	id := statedir.NewID()
	state := t.TempDir()
	doc := func(d shimconf.Doc) []byte {
		var b strings.Builder
		if err := shimconf.Write(&b, d); err != nil {
			t.Fatal(err)
		}
		return []byte(b.String())
	}
	good := shimconf.Doc{Version: shimconf.Version, StateDir: state, ID: id, Runtime: "qemu", Options: shimconf.Options{}.WithDefaults(),
		Secrets: map[string]string{"API_KEY": "sk-secret-value"}}
	other := good
	other.ID = statedir.NewID()
	for _, c := range []struct {
		name string
		doc  []byte
		want string
	}{
		// Accepted: the shim goes on to its state dir (from the document),
		// which `airlock setup` never prepared.
		{"accepted", doc(good), "error: airlock is not set up on this host: no guest kernel prepared in " + state},
		{"no document", nil, "error: invalid argument: no configuration pipe on descriptor 4"},
		{"unknown field", []byte(strings.Replace(string(doc(good)), `{"version":1`, `{"version":1,"extra":true`, 1)), `error: invalid argument: shim config: json: unknown field "extra"`},
		{"another sandbox", doc(other), "error: invalid argument: shim --id " + `"` + id + `" does not match`},
	} {
		line := runShimCmd(t, id, c.doc)
		if !strings.HasPrefix(line, c.want) {
			t.Errorf("%s: readiness %q, want %q...", c.name, line, c.want)
		}
		if strings.Contains(line, "sk-secret-value") {
			t.Errorf("%s: the readiness line holds the secret value", c.name)
		}
	}
}
