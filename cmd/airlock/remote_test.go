package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
)

// These tests run the CLI in remote mode against the real API server
// (testAPI): the sandboxes are real ones on the fake runtime, whose guest
// runs the few commands of internal/runtime/fake.

func TestRemoteExecExitCodes(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	// The guest kernel's OOM killer is the one outcome the fake runtime
	// cannot produce (the real agent reads it from the command's memory
	// cgroup): that exit is scripted here, as the API reports it. So is a
	// truncated output under -short: a real one is more than the shim's
	// cap (shim.DefaultMaxOutputBytes, 64 MiB, not settable through the
	// API) pushed through the shim, the API and the CLI, about 30 s under
	// -race; without -short the "truncated" case below runs for real.
	scripted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Cmd []string }
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes/"+id+"/exec" || json.NewDecoder(r.Body).Decode(&in) != nil || len(in.Cmd) != 1 {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"type":"start","exec_id":"exec000000000001","pid":42}`)
		switch in.Cmd[0] {
		case "oom":
			fmt.Fprintln(w, `{"type":"exit","code":-1,"signal":9,"timeout":false,"truncated":false,"oom_killed":true}`)
		case "truncate":
			fmt.Fprintln(w, `{"type":"stdout","data":"cGFydGlhbA=="}`) // "partial"
			fmt.Fprintln(w, `{"type":"exit","code":0,"signal":0,"timeout":false,"truncated":true}`)
		}
	}))
	t.Cleanup(scripted.Close)
	for _, tc := range []struct {
		name           string
		argv           []string
		code           int
		stdout, stderr string
		host           string // "": a's server
	}{
		{"ok", []string{"sh", "-c", "printf o; printf e >&2; printf !"}, 0, "o!", "e", ""},
		{"code", []string{"sh", "-c", "printf o; printf e >&2; printf !; exit 3"}, 3, "o!", "e", ""},
		{"timeout", []string{"sleep", "10"}, 124, "", "airlock: command timed out after 2s and was killed\n", ""},
		{"signal", []string{"sh", "-c", "kill -15 $$"}, 143, "", "airlock: command killed by signal 15\n", ""},
		{"oom", []string{"oom"}, 137, "", "airlock: out of memory (the guest's OOM killer killed a process of the command; see the sandbox's --memory)\n", scripted.URL},
		{"truncated-scripted", []string{"truncate"}, 0, "partial", "\n[airlock: output truncated: more than the output limit was produced]\n", scripted.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &globals{host: cmp.Or(tc.host, a.srv.URL), apiKey: a.key}
			r := execCLI(t, g, nil, append([]string{"exec", "--timeout", "2s", id, "--"}, tc.argv...))
			if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Errorf("exec %v: code %d stdout %q stderr %q; want %d %q %q", tc.argv, r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	t.Run("truncated", func(t *testing.T) {
		if testing.Short() {
			t.Skip("pushes 64 MiB through the shim, the API and the CLI; the truncated-scripted case stands in under -short")
		}
		// An output beyond the shim's cap: the command's stdout is cut
		// there.
		big := bytes.Repeat([]byte("partial\n"), shim.DefaultMaxOutputBytes/8+1)
		if _, err := a.m.WriteFile(t.Context(), sandbox.Local(), id, "/tmp/big", 0o644, bytes.NewReader(big)); err != nil {
			t.Fatal(err)
		}
		r := runCLI(t, a, nil, "exec", id, "--", "cat", "/tmp/big")
		const stderr = "\n[airlock: output truncated: more than the output limit was produced]\n"
		if r.code != 0 || r.stdout != string(big[:shim.DefaultMaxOutputBytes]) || r.stderr != stderr {
			t.Errorf("exec cat of %d bytes: code %d stdout %q stderr %q; want 0, the first %d bytes, %q", len(big), r.code, ellipsis(r.stdout), r.stderr, shim.DefaultMaxOutputBytes, stderr)
		}
	})
}

// ellipsis shortens s for a message.
func ellipsis(s string) string {
	if len(s) > 64 {
		return fmt.Sprintf("%s... (%d bytes)", s[:64], len(s))
	}
	return s
}

func TestRemoteExecRequest(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	r := runCLI(t, a, nil, "exec", "-e", "A=1", "-e", "B=x=y", "-w", "/tmp", "-u", "nobody", "--timeout", "1500ms", id, "--", "true")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	got, _ := json.Marshal(a.requests("POST", "/exec")[0].body)
	// No kill_on_disconnect: a CLI exec belongs to the sandbox and
	// survives the CLI, through a server as locally (signals are forwarded).
	want := `{"background":false,"cmd":["true"],"cwd":"/tmp","env":{"A":"1","B":"x=y"},"timeout_s":2,"user":"nobody"}`
	if string(got) != want {
		t.Errorf("exec request\n got %s\nwant %s", got, want)
	}
	if r := runCLI(t, a, nil, "exec", "--pids-limit", "5", id, "--", "true"); r.code != 0 {
		t.Fatalf("--pids-limit: %+v", r)
	}
	got, _ = json.Marshal(a.requests("POST", "/exec")[1].body["pids_limit"])
	if string(got) != "5" {
		t.Errorf("--pids-limit 5 sent pids_limit %s", got)
	}
}

func TestRemoteExecInteractive(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	in := strings.Repeat("line of stdin\n", 10000) // several SendStdin chunks
	r := runCLI(t, a, strings.NewReader(in), "exec", "-i", id, "--", "cat")
	if r.code != 0 || r.stdout != in {
		t.Fatalf("exec -i cat: code %d, %d bytes of stdout (want %d), stderr %q", r.code, len(r.stdout), len(in), r.stderr)
	}
	if req := a.requests("POST", "/exec")[0].body; req["background"] != true || req["stdin_open"] != true {
		t.Errorf("exec -i request: %v", req)
	}
}

func TestRemoteRunRemovesSandbox(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	r := runCLI(t, a, nil, "run", "--memory", "1G", "--meta", "k=v", "--", "sh", "-c", `printf 'hi\n'; printf !; exit 7`)
	if r.code != 7 || r.stdout != "hi\n!" {
		t.Fatalf("run: %+v", r)
	}
	if sbs := a.sandboxes(t); len(sbs) != 0 {
		t.Errorf("run left sandboxes behind: %+v", sbs)
	}
}

func TestRemoteErrors(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	r := runCLI(t, a, nil, "exec", "aaaaaaaaaaaa", "--", "true")
	if rid := a.lastRequestID(); r.code != 125 || !strings.Contains(r.stderr, "sandbox not found") || rid == "" || !strings.Contains(r.stderr, rid) {
		t.Errorf("exec in a missing sandbox: %+v (request id %q)", r, rid)
	}
	r = runCLI(t, a, nil, "inspect", "aaaaaaaaaaaa")
	if rid := a.lastRequestID(); r.code != 1 || r.stderr != "airlock: not_found (404): sandbox not found [request_id "+rid+"]\n" {
		t.Errorf("inspect a missing sandbox: %+v (request id %q)", r, rid)
	}
	g := &globals{host: a.srv.URL}
	if _, _, err := g.client(t.Context()); err == nil {
		t.Error("AIRLOCK_HOST without AIRLOCK_API_KEY accepted")
	}
}

func TestRemoteCp(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create").stdout)
	dir := t.TempDir()
	src := filepath.Join(dir, "in.sh")
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 100000)
	if err := os.WriteFile(src, data, 0o750); err != nil {
		t.Fatal(err)
	}
	// Into a directory: the base name is kept.
	if r := runCLI(t, a, nil, "cp", src, id+":/tmp"); r.code != 0 {
		t.Fatalf("cp in: %+v", r)
	}
	var stored bytes.Buffer
	var fi guest.FileInfo
	_, err := a.m.ReadFile(t.Context(), sandbox.Local(), id, "/tmp/in.sh", &stored, func(i guest.FileInfo) { fi = i })
	if err != nil || !bytes.Equal(stored.Bytes(), data) || fi.Mode != 0o750 {
		t.Fatalf("cp in stored %d bytes, mode %o: %v", stored.Len(), fi.Mode, err)
	}
	out := filepath.Join(dir, "out.sh")
	if r := runCLI(t, a, nil, "cp", id+":/tmp/in.sh", out); r.code != 0 {
		t.Fatalf("cp out: %+v", r)
	}
	got, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("cp out: %d bytes, %v", len(got), err)
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o750 {
		t.Errorf("cp out mode %v", fi.Mode())
	}
	// A missing file leaves nothing behind.
	if r := runCLI(t, a, nil, "cp", id+":/tmp/nope", filepath.Join(dir, "nope")); r.code != 1 || !strings.Contains(r.stderr, "request_id "+a.lastRequestID()) {
		t.Errorf("cp out of a missing file: %+v (request id %q)", r, a.lastRequestID())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("files left in %s: %v", dir, ents)
	}
}

func TestRemoteLsInspectRmEvents(t *testing.T) {
	t.Parallel()
	a := newTestAPI(t)
	id := strings.TrimSpace(runCLI(t, a, nil, "create", "--cpus", "2", "--meta", "team=a").stdout)
	if r := runCLI(t, a, nil, "ls"); r.code != 0 || !strings.Contains(r.stdout, id) || !strings.HasPrefix(r.stdout, "ID ") {
		t.Errorf("ls: %+v", r)
	}
	var vs []sandboxView
	if r := runCLI(t, a, nil, "ls", "--json"); json.Unmarshal([]byte(r.stdout), &vs) != nil || len(vs) != 1 || vs[0].CPUs != 2 {
		t.Errorf("ls --json: %+v", r)
	}
	var v sandboxView
	if r := runCLI(t, a, nil, "inspect", id); json.Unmarshal([]byte(r.stdout), &v) != nil || v.ID != id || v.Metadata["team"] != "a" || v.Tenant != "cli" {
		t.Errorf("inspect: %+v", r)
	}
	if r := runCLI(t, a, nil, "events", "--sandbox", id); r.code != 0 || !strings.Contains(r.stdout, `"action":"sandbox.create"`) || !strings.Contains(r.stdout, id) {
		t.Errorf("events: %+v", r)
	}
	if r := runCLI(t, a, nil, "rm", id, "aaaaaaaaaaaa"); r.code != 1 || r.stdout != id+"\n" || !strings.Contains(r.stderr, "rm aaaaaaaaaaaa: not_found") {
		t.Errorf("rm: %+v", r)
	}
}
