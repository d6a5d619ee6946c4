package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeAPI is an in-memory stand-in for the few API routes the remote mode
// uses. Commands are scripted: exec's cmd[0] picks the behaviour.
type fakeAPI struct {
	t *testing.T

	mu         sync.Mutex
	sandboxes  map[string]map[string]any
	files      map[string]fakeFile // "id:/path"
	execReqs   []map[string]any
	stdin      map[string]*fakeExec // exec id -> background exec
	killed     []string
	nextID     int
	creates    []map[string]any // create request bodies
	eventsQ    []string         // events query strings
	pauses     []map[string]any // pause request bodies
	keepalives int
	snapReqs   []string // snapshot and fork requests: "METHOD PATH BODY"
}

type fakeFile struct {
	data []byte
	mode fs.FileMode
}

type fakeExec struct {
	cmd  []string
	in   bytes.Buffer
	done chan struct{} // closed when stdin is closed
}

func newFakeAPI(t *testing.T) (*fakeAPI, *httptest.Server) {
	f := &fakeAPI{t: t, sandboxes: map[string]map[string]any{}, files: map[string]fakeFile{}, stdin: map[string]*fakeExec{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.sandbox(func(w http.ResponseWriter, _ *http.Request, sb map[string]any) { writeJSONResp(w, 200, sb) }))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.sandbox(f.remove))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.sandbox(f.exec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{eid}/stream", f.sandbox(f.stream))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/stdin", f.sandbox(f.sendStdin))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/signal", f.sandbox(func(w http.ResponseWriter, r *http.Request, _ map[string]any) {
		f.mu.Lock()
		f.killed = append(f.killed, r.PathValue("eid"))
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", f.sandbox(f.pause))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", f.sandbox(f.resume))
	mux.HandleFunc("POST /v1/sandboxes/{id}/keepalive", f.sandbox(func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		f.mu.Lock()
		f.keepalives++
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.sandbox(f.putFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.sandbox(f.getFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", f.sandbox(f.stat))
	f.snapshotRoutes(mux)
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.eventsQ = append(f.eventsQ, r.URL.RawQuery)
		f.mu.Unlock()
		writeJSONResp(w, 200, map[string]any{"events": []map[string]any{
			{"seq": 7, "action": "sandbox.create", "sandbox_id": r.URL.Query().Get("sandbox"), "tenant": "cli"},
		}, "next": 7})
	})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-fake")
		if r.Header.Get("Authorization") != "Bearer al_test" {
			apiError(w, 401, "unauthenticated", "missing or bad API key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, srv
}

func writeJSONResp(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSONResp(w, status, map[string]any{"error": map[string]string{"code": code, "message": msg, "request_id": "req-fake"}})
}

func (f *fakeAPI) create(w http.ResponseWriter, r *http.Request) {
	var in map[string]any
	_ = json.NewDecoder(r.Body).Decode(&in)
	f.mu.Lock()
	f.creates = append(f.creates, in)
	f.nextID++
	id := fmt.Sprintf("sbx%09s", strconv.FormatInt(int64(f.nextID), 8)) // [a-z2-7]{12}
	id = strings.NewReplacer("0", "a", "1", "b", " ", "a").Replace(id)
	sb := map[string]any{
		"id": id, "state": "running", "image": in["image"], "cpus": in["cpus"], "memory_mb": in["memory_mb"],
		"disk_mb": 2048, "accel": "kvm", "tenant": "cli", "metadata": in["metadata"], "idle_pause_s": in["idle_pause_s"],
		"created_at": time.Now().UTC(), "expires_at": time.Now().Add(time.Duration(in["timeout_s"].(float64)) * time.Second).UTC(),
	}
	if n, ok := in["network"].(map[string]any); ok {
		pub := map[string]any{}
		for k, v := range n {
			pub[k] = v
		}
		var secs []any
		for _, sec := range asSlice(n["secrets"]) {
			m := sec.(map[string]any)
			secs = append(secs, map[string]any{"name": m["name"], "hosts": m["hosts"], "placeholder": "airlock-secret-0123456789abcdef0123456789abcdef"})
		}
		pub["secrets"] = secs
		sb["network"] = pub
	}
	f.sandboxes[id] = sb
	f.files[id+":/tmp"] = fakeFile{mode: fs.ModeDir | 0o777}
	f.mu.Unlock()
	writeJSONResp(w, 201, sb)
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func (f *fakeAPI) list(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
	for _, sb := range f.sandboxes {
		out = append(out, sb)
	}
	writeJSONResp(w, 200, map[string]any{"sandboxes": out})
}

func (f *fakeAPI) sandbox(h func(http.ResponseWriter, *http.Request, map[string]any)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		sb, ok := f.sandboxes[r.PathValue("id")]
		f.mu.Unlock()
		if !ok {
			apiError(w, 404, "not_found", "sandbox not found")
			return
		}
		h(w, r, sb)
	}
}

func (f *fakeAPI) remove(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	f.mu.Lock()
	delete(f.sandboxes, r.PathValue("id"))
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// script runs a scripted command: "out STDOUT STDERR CODE", "timeout",
// "signal N", "truncate", "cat" (stdin to stdout).
func script(cmd []string, stdin []byte) (records []map[string]any) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	exit := map[string]any{"type": "exit", "code": 0, "signal": 0, "timeout": false, "truncated": false}
	switch cmd[0] {
	case "out":
		records = append(records,
			map[string]any{"type": "stdout", "data": b64(cmd[1])},
			map[string]any{"type": "stderr", "data": b64(cmd[2])},
			map[string]any{"type": "stdout", "data": b64("!")})
		exit["code"], _ = strconv.Atoi(cmd[3])
	case "timeout":
		exit["code"], exit["signal"], exit["timeout"] = -1, 9, true
	case "signal":
		exit["code"], _ = -1, 0
		exit["signal"], _ = strconv.Atoi(cmd[1])
	case "oom":
		exit["code"], exit["signal"], exit["oom_killed"] = -1, 9, true
	case "truncate":
		records = append(records, map[string]any{"type": "stdout", "data": b64("partial")})
		exit["truncated"] = true
	case "cat":
		records = append(records, map[string]any{"type": "stdout", "data": base64.StdEncoding.EncodeToString(stdin)})
	}
	return append(records, exit)
}

func writeRecords(w http.ResponseWriter, recs []map[string]any) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	enc := json.NewEncoder(w)
	for _, rec := range recs {
		_ = enc.Encode(rec)
	}
}

func (f *fakeAPI) exec(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	var in map[string]any
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		apiError(w, 400, "invalid", "bad body")
		return
	}
	var cmd []string
	for _, a := range in["cmd"].([]any) {
		cmd = append(cmd, a.(string))
	}
	f.mu.Lock()
	f.execReqs = append(f.execReqs, in)
	f.nextID++
	eid := fmt.Sprintf("exec%012d", f.nextID)
	if in["background"] == true {
		f.stdin[eid] = &fakeExec{cmd: cmd, done: make(chan struct{})}
		f.mu.Unlock()
		writeJSONResp(w, 202, map[string]any{"exec_id": eid, "pid": 42})
		return
	}
	f.mu.Unlock()
	recs := append([]map[string]any{{"type": "start", "exec_id": eid, "pid": 42}}, script(cmd, nil)...)
	writeRecords(w, recs)
}

func (f *fakeAPI) stream(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	f.mu.Lock()
	ex := f.stdin[r.PathValue("eid")]
	f.mu.Unlock()
	if ex == nil {
		apiError(w, 404, "not_found", "exec not found")
		return
	}
	select {
	case <-ex.done:
	case <-r.Context().Done():
		return
	}
	f.mu.Lock()
	in := bytes.Clone(ex.in.Bytes())
	f.mu.Unlock()
	writeRecords(w, script(ex.cmd, in))
}

func (f *fakeAPI) sendStdin(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	ex := f.stdin[r.PathValue("eid")]
	if ex == nil {
		apiError(w, 404, "not_found", "exec not found")
		return
	}
	ex.in.Write(b)
	if r.URL.Query().Get("close") == "true" {
		close(ex.done)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeAPI) putFile(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	b, _ := io.ReadAll(r.Body)
	mode, _ := strconv.ParseUint(r.URL.Query().Get("mode"), 8, 32)
	p := r.URL.Query().Get("path")
	f.mu.Lock()
	f.files[r.PathValue("id")+":"+p] = fakeFile{data: b, mode: fs.FileMode(mode)}
	f.mu.Unlock()
	writeJSONResp(w, 200, map[string]any{"path": p, "size": len(b)})
}

func (f *fakeAPI) file(r *http.Request) (fakeFile, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ff, ok := f.files[r.PathValue("id")+":"+r.URL.Query().Get("path")]
	return ff, ok
}

func (f *fakeAPI) getFile(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	ff, ok := f.file(r)
	if !ok || ff.mode.IsDir() {
		apiError(w, 404, "not_found", "no such file")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(ff.data)
}

func (f *fakeAPI) stat(w http.ResponseWriter, r *http.Request, _ map[string]any) {
	ff, ok := f.file(r)
	if !ok {
		apiError(w, 404, "not_found", "no such file")
		return
	}
	typ := "file"
	if ff.mode.IsDir() {
		typ = "dir"
	}
	writeJSONResp(w, 200, map[string]any{"path": r.URL.Query().Get("path"), "type": typ, "size": len(ff.data), "mode": ff.mode.Perm()})
}

type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the airlock command line against the fake with AIRLOCK_HOST
// and AIRLOCK_API_KEY set, as main would, and returns its exit code.
func runCLI(t *testing.T, srv *httptest.Server, stdin io.Reader, args ...string) cliResult {
	t.Helper()
	g := &globals{host: srv.URL, apiKey: "al_test"}
	root := rootCmd(g)
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	if stdin != nil {
		root.SetIn(stdin)
	}
	root.SetArgs(append([]string{"--state-dir", filepath.Join(t.TempDir(), "unused")}, args...))
	code := 0
	if err := root.ExecuteContext(t.Context()); err != nil {
		code = report(&errb, err)
	}
	return cliResult{out.String(), errb.String(), code}
}

func TestRemoteExecExitCodes(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t)
	id := strings.TrimSpace(runCLI(t, srv, nil, "create").stdout)
	for _, tc := range []struct {
		name           string
		argv           []string
		code           int
		stdout, stderr string
	}{
		{"ok", []string{"out", "o", "e", "0"}, 0, "o!", "e"},
		{"code", []string{"out", "o", "e", "3"}, 3, "o!", "e"},
		{"timeout", []string{"timeout"}, 124, "", "airlock: command timed out after 2s and was killed\n"},
		{"signal", []string{"signal", "15"}, 143, "", "airlock: command killed by signal 15\n"},
		{"oom", []string{"oom"}, 137, "", "airlock: out of memory (the guest's OOM killer killed a process of the command; see the sandbox's --memory)\n"},
		{"truncated", []string{"truncate"}, 0, "partial", "\n[airlock: output truncated: more than the output limit was produced]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, srv, nil, append([]string{"exec", "--timeout", "2s", id, "--"}, tc.argv...)...)
			if r.code != tc.code || r.stdout != tc.stdout || r.stderr != tc.stderr {
				t.Errorf("exec %v: code %d stdout %q stderr %q; want %d %q %q", tc.argv, r.code, r.stdout, r.stderr, tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}

func TestRemoteExecRequest(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	id := strings.TrimSpace(runCLI(t, srv, nil, "create").stdout)
	r := runCLI(t, srv, nil, "exec", "-e", "A=1", "-e", "B=x=y", "-w", "/tmp", "-u", "nobody", "--timeout", "1500ms", id, "--", "out", "", "", "0")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	f.mu.Lock()
	got, _ := json.Marshal(f.execReqs[0])
	f.mu.Unlock()
	// No kill_on_disconnect: a CLI exec belongs to the sandbox and
	// survives the CLI, through a server as locally (signals are forwarded).
	want := `{"background":false,"cmd":["out","","","0"],"cwd":"/tmp","env":{"A":"1","B":"x=y"},"timeout_s":2,"user":"nobody"}`
	if string(got) != want {
		t.Errorf("exec request\n got %s\nwant %s", got, want)
	}
	if r := runCLI(t, srv, nil, "exec", "--pids-limit", "5", id, "--", "out", "", "", "0"); r.code != 0 {
		t.Fatalf("--pids-limit: %+v", r)
	}
	f.mu.Lock()
	got, _ = json.Marshal(f.execReqs[1]["pids_limit"])
	f.mu.Unlock()
	if string(got) != "5" {
		t.Errorf("--pids-limit 5 sent pids_limit %s", got)
	}
}

func TestRemoteExecInteractive(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	id := strings.TrimSpace(runCLI(t, srv, nil, "create").stdout)
	in := strings.Repeat("line of stdin\n", 10000) // several SendStdin chunks
	r := runCLI(t, srv, strings.NewReader(in), "exec", "-i", id, "--", "cat")
	if r.code != 0 || r.stdout != in {
		t.Fatalf("exec -i cat: code %d, %d bytes of stdout (want %d), stderr %q", r.code, len(r.stdout), len(in), r.stderr)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req := f.execReqs[0]; req["background"] != true || req["stdin_open"] != true {
		t.Errorf("exec -i request: %v", req)
	}
}

func TestRemoteRunRemovesSandbox(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	r := runCLI(t, srv, nil, "run", "--memory", "1G", "--meta", "k=v", "--", "out", "hi\n", "", "7")
	if r.code != 7 || r.stdout != "hi\n!" {
		t.Fatalf("run: %+v", r)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sandboxes) != 0 {
		t.Errorf("run left sandboxes behind: %v", f.sandboxes)
	}
}

func TestRemoteErrors(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t)
	r := runCLI(t, srv, nil, "exec", "aaaaaaaaaaaa", "--", "true")
	if r.code != 125 || !strings.Contains(r.stderr, "sandbox not found") || !strings.Contains(r.stderr, "req-fake") {
		t.Errorf("exec in a missing sandbox: %+v", r)
	}
	r = runCLI(t, srv, nil, "inspect", "aaaaaaaaaaaa")
	if r.code != 1 || r.stderr != "airlock: not_found (404): sandbox not found [request_id req-fake]\n" {
		t.Errorf("inspect a missing sandbox: %+v", r)
	}
	g := &globals{host: srv.URL}
	if _, _, err := g.client(t.Context()); err == nil {
		t.Error("AIRLOCK_HOST without AIRLOCK_API_KEY accepted")
	}
}

func TestRemoteCp(t *testing.T) {
	t.Parallel()
	f, srv := newFakeAPI(t)
	id := strings.TrimSpace(runCLI(t, srv, nil, "create").stdout)
	dir := t.TempDir()
	src := filepath.Join(dir, "in.sh")
	data := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 100000)
	if err := os.WriteFile(src, data, 0o750); err != nil {
		t.Fatal(err)
	}
	// Into a directory: the base name is kept.
	if r := runCLI(t, srv, nil, "cp", src, id+":/tmp"); r.code != 0 {
		t.Fatalf("cp in: %+v", r)
	}
	f.mu.Lock()
	ff, ok := f.files[id+":/tmp/in.sh"]
	f.mu.Unlock()
	if !ok || !bytes.Equal(ff.data, data) || ff.mode != 0o750 {
		t.Fatalf("cp in stored %v, %d bytes, mode %v", ok, len(ff.data), ff.mode)
	}
	out := filepath.Join(dir, "out.sh")
	if r := runCLI(t, srv, nil, "cp", id+":/tmp/in.sh", out); r.code != 0 {
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
	if r := runCLI(t, srv, nil, "cp", id+":/tmp/nope", filepath.Join(dir, "nope")); r.code != 1 || !strings.Contains(r.stderr, "req-fake") {
		t.Errorf("cp out of a missing file: %+v", r)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("files left in %s: %v", dir, ents)
	}
}

func TestRemoteLsInspectRmEvents(t *testing.T) {
	t.Parallel()
	_, srv := newFakeAPI(t)
	id := strings.TrimSpace(runCLI(t, srv, nil, "create", "--cpus", "2", "--meta", "team=a").stdout)
	if r := runCLI(t, srv, nil, "ls"); r.code != 0 || !strings.Contains(r.stdout, id) || !strings.HasPrefix(r.stdout, "ID ") {
		t.Errorf("ls: %+v", r)
	}
	var vs []sandboxView
	if r := runCLI(t, srv, nil, "ls", "--json"); json.Unmarshal([]byte(r.stdout), &vs) != nil || len(vs) != 1 || vs[0].CPUs != 2 {
		t.Errorf("ls --json: %+v", r)
	}
	var v sandboxView
	if r := runCLI(t, srv, nil, "inspect", id); json.Unmarshal([]byte(r.stdout), &v) != nil || v.ID != id || v.Metadata["team"] != "a" || v.Tenant != "cli" {
		t.Errorf("inspect: %+v", r)
	}
	if r := runCLI(t, srv, nil, "events", "--sandbox", id); r.code != 0 || !strings.Contains(r.stdout, `"action":"sandbox.create"`) || !strings.Contains(r.stdout, id) {
		t.Errorf("events: %+v", r)
	}
	if r := runCLI(t, srv, nil, "rm", id, "aaaaaaaaaaaa"); r.code != 1 || r.stdout != id+"\n" || !strings.Contains(r.stderr, "rm aaaaaaaaaaaa: not_found") {
		t.Errorf("rm: %+v", r)
	}
}
