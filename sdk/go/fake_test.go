package airlock_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// fakeServer implements the API contract's routes minimally, in memory.
// Execs are interpreted, not run: "echo ARGS" prints ARGS, "cat" echoes its
// stdin, "python3" prints 42, "sha256sum PATH" hashes a file, "bytes" prints all 256 byte values, "fail N" writes "boom" to stderr
// and exits N.
type fakeServer struct {
	t   testing.TB
	key string
	srv *httptest.Server

	mu        sync.Mutex
	nextID    int
	sandboxes map[string]map[string]any // id -> wire object
	files     map[string]map[string][]byte
	execs     map[string]map[string]*fakeExec
	events    []map[string]any
	requests  []*http.Request           // clones of every request seen (bodies not kept)
	vars      map[string]int            // code: the one context's variables
	snapshots map[string]map[string]any // name -> wire object

	// uploadStarted, if set, is closed once the first bytes of a PUT body
	// have arrived (for the streaming test).
	uploadStarted chan struct{}
}

type fakeExec struct {
	id    string
	cmd   []string
	recs  []map[string]any // stdout/stderr/exit records, wire form (base64)
	stdin bytes.Buffer
	done  chan struct{}
}

func newFakeServer(t testing.TB) *fakeServer {
	f := &fakeServer{
		t: t, key: "al_testkey1_0123456789abcdefghijklmnopqrstuv",
		sandboxes: map[string]map[string]any{},
		files:     map[string]map[string][]byte{},
		execs:     map[string]map[string]*fakeExec{},
		snapshots: map[string]map[string]any{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.withSandbox(f.get))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.withSandbox(f.kill))
	mux.HandleFunc("POST /v1/sandboxes/{id}/timeout", f.withSandbox(f.timeout))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", f.withSandbox(f.pause))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", f.withSandbox(f.resume))
	mux.HandleFunc("POST /v1/sandboxes/{id}/keepalive", f.withSandbox(f.keepalive))
	mux.HandleFunc("GET /v1/sandboxes/{id}/usage", f.withSandbox(f.usage))
	mux.HandleFunc("GET /v1/sandboxes/{id}/network", f.withSandbox(f.getNetwork))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", f.withSandbox(f.setNetwork))
	mux.HandleFunc("GET /v1/server", f.server)
	mux.HandleFunc("GET /v1/sandboxes/{id}/logs", f.withSandbox(f.logs))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", f.withSandbox(f.exec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs", f.withSandbox(f.listExecs))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{eid}", f.withExec(f.getExec))
	mux.HandleFunc("GET /v1/sandboxes/{id}/execs/{eid}/stream", f.withExec(f.stream))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/stdin", f.withExec(f.stdin))
	mux.HandleFunc("POST /v1/sandboxes/{id}/execs/{eid}/signal", f.withExec(f.signal))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", f.withSandbox(f.putFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", f.withSandbox(f.getFile))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/files", f.withSandbox(f.deleteFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", f.withSandbox(f.listFiles))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", f.withSandbox(f.stat))
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", f.withSandbox(f.mkdir))
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/rename", f.withSandbox(f.rename))
	mux.HandleFunc("POST /v1/sandboxes/{id}/code", f.withSandbox(f.code))
	mux.HandleFunc("GET /v1/sandboxes/{id}/contexts", f.withSandbox(f.listContexts))
	mux.HandleFunc("POST /v1/sandboxes/{id}/contexts", f.withSandbox(f.createContext))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/contexts/{ctx}", f.withSandbox(f.contextOp))
	mux.HandleFunc("POST /v1/sandboxes/{id}/contexts/{ctx}/restart", f.withSandbox(f.contextOp))
	mux.HandleFunc("POST /v1/sandboxes/{id}/contexts/{ctx}/interrupt", f.withSandbox(f.contextOp))
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshot", f.withSandbox(f.snapshot))
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", f.withSandbox(f.fork))
	mux.HandleFunc("GET /v1/snapshots", f.listSnapshots)
	mux.HandleFunc("GET /v1/snapshots/{name}", f.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{name}", f.deleteSnapshot)
	mux.HandleFunc("POST /v1/snapshots/prune", f.prune)
	mux.HandleFunc("GET /v1/events", f.eventsHandler)
	mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/{path...}", f.withSandbox(f.preview))
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-"+strconv.Itoa(len(f.requests)))
		f.mu.Lock()
		f.requests = append(f.requests, r.Clone(r.Context()))
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+f.key {
			f.fail(w, 401, "unauthenticated", "missing or bad API key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeServer) lastRequest() *http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[len(f.requests)-1]
}

func (f *fakeServer) fail(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code": code, "message": msg, "request_id": w.Header().Get("X-Request-Id"),
	}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeServer) event(sandbox, action string, detail map[string]any) {
	f.events = append(f.events, map[string]any{
		"seq": len(f.events) + 1, "time": time.Now().UTC().Format(time.RFC3339), "tenant": "t1",
		"key_id": "testkey1", "sandbox_id": sandbox, "action": action, "detail": detail,
	})
}

func (f *fakeServer) withSandbox(h func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		f.mu.Lock()
		_, ok := f.sandboxes[id]
		f.mu.Unlock()
		if !ok {
			f.fail(w, 404, "not_found", "sandbox not found")
			return
		}
		h(w, r, id)
	}
}

func (f *fakeServer) withExec(h func(http.ResponseWriter, *http.Request, *fakeExec)) http.HandlerFunc {
	return f.withSandbox(func(w http.ResponseWriter, r *http.Request, id string) {
		f.mu.Lock()
		e := f.execs[id][r.PathValue("eid")]
		f.mu.Unlock()
		if e == nil {
			f.fail(w, 404, "not_found", "exec not found")
			return
		}
		h(w, r, e)
	})
}

func (f *fakeServer) create(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Image     string            `json:"image"`
		CPUs      int               `json:"cpus"`
		MemoryMB  int               `json:"memory_mb"`
		TimeoutS  int               `json:"timeout_s"`
		Metadata  map[string]string `json:"metadata"`
		Network   json.RawMessage   `json:"network"`
		IdlePause int               `json:"idle_pause_s"`
		From      string            `json:"from_snapshot"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		f.fail(w, 400, "invalid", "bad json")
		return
	}
	source := ""
	if in.From != "" {
		f.mu.Lock()
		sn, ok := f.snapshots[in.From]
		f.mu.Unlock()
		if !ok {
			f.fail(w, 404, "not_found", "snapshot not found")
			return
		}
		in.Image, in.CPUs, in.MemoryMB, source = sn["image"].(string), sn["cpus"].(int), sn["memory_mb"].(int), "snapshot:"+in.From
	}
	if in.IdlePause < 0 || in.IdlePause > 604800 {
		f.fail(w, 400, "invalid", "idle_pause_s must be at most 604800")
		return
	}
	network, status, msg := fakeNetwork(in.Network)
	if status != 0 {
		f.fail(w, status, map[int]string{400: "invalid", 403: "permission_denied"}[status], msg)
		return
	}
	if in.CPUs > 32 {
		f.fail(w, 429, "resource_exhausted", "cpu quota")
		return
	}
	in.Image = cmp(in.Image, "base")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := fmt.Sprintf("sb%010d", f.nextID)
	now := time.Now().UTC()
	md := map[string]any{}
	for k, v := range in.Metadata {
		md[k] = v
	}
	sb := map[string]any{
		"id": id, "state": "running", "reason": "", "image": in.Image, "image_digest": "sha256:abc",
		"cpus": max(in.CPUs, 1), "memory_mb": max(in.MemoryMB, 512), "disk_mb": 2048,
		"created_at": now.Format(time.RFC3339), "expires_at": now.Add(time.Duration(cmpInt(in.TimeoutS, 900)) * time.Second).Format(time.RFC3339),
		"accel": "tcg", "guest_kernel": "6.1", "start_mode": "clone", "metadata": md, "tenant": "t1",
		"network": network, "idle_pause_s": in.IdlePause, "source": source, "disk_usage_bytes": 3 << 20,
	}
	f.sandboxes[id] = sb
	f.files[id] = map[string][]byte{}
	f.execs[id] = map[string]*fakeExec{}
	f.event(id, "sandbox.create", map[string]any{})
	writeJSON(w, 201, sb)
}

// fakeNetwork checks a create's "network" like the server: a mode string or
// an object; ports need an admin key (the fake's key is not one). It returns
// the sandbox's network without secret values, with placeholders.
func fakeNetwork(raw json.RawMessage) (map[string]any, int, string) {
	out := map[string]any{"mode": "public", "max_conns": 512}
	if len(raw) == 0 || string(raw) == "null" {
		return out, 0, ""
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		if mode != "public" && mode != "deny" && mode != "none" {
			return nil, 400, "network mode " + mode
		}
		out["mode"] = mode
		return out, 0, ""
	}
	var n map[string]any
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, 400, "bad network"
	}
	if n["ports"] != nil {
		return nil, 403, "network.ports needs an admin key"
	}
	for k, v := range n {
		out[k] = v
	}
	if n["mode"] == nil && n["allow"] != nil {
		out["mode"] = "deny"
	}
	if secs, ok := n["secrets"].([]any); ok {
		var pub []any
		for i, sec := range secs {
			m := sec.(map[string]any)
			if m["value"] == nil || m["value"] == "" {
				return nil, 400, fmt.Sprintf("secret %v has no value", m["name"])
			}
			pub = append(pub, map[string]any{"name": m["name"], "hosts": m["hosts"], "placeholder": fmt.Sprintf("airlock-secret-%032d", i)})
		}
		out["secrets"] = pub
	}
	return out, 0, ""
}

func (f *fakeServer) preview(w http.ResponseWriter, r *http.Request, id string) {
	b, _ := io.ReadAll(r.Body)
	writeJSON(w, 200, map[string]any{"sandbox": id, "port": r.PathValue("port"), "path": r.PathValue("path"),
		"query": r.URL.RawQuery, "method": r.Method, "body": string(b)})
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cmpInt(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}

func (f *fakeServer) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
next:
	for _, sb := range f.sandboxes {
		if s := r.URL.Query().Get("state"); s != "" && sb["state"] != s {
			continue
		}
		for k, v := range r.URL.Query() {
			if mk, ok := strings.CutPrefix(k, "metadata."); ok && sb["metadata"].(map[string]any)[mk] != v[0] {
				continue next
			}
		}
		out = append(out, sb)
	}
	writeJSON(w, 200, map[string]any{"sandboxes": out})
}

func (f *fakeServer) get(w http.ResponseWriter, _ *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	writeJSON(w, 200, f.sandboxes[id])
}

func (f *fakeServer) kill(w http.ResponseWriter, _ *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sandboxes, id)
	f.event(id, "sandbox.delete", map[string]any{})
	w.WriteHeader(204)
}

func (f *fakeServer) timeout(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		TimeoutS int `json:"timeout_s"`
	}
	_ = json.NewDecoder(r.Body).Decode(&in)
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	sb["expires_at"] = time.Now().UTC().Add(time.Duration(in.TimeoutS) * time.Second).Format(time.RFC3339)
	writeJSON(w, 200, sb)
}

func (f *fakeServer) getNetwork(w http.ResponseWriter, _ *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	writeJSON(w, 200, map[string]any{"network": f.sandboxes[id]["network"]})
}

// setNetwork replaces the mode and rules of the sandbox's network; a rule
// naming 10.0.0.0/8 is refused as the server refuses a tenant's rule
// that opens the platform floor.
func (f *fakeServer) setNetwork(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Mode  string   `json:"mode"`
		Allow []string `json:"allow"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		f.fail(w, 400, "invalid", "bad json")
		return
	}
	for _, a := range in.Allow {
		if strings.HasPrefix(a, "10.") {
			f.fail(w, 403, "permission_denied", "network.allow "+strconv.Quote(a)+" opens private, loopback, link-local or metadata addresses, which needs an admin key")
			return
		}
	}
	if in.Mode == "" {
		in.Mode = "public"
		if len(in.Allow) > 0 {
			in.Mode = "deny"
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	n, _ := sb["network"].(map[string]any)
	if n == nil {
		n = map[string]any{}
	}
	n["mode"], n["allow"] = in.Mode, in.Allow
	sb["network"] = n
	applied := "running"
	if sb["state"] == "paused" {
		applied = "resume"
	}
	writeJSON(w, 200, map[string]any{"network": n, "closed": 1, "applied": applied})
}

// pause: a sandbox with metadata busy=1 has a running command, refused
// without force; pausing a paused sandbox is a no-op.
func (f *fakeServer) pause(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Force bool `json:"force"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil && err != io.EOF {
		f.fail(w, 400, "invalid", "bad json")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	stats := map[string]any{"state_bytes": 0, "save_ms": 0}
	if sb["state"] != "paused" {
		if md, _ := sb["metadata"].(map[string]any); md["busy"] == "1" && !in.Force {
			f.fail(w, 412, "failed_precondition", "sandbox has running commands (use force)")
			return
		}
		sb["state"], sb["paused_at"], sb["lifetime_left_s"] = "paused", time.Now().UTC().Format(time.RFC3339), 600
		stats = map[string]any{"state_bytes": 123 << 20, "save_ms": 800}
		f.event(id, "sandbox.pause", map[string]any{"force": in.Force})
	}
	out := map[string]any{"pause": stats}
	for k, v := range sb {
		out[k] = v
	}
	writeJSON(w, 200, out)
}

func (f *fakeServer) resume(w http.ResponseWriter, _ *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	if sb["state"] == "paused" {
		sb["state"] = "running"
		delete(sb, "lifetime_left_s")
		f.event(id, "sandbox.resume", map[string]any{})
	}
	writeJSON(w, 200, sb)
}

func (f *fakeServer) keepalive(w http.ResponseWriter, _ *http.Request, id string) {
	f.resume(httptest.NewRecorder(), nil, id) // like any call, it resumes
	w.WriteHeader(204)
}

// server answers a tenant's overview: its sandboxes by state, fixed
// activity, one tenant row with a quota, no host.
func (f *fakeServer) server(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	states := map[string]int{"creating": 0, "running": 0, "pausing": 0, "paused": 0, "resuming": 0, "stopping": 0, "failed": 0}
	for _, sb := range f.sandboxes {
		states[sb["state"].(string)]++
	}
	writeJSON(w, 200, map[string]any{
		"admin": false, "sandboxes": states,
		"activity": map[string]any{"since": "2026-11-25T13:00:00Z", "bucket_s": 3600, "creates": []int{1, 0, 2}, "failures": []int{0, 0, 1}},
		"tenants": []map[string]any{{"tenant": "t1", "sandboxes": len(f.sandboxes), "vcpus": 1, "memory_mb": 512, "disk_mb": 2048, "snapshots": 0,
			"snapshots_disk_mb": 0, "quota": map[string]any{"max_sandboxes": 20, "max_vcpus": 32, "max_memory_mb": 32768, "max_disk_mb": 65536, "max_snapshots": 100}}},
		"runtime": map[string]any{"name": "qemu"},
	})
}

// logs answers a console log, its end if tail_bytes asks for less.
func (f *fakeServer) logs(w http.ResponseWriter, r *http.Request, _ string) {
	text := "boot\nready\n"
	n, _ := strconv.Atoi(r.URL.Query().Get("tail_bytes"))
	trunc := n > 0 && n < len(text)
	if trunc {
		text = text[len(text)-n:]
	}
	writeJSON(w, 200, map[string]any{"logs": []map[string]any{{"source": "console", "exists": true, "size": 11, "truncated": trunc, "text": text}}})
}

// usage answers fixed figures for a running sandbox, with a network block
// unless its network mode is none; any other state is 412 (it never
// resumes).
func (f *fakeServer) usage(w http.ResponseWriter, _ *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	if sb["state"] != "running" {
		f.fail(w, 412, "failed_precondition", fmt.Sprintf("the sandbox is %s: usage is sampled only while it runs", sb["state"]))
		return
	}
	out := map[string]any{"sandbox_id": id, "sampled_at": "2026-11-26T05:30:00.25Z", "cpus": sb["cpus"], "cpu_seconds": 1.5,
		"memory_bytes": 384 << 20, "memory_limit_bytes": 512 << 20, "disk_bytes": 256 << 20, "disk_limit_bytes": 2 << 30}
	if nw, _ := sb["network"].(map[string]any); nw["mode"] != "none" {
		out["network"] = map[string]any{"receive_bytes": 3 << 20, "transmit_bytes": 1 << 20, "connections": 2}
	}
	writeJSON(w, 200, out)
}

func b64(p []byte) string { return base64.StdEncoding.EncodeToString(p) }

// run interprets cmd against stdin and fills e's records.
func (e *fakeExec) finish(code, signal int) {
	e.recs = append(e.recs, map[string]any{"type": "exit", "code": code, "signal": signal, "timeout": false, "truncated": false, "duration_ms": 7})
	close(e.done)
}

func (f *fakeServer) exec(w http.ResponseWriter, r *http.Request, id string) {
	if r.URL.Query().Get("encoding") != "base64" {
		f.fail(w, 400, "invalid", "this fake only speaks ?encoding=base64")
		return
	}
	var in struct {
		Cmd        []string `json:"cmd"`
		Stdin      *string  `json:"stdin"`
		StdinOpen  bool     `json:"stdin_open"`
		Background bool     `json:"background"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || len(in.Cmd) == 0 {
		f.fail(w, 400, "invalid", "cmd is required")
		return
	}
	var stdin []byte
	if in.Stdin != nil {
		var err error
		if stdin, err = base64.StdEncoding.DecodeString(*in.Stdin); err != nil {
			f.fail(w, 400, "invalid", "stdin is not base64")
			return
		}
	}
	f.mu.Lock()
	eid := fmt.Sprintf("ex%014d", len(f.execs[id])+1)
	e := &fakeExec{id: eid, cmd: in.Cmd, done: make(chan struct{})}
	f.execs[id][eid] = e
	e.stdin.Write(stdin)
	switch in.Cmd[0] {
	case "echo":
		e.recs = append(e.recs, map[string]any{"type": "stdout", "data": b64([]byte(strings.Join(in.Cmd[1:], " ") + "\n"))})
		e.finish(0, 0)
	case "bytes":
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		e.recs = append(e.recs, map[string]any{"type": "stdout", "data": b64(all)})
		e.finish(0, 0)
	case "python3": // just enough for the live test to run against the fake
		e.recs = append(e.recs, map[string]any{"type": "stdout", "data": b64([]byte("42\n"))})
		e.finish(0, 0)
	case "sha256sum":
		sum := sha256.Sum256(f.files[id][in.Cmd[1]])
		e.recs = append(e.recs, map[string]any{"type": "stdout", "data": b64([]byte(hex.EncodeToString(sum[:]) + "  " + in.Cmd[1] + "\n"))})
		e.finish(0, 0)
	case "fail":
		n, _ := strconv.Atoi(in.Cmd[1])
		e.recs = append(e.recs, map[string]any{"type": "stderr", "data": b64([]byte("boom"))})
		e.finish(n, 0)
	case "cat":
		if !in.StdinOpen {
			e.recs = append(e.recs, map[string]any{"type": "stdout", "data": b64(e.stdin.Bytes())})
			e.finish(0, 0)
		}
	default:
		e.recs = append(e.recs, map[string]any{"type": "stderr", "data": b64([]byte(in.Cmd[0] + ": not found\n"))})
		e.finish(127, 0)
	}
	f.mu.Unlock()
	if in.Background {
		writeJSON(w, 202, map[string]any{"exec_id": eid, "pid": 42})
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "start", "exec_id": eid, "pid": 42})
	f.writeRecords(w, e)
}

// writeRecords waits for e to end, then writes its records.
func (f *fakeServer) writeRecords(w http.ResponseWriter, e *fakeExec) {
	<-e.done
	f.mu.Lock()
	recs := e.recs
	f.mu.Unlock()
	enc := json.NewEncoder(w)
	for _, rec := range recs {
		_ = enc.Encode(rec)
	}
}

func (f *fakeServer) execWire(e *fakeExec) map[string]any {
	m := map[string]any{"exec_id": e.id, "cmd": e.cmd, "pid": 42, "state": "running",
		"started_at": "2025-01-02T03:04:05Z", "ended_at": nil, "exit": nil}
	select {
	case <-e.done:
		m["state"], m["ended_at"] = "exited", "2025-01-02T03:04:06Z"
		m["exit"] = e.recs[len(e.recs)-1]
	default:
	}
	return m
}

func (f *fakeServer) listExecs(w http.ResponseWriter, _ *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
	for _, e := range f.execs[id] {
		out = append(out, f.execWire(e))
	}
	writeJSON(w, 200, map[string]any{"execs": out})
}

func (f *fakeServer) getExec(w http.ResponseWriter, _ *http.Request, e *fakeExec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	writeJSON(w, 200, f.execWire(e))
}

func (f *fakeServer) stream(w http.ResponseWriter, r *http.Request, e *fakeExec) {
	if r.URL.Query().Get("encoding") != "base64" {
		f.fail(w, 400, "invalid", "this fake only speaks ?encoding=base64")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	f.writeRecords(w, e)
}

func (f *fakeServer) stdin(w http.ResponseWriter, r *http.Request, e *fakeExec) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-e.done:
		f.fail(w, 409, "conflict", "exec has exited")
		return
	default:
	}
	e.stdin.Write(b)
	if r.URL.Query().Get("close") == "true" {
		e.recs = append(e.recs, map[string]any{"type": "stdout", "data": b64(e.stdin.Bytes())})
		e.finish(0, 0)
	}
	w.WriteHeader(204)
}

func (f *fakeServer) signal(w http.ResponseWriter, r *http.Request, e *fakeExec) {
	var in struct {
		Signal int `json:"signal"`
	}
	_ = json.NewDecoder(r.Body).Decode(&in)
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-e.done:
		f.fail(w, 409, "conflict", "exec has exited")
		return
	default:
	}
	e.finish(-1, in.Signal)
	w.WriteHeader(204)
}

func validPath(p string) bool {
	return strings.HasPrefix(p, "/") && !strings.Contains(p, "\x00") && len(p) <= 4096 && !strings.Contains(p, "/../")
}

// notifyReader closes ch on its first successful read.
type notifyReader struct {
	r    io.Reader
	once sync.Once
	ch   chan struct{}
}

func (n *notifyReader) Read(p []byte) (int, error) {
	k, err := n.r.Read(p)
	if k > 0 && n.ch != nil {
		n.once.Do(func() { close(n.ch) })
	}
	return k, err
}

func (f *fakeServer) putFile(w http.ResponseWriter, r *http.Request, id string) {
	p := r.URL.Query().Get("path")
	if !validPath(p) {
		f.fail(w, 400, "invalid", "bad path")
		return
	}
	b, err := io.ReadAll(&notifyReader{r: r.Body, ch: f.uploadStarted})
	if err != nil {
		f.fail(w, 400, "invalid", "body: "+err.Error())
		return
	}
	f.mu.Lock()
	f.files[id][p] = b
	f.event(id, "file.write", map[string]any{"path": p, "size": len(b)})
	f.mu.Unlock()
	writeJSON(w, 200, map[string]any{"path": p, "size": len(b)})
}

func (f *fakeServer) getFile(w http.ResponseWriter, r *http.Request, id string) {
	f.mu.Lock()
	b, ok := f.files[id][r.URL.Query().Get("path")]
	f.mu.Unlock()
	if !ok {
		f.fail(w, 404, "not_found", "no such file")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(b)
}

func (f *fakeServer) deleteFile(w http.ResponseWriter, r *http.Request, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := r.URL.Query().Get("path")
	if _, ok := f.files[id][p]; !ok {
		f.fail(w, 404, "not_found", "no such file")
		return
	}
	delete(f.files[id], p)
	w.WriteHeader(204)
}

func fileWire(p string, size int, typ string) map[string]any {
	return map[string]any{"path": p, "name": p[strings.LastIndex(p, "/")+1:], "type": typ, "size": size,
		"mode": 0o644, "mtime": "2025-01-02T03:04:05Z", "uid": 0, "gid": 0, "symlink_target": ""}
}

func (f *fakeServer) listFiles(w http.ResponseWriter, r *http.Request, id string) {
	dir := strings.TrimSuffix(r.URL.Query().Get("path"), "/") + "/"
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
	for p, b := range f.files[id] {
		if rest, ok := strings.CutPrefix(p, dir); ok && !strings.Contains(rest, "/") {
			typ := "file"
			if b == nil {
				typ = "dir"
			}
			out = append(out, fileWire(p, len(b), typ))
		}
	}
	writeJSON(w, 200, map[string]any{"entries": out, "truncated": false})
}

func (f *fakeServer) stat(w http.ResponseWriter, r *http.Request, id string) {
	p := r.URL.Query().Get("path")
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[id][p]
	if !ok {
		f.fail(w, 404, "not_found", "no such file")
		return
	}
	typ := "file"
	if b == nil {
		typ = "dir"
	}
	writeJSON(w, 200, fileWire(p, len(b), typ))
}

func (f *fakeServer) mkdir(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Path    string `json:"path"`
		Parents bool   `json:"parents"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || !validPath(in.Path) {
		f.fail(w, 400, "invalid", "bad path")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[id][in.Path] = nil // nil marks a directory
	w.WriteHeader(204)
}

func (f *fakeServer) rename(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || !validPath(in.From) || !validPath(in.To) {
		f.fail(w, 400, "invalid", "bad path")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[id][in.From]
	if !ok {
		f.fail(w, 404, "not_found", "no such file")
		return
	}
	delete(f.files[id], in.From)
	f.files[id][in.To] = b
	w.WriteHeader(204)
}

func (f *fakeServer) eventsHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, _ := strconv.ParseInt(q.Get("since"), 10, 64)
	limit, _ := strconv.Atoi(q.Get("limit"))
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
	next := since
	for _, ev := range f.events {
		seq := int64(ev["seq"].(int))
		action, _ := ev["action"].(string)
		if typ := q.Get("type"); typ != "" && action != typ && !strings.HasPrefix(action, typ+".") {
			continue
		}
		if seq <= since || (q.Get("sandbox") != "" && ev["sandbox_id"] != q.Get("sandbox")) {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, ev)
		next = seq
	}
	writeJSON(w, 200, map[string]any{"events": out, "next": next})
}

// TestLiveAgainstFake runs the live test's body against the fake server, so
// that the live tier's own code is exercised by the unit tier (-short
// included: it needs no server of its own).
func TestLiveAgainstFake(t *testing.T) {
	f := newFakeServer(t)
	liveSandbox(t, airlock.New(f.srv.URL, f.key))
}

// fakePNG is the image the fake's "plot()" returns.
var fakePNG = []byte("\x89PNG\r\n\x1a\nfake")

// code interprets: "x = N" stores x, "x * N" yields a main result, "plot()"
// a PNG display result, "print(S)" stdout, "1/0" a ZeroDivisionError,
// "while True: pass" times out. Variables are per sandbox (one context).
func (f *fakeServer) code(w http.ResponseWriter, r *http.Request, id string) {
	var req struct {
		Code        string   `json:"code"`
		Language    string   `json:"language"`
		Context     string   `json:"context"`
		TimeoutS    int      `json:"timeout_s"`
		ReturnFiles []string `json:"return_files"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		f.fail(w, 400, "invalid", "bad body")
		return
	}
	if req.Context != "" && req.Context != "python-default" && req.Context != "c1" {
		f.fail(w, 404, "not_found", "context not found")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	end := map[string]any{"type": "end", "timed_out": false, "truncated": false, "duration_ms": 3, "execution_count": 1, "context": "python-default"}
	f.mu.Lock()
	if f.vars == nil {
		f.vars = map[string]int{}
	}
	f.mu.Unlock()
	for _, line := range strings.Split(req.Code, "\n") {
		line = strings.TrimSpace(line)
		var name string
		var n int
		switch {
		case line == "1/0":
			_ = enc.Encode(map[string]any{"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": []string{"Traceback", "ZeroDivisionError: division by zero"}})
		case line == "while True: pass":
			end["timed_out"] = true
		case line == "cold":
			_ = enc.Encode(map[string]any{"type": "status", "data": "starting python context"})
		case line == "plot()":
			_ = enc.Encode(map[string]any{"type": "result", "main": false, "data": map[string]string{"image/png": base64.StdEncoding.EncodeToString(fakePNG), "text/plain": "<Figure>"}})
		case strings.HasPrefix(line, "print("):
			_ = enc.Encode(map[string]any{"type": "stdout", "data": strings.Trim(line[6:len(line)-1], `"'`) + "\n"})
		case strings.HasPrefix(line, "eprint("):
			_ = enc.Encode(map[string]any{"type": "stderr", "data": strings.Trim(line[7:len(line)-1], `"'`) + "\n"})
		default:
			if k, _ := fmt.Sscanf(line, "%s = %d", &name, &n); k == 2 {
				f.mu.Lock()
				f.vars[name] = n
				f.mu.Unlock()
			} else if k, _ := fmt.Sscanf(line, "%s * %d", &name, &n); k == 2 {
				f.mu.Lock()
				v := f.vars[name]
				f.mu.Unlock()
				_ = enc.Encode(map[string]any{"type": "result", "main": true, "data": map[string]string{"text/plain": strconv.Itoa(v * n)}})
			}
		}
	}
	for _, p := range req.ReturnFiles {
		_ = enc.Encode(map[string]any{"type": "result", "main": false, "file": p, "data": map[string]string{"image/png": base64.StdEncoding.EncodeToString(fakePNG)}})
	}
	_ = enc.Encode(end)
}

func (f *fakeServer) listContexts(w http.ResponseWriter, _ *http.Request, _ string) {
	writeJSONResp(w, 200, map[string]any{"contexts": []map[string]any{{"id": "c1", "language": "python", "state": "idle", "created_at": "2026-01-02T03:04:05Z"}}})
}

func (f *fakeServer) createContext(w http.ResponseWriter, r *http.Request, _ string) {
	var req map[string]any
	_ = json.NewDecoder(r.Body).Decode(&req)
	id, _ := req["id"].(string)
	if id == "" {
		id = "ctx-1"
	}
	lang, _ := req["language"].(string)
	writeJSONResp(w, 201, map[string]any{"id": id, "language": lang, "state": "idle", "created_at": "2026-01-02T03:04:05Z"})
}

func (f *fakeServer) contextOp(w http.ResponseWriter, r *http.Request, _ string) {
	if r.PathValue("ctx") != "c1" {
		f.fail(w, 404, "not_found", "context not found")
		return
	}
	if strings.HasSuffix(r.URL.Path, "/restart") {
		writeJSONResp(w, 200, map[string]any{"id": "c1", "language": "python", "state": "idle", "created_at": "2026-01-02T03:04:05Z"})
		return
	}
	w.WriteHeader(204)
}

func writeJSONResp(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (f *fakeServer) snapshot(w http.ResponseWriter, r *http.Request, id string) {
	var in struct {
		Name  string `json:"name"`
		Force bool   `json:"force"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Name == "" {
		f.fail(w, 400, "invalid", "name is required")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.snapshots[in.Name]; ok {
		f.fail(w, 409, "conflict", "the tenant already has a snapshot of that name")
		return
	}
	sb := f.sandboxes[id]
	sn := map[string]any{"name": in.Name, "id": fmt.Sprintf("snap%d", len(f.snapshots)), "sandbox_id": id, "tenant": "t1",
		"image": sb["image"], "image_digest": "sha256:abc", "cpus": sb["cpus"], "memory_mb": sb["memory_mb"], "disk_mb": 2048,
		"network": sb["network"], "size_bytes": 64 << 20, "created_at": time.Now().UTC().Format(time.RFC3339)}
	f.snapshots[in.Name] = sn
	f.event(id, "snapshot.create", map[string]any{"name": in.Name, "force": in.Force})
	writeJSON(w, 201, sn)
}

func (f *fakeServer) listSnapshots(w http.ResponseWriter, _ *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
	for _, sn := range f.snapshots {
		out = append(out, sn)
	}
	writeJSON(w, 200, map[string]any{"snapshots": out})
}

func (f *fakeServer) getSnapshot(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sn, ok := f.snapshots[r.PathValue("name")]
	if !ok {
		f.fail(w, 404, "not_found", "snapshot not found")
		return
	}
	writeJSON(w, 200, sn)
}

// deleteSnapshot refuses while a sandbox made from the snapshot exists.
func (f *fakeServer) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name := r.PathValue("name")
	if _, ok := f.snapshots[name]; !ok {
		f.fail(w, 404, "not_found", "snapshot not found")
		return
	}
	for _, sb := range f.sandboxes {
		if sb["source"] == "snapshot:"+name {
			f.fail(w, 412, "failed_precondition", "the snapshot backs the disks of sandboxes")
			return
		}
	}
	delete(f.snapshots, name)
	w.WriteHeader(204)
}

// prune: the fake's key is not an admin key.
func (f *fakeServer) prune(w http.ResponseWriter, _ *http.Request) {
	f.fail(w, 403, "permission_denied", "pruning snapshots needs an admin key")
}

func (f *fakeServer) fork(w http.ResponseWriter, r *http.Request, id string) {
	in := struct {
		Count int  `json:"count"`
		Force bool `json:"force"`
	}{Count: 1}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil && err != io.EOF {
		f.fail(w, 400, "invalid", "bad json")
		return
	}
	if in.Count < 1 || in.Count > 16 {
		f.fail(w, 400, "invalid", "count must be between 1 and 16")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src := f.sandboxes[id]
	out := []map[string]any{}
	for range in.Count {
		f.nextID++
		fid := fmt.Sprintf("sb%010d", f.nextID)
		sb := map[string]any{}
		for k, v := range src {
			sb[k] = v
		}
		sb["id"], sb["source"] = fid, "fork:"+id
		f.sandboxes[fid] = sb
		f.files[fid] = map[string][]byte{}
		f.execs[fid] = map[string]*fakeExec{}
		out = append(out, sb)
	}
	f.event(id, "sandbox.fork", map[string]any{"count": in.Count})
	writeJSON(w, 201, map[string]any{"sandboxes": out})
}
