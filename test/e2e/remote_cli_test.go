package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// remoteRun runs the airlock CLI with AIRLOCK_HOST and AIRLOCK_API_KEY set,
// so that its sandbox commands go through the API server s.
func remoteRun(t *testing.T, e env, s *apiServer, key string, stdin []byte, args ...string) result {
	t.Helper()
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	return e.runWith(t, []string{"AIRLOCK_HOST=" + s.base, "AIRLOCK_API_KEY=" + key}, in, args...)
}

// The same CLI, through the server: run, create, exec (exit codes, stdout
// and stderr apart, stdin, flags), cp both ways, ls, inspect, events, rm.
func TestRemoteCLI(t *testing.T) {
	e := setup(t)
	s := startServe(t, e)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-remote-cli"))
	run := func(stdin []byte, args ...string) result {
		t.Helper()
		return remoteRun(t, e, s, key, stdin, args...)
	}
	expect := func(r result, code int, stdout string, args ...string) {
		t.Helper()
		if r.code != code || r.stdout != stdout {
			t.Errorf("airlock %v: exit %d, stdout %q; want %d, %q\nstderr: %s", args, r.code, r.stdout, code, stdout, r.stderr)
		}
	}

	args := []string{"run", "--", "python3", "-c", "print(1)"}
	expect(run(nil, args...), 0, "1\n", args...)

	r := run(nil, "create", "--meta", "suite=remote-cli")
	if r.code != 0 {
		t.Fatalf("create: exit %d: %s", r.code, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { remoteRun(t, e, s, key, nil, "rm", id) })

	args = []string{"exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"}
	r = run(nil, args...)
	expect(r, 3, "out\n", args...)
	if r.stderr != "err\n" {
		t.Errorf("exec stderr %q, want %q", r.stderr, "err\n")
	}
	args = []string{"exec", "--timeout", "1s", id, "--", "sleep", "60"}
	expect(run(nil, args...), 124, "", args...)
	args = []string{"exec", id, "--", "sh", "-c", "kill -TERM $$"}
	expect(run(nil, args...), 143, "", args...)
	args = []string{"exec", "-i", id, "--", "sh", "-c", "cat; exit 5"}
	expect(run([]byte("line 1\nline 2\n"), args...), 5, "line 1\nline 2\n", args...)
	args = []string{"exec", "-e", "FOO=bar", "-w", "/tmp", "-u", "nobody", id, "--", "sh", "-c", "echo $FOO $(pwd) $(id -un)"}
	expect(run(nil, args...), 0, "bar /tmp nobody\n", args...)
	r = run(nil, "exec", "aaaaaaaaaaaa", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "request_id") {
		t.Errorf("exec in a missing sandbox: exit %d, stderr %q; want 125 and a request id", r.code, r.stderr)
	}

	dir := t.TempDir()
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	src := filepath.Join(dir, "in.bin")
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	expect(run(nil, "cp", src, id+":/tmp/"), 0, "", "cp", "in")
	expect(run(nil, "exec", id, "--", "stat", "-c", "%s %a", "/tmp/in.bin"), 0, "3145728 640\n", "stat")
	dst := filepath.Join(dir, "out.bin")
	expect(run(nil, "cp", id+":/tmp/in.bin", dst), 0, "", "cp", "out")
	if got, err := os.ReadFile(dst); err != nil || !bytes.Equal(got, data) {
		t.Errorf("cp round trip: %d bytes, %v; want %d identical bytes", len(got), err, len(data))
	}
	if fi, err := os.Stat(dst); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("cp out mode: %v, %v", fi, err)
	}

	if r := run(nil, "ls"); r.code != 0 || !strings.Contains(r.stdout, id) {
		t.Errorf("ls: exit %d, stdout %q", r.code, r.stdout)
	}
	var v struct {
		ID       string            `json:"id"`
		State    string            `json:"state"`
		Tenant   string            `json:"tenant"`
		Metadata map[string]string `json:"metadata"`
	}
	if r := run(nil, "inspect", id); json.Unmarshal([]byte(r.stdout), &v) != nil || v.ID != id || v.State != "running" ||
		v.Tenant != "e2e-remote-cli" || v.Metadata["suite"] != "remote-cli" {
		t.Errorf("inspect: exit %d, stdout %q", r.code, r.stdout)
	}
	if r := run(nil, "events", "--sandbox", id); r.code != 0 || !strings.Contains(r.stdout, `"action":"exec.exit"`) ||
		!strings.Contains(r.stdout, `"action":"file.write"`) {
		t.Errorf("events: exit %d, stdout %q", r.code, r.stdout)
	}
	expect(run(nil, "rm", id), 0, id+"\n", "rm", id)
	if r := run(nil, "inspect", id); r.code != 1 || !strings.Contains(r.stderr, "not_found") {
		t.Errorf("inspect after rm: exit %d, stderr %q", r.code, r.stderr)
	}
}
