package api

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

func ndjsonLines(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(string(body)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func TestRunCodeStreams(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/code", strings.NewReader(`{"code":"1/0","timeout_s":5}`))
	if r.code != http.StatusOK || r.hdr.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s", r.code, r.body)
	}
	lines := ndjsonLines(t, r.body)
	types := []string{}
	for _, l := range lines {
		types = append(types, l["type"].(string))
	}
	if strings.Join(types, ",") != "stdout,stderr,result,result,error,end" {
		t.Fatalf("types %v", types)
	}
	if lines[1]["data"] != "warn\uFFFD" {
		t.Fatalf("stderr %q", lines[1]["data"])
	}
	d := lines[2]["data"].(map[string]any)
	if png, _ := base64.StdEncoding.DecodeString(d["image/png"].(string)); string(png) != string(fakePNG) || d["text/plain"] != "<Figure>" || lines[2]["main"] != false {
		t.Fatalf("display result %v", lines[2])
	}
	if lines[3]["main"] != true || lines[3]["data"].(map[string]any)["text/plain"] != "42" {
		t.Fatalf("main result %v", lines[3])
	}
	if lines[4]["name"] != "ZeroDivisionError" || len(lines[4]["traceback"].([]any)) != 2 {
		t.Fatalf("error %v", lines[4])
	}
	end := lines[5]
	if end["context"] != "python-default" || end["execution_count"] != 3.0 || end["timed_out"] != false || end["duration_ms"] != 7.0 {
		t.Fatalf("end %v", end)
	}
	h.fake.mu.Lock()
	run := h.fake.runs[len(h.fake.runs)-1]
	h.fake.mu.Unlock()
	if run.Timeout != 5*time.Second || run.Code != "1/0" {
		t.Fatalf("request %v", run)
	}
	// The manager records code.run (internal/shim TestManagerAuditsEverySurface).

	for _, c := range []struct {
		body string
		code int
	}{
		{`{"code":"x","language":"cobol"}`, 400},
		{`{"code":"x","context":"Bad"}`, 400},
		{`{"code":"x","context":"c1","language":"python"}`, 400},
		{`{"code":"x","timeout_s":-1}`, 400},
		{`{"code":"x","context":"nope"}`, 404},
		{`{"code":"old"}`, 412},
	} {
		r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/code", strings.NewReader(c.body))
		if r.code != c.code {
			t.Errorf("%s: %d %s", c.body, r.code, r.body)
		}
	}
}

// TestRunCodeStatusAndFiles: status events are status lines (a context
// still starting), return_files reaches the manager, and a returned file
// is a result line with its path.
func TestRunCodeStatusAndFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/code", strings.NewReader(`{"code":"cold","return_files":["*.png"]}`))
	if r.code != http.StatusOK {
		t.Fatalf("%d %s", r.code, r.body)
	}
	lines := ndjsonLines(t, r.body)
	if lines[0]["type"] != "status" || lines[0]["data"] != "starting python context" {
		t.Fatalf("first line %v", lines[0])
	}
	file := lines[len(lines)-2]
	if file["type"] != "result" || file["file"] != "*.png" || file["main"] != false {
		t.Fatalf("file result %v", file)
	}
	if _, ok := lines[2]["file"]; ok {
		t.Fatalf("a result of the code has a file: %v", lines[2])
	}
	h.fake.mu.Lock()
	run := h.fake.runs[len(h.fake.runs)-1]
	h.fake.mu.Unlock()
	if len(run.ReturnFiles) != 1 || run.ReturnFiles[0] != "*.png" {
		t.Fatalf("request %v", run)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/code", strings.NewReader(`{"code":"x","return_files":["[a"]}`)); r.code != 400 {
		t.Fatalf("bad pattern: %d %s", r.code, r.body)
	}
}

func TestContextRoutes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	base := "/v1/sandboxes/aliceaaaaaaa/contexts"
	r := h.do(h.alice, "POST", base, strings.NewReader(`{"id":"js","language":"javascript","env":{"B":"2","A":"1"}}`))
	var c Context
	if r.code != http.StatusCreated || json.Unmarshal(r.body, &c) != nil || c.ID != "js" || c.Language != "javascript" {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	h.fake.mu.Lock()
	env := h.fake.ctxReqs[0].Env
	h.fake.mu.Unlock()
	if strings.Join(env, ",") != "A=1,B=2" {
		t.Fatalf("env %v", env)
	}
	if r := h.do(h.alice, "POST", base, strings.NewReader(`{"language":"ruby"}`)); r.code != 400 {
		t.Fatalf("bad language: %d", r.code)
	}
	r = h.do(h.alice, "GET", base, nil)
	var list struct{ Contexts []Context }
	if r.code != 200 || json.Unmarshal(r.body, &list) != nil || len(list.Contexts) != 2 || !list.Contexts[0].IsDefault || list.Contexts[0].Exit != nil {
		t.Fatalf("list: %d %s", r.code, r.body)
	}
	// A dead context says how it ended.
	if !strings.Contains(string(r.body), `"exit":{"reason":"out of memory","code":-1,"signal":9,"oom_killed":true}`) {
		t.Fatalf("list: the dead context's exit is missing: %s", r.body)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{"POST", base + "/c1/restart", 200},
		{"POST", base + "/c1/interrupt", 204},
		{"DELETE", base + "/c1", 204},
		{"DELETE", base + "/other", 404},
		{"POST", base + "/BAD/interrupt", 404},
	} {
		if r := h.do(h.alice, c.method, c.path, nil); r.code != c.code {
			t.Errorf("%s %s: %d %s", c.method, c.path, r.code, r.body)
		}
	}
}
