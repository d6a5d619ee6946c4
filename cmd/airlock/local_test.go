package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// TestLocalCommands runs the sandbox commands without AIRLOCK_HOST: each
// one serves the API in-process on the local state dir (api.Local) over a
// manager of its own, which starts the shims (here in this process, on the
// fake runtime). They answer as through a server, with the local user's
// errors: the manager's text and no request id.
func TestLocalCommands(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	r := runLocal(t, a, nil, "create", "--cpus", "2", "--meta", "team=a")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("create: %+v", r)
	}
	for _, tc := range []struct {
		argv           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"sh", "-c", "printf o; printf e >&2; printf !; exit 3"}, 3, "o!", "e"},
		{[]string{"sh", "-c", "kill -15 $$"}, 143, "", "airlock: command killed by signal 15\n"},
		{[]string{"nope"}, 127, "", "airlock: the exec did not start (not found): executable not found in PATH\n"},
	} {
		r := runLocal(t, a, nil, append([]string{"exec", id, "--"}, tc.argv...)...)
		if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
			t.Errorf("exec %v: %+v; want %d %q %q", tc.argv, r, tc.code, tc.stdout, tc.stderr)
		}
	}
	in := strings.Repeat("line of stdin\n", 10000)
	if r := runLocal(t, a, strings.NewReader(in), "exec", "-i", id, "--", "cat"); r.code != 0 || r.stdout != in {
		t.Errorf("exec -i cat: code %d, %d bytes of stdout (want %d), stderr %q", r.code, len(r.stdout), len(in), r.stderr)
	}

	var vs []sandboxView
	if r := runLocal(t, a, nil, "ls", "--json"); json.Unmarshal([]byte(r.stdout), &vs) != nil || len(vs) != 1 || vs[0].ID != id || vs[0].CPUs != 2 {
		t.Errorf("ls --json: %+v", r)
	}
	var v sandboxView
	if r := runLocal(t, a, nil, "inspect", id); json.Unmarshal([]byte(r.stdout), &v) != nil || v.ID != id || v.Metadata["team"] != "a" || v.State != "running" {
		t.Errorf("inspect: %+v", r)
	}
	// The outbound abuse limits it got (the local user's: the defaults).
	if n := v.Network; n == nil || n.ConnRate != netconf.DefaultConnRate || n.DestsPerMin != netconf.DefaultDestsPerMin || n.UDPRate != netconf.DefaultUDPRate {
		t.Errorf("inspect network: %+v", n)
	}
	// The sandbox is the server's too: the same state dir.
	if r := runCLI(t, a, nil, "inspect", id); r.code != 0 || !strings.Contains(r.stdout, id) {
		t.Errorf("inspect through the server: %+v", r)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "in.sh")
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 100000)
	if err := os.WriteFile(src, data, 0o750); err != nil {
		t.Fatal(err)
	}
	if r := runLocal(t, a, nil, "cp", src, id+":/tmp/"); r.code != 0 {
		t.Fatalf("cp in: %+v", r)
	}
	out := filepath.Join(dir, "out.sh")
	if r := runLocal(t, a, nil, "cp", id+":/tmp/in.sh", out); r.code != 0 {
		t.Fatalf("cp out: %+v", r)
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("cp out: %d bytes, %v", len(got), err)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o750 {
		t.Errorf("cp out mode %v", fi.Mode())
	}

	r = runLocal(t, a, nil, "pause", id)
	if r.code != 0 || !regexp.MustCompile(`^paused `+id+` \(\d+ MiB state, saved in \d+\.\d s\)\n$`).MatchString(r.stdout) {
		t.Fatalf("pause: %+v", r)
	}
	if r := runLocal(t, a, nil, "resume", id); r.code != 0 || !strings.HasPrefix(r.stdout, "resumed "+id+" (in ") {
		t.Fatalf("resume: %+v", r)
	}
	// The guest's files came back with it.
	if r := runLocal(t, a, nil, "exec", id, "--", "cat", "/tmp/in.sh"); r.code != 0 || r.stdout != string(data) {
		t.Errorf("cat after resume: code %d, %d bytes, %q", r.code, len(r.stdout), r.stderr)
	}

	if r := runLocal(t, a, nil, "run", "--memory", "1G", "--", "sh", "-c", `printf 'hi\n'; printf !; exit 7`); r.code != 7 || r.stdout != "hi\n!" {
		t.Errorf("run: %+v", r)
	}
	if r := runLocal(t, a, nil, "inspect", "aaaaaaaaaaaa"); r.code != 1 || r.stderr != "airlock: not found: no sandbox \"aaaaaaaaaaaa\" (see `airlock ls`)\n" {
		t.Errorf("inspect a missing sandbox: %+v", r)
	}
	if r := runLocal(t, a, nil, "rm", id, "aaaaaaaaaaaa"); r.code != 1 || r.stdout != id+"\n" || r.stderr != "airlock: rm aaaaaaaaaaaa: not found: no sandbox \"aaaaaaaaaaaa\" (see `airlock ls`)\n" {
		t.Errorf("rm: %+v", r)
	}
	if sbs := a.sandboxes(t); len(sbs) != 0 {
		t.Errorf("sandboxes left: %+v", sbs)
	}
	if ents, err := os.ReadDir(a.env.L.Sandboxes()); err != nil || len(ents) != 0 {
		t.Errorf("sandbox directories left: %v %v", ents, err)
	}
}
