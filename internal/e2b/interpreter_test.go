package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// fakeContexts keeps contexts in memory; a run prints its code, split in
// the middle of a UTF-8 character, shows a PNG and, for code "1/0", raises.
type fakeContexts struct {
	mu   sync.Mutex
	ctxs []guest.ContextInfo
	runs []guest.CodeRequest
}

func (f *fakeContexts) CreateContext(_ context.Context, _ sandbox.Caller, _ string, spec guest.ContextSpec) (guest.ContextInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ci := guest.ContextInfo{ID: fmt.Sprintf("ctx%d", len(f.ctxs)), Language: spec.Language, Cwd: spec.Cwd}
	f.ctxs = append(f.ctxs, ci)
	return ci, nil
}

func (f *fakeContexts) ListContexts(context.Context, sandbox.Caller, string) ([]guest.ContextInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]guest.ContextInfo{{ID: "python", Language: "python", IsDefault: true}}, f.ctxs...), nil
}

func (f *fakeContexts) find(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.ctxs {
		if c.ID == id {
			return nil
		}
	}
	return fmt.Errorf("%w: context", errdefs.ErrNotFound)
}

func (f *fakeContexts) DeleteContext(_ context.Context, _ sandbox.Caller, _, id string) error {
	return f.find(id)
}

func (f *fakeContexts) RestartContext(_ context.Context, _ sandbox.Caller, _, id string) (guest.ContextInfo, error) {
	return guest.ContextInfo{ID: id}, f.find(id)
}

func (f *fakeContexts) InterruptContext(context.Context, sandbox.Caller, string, string) error {
	return nil
}

func (f *fakeContexts) RunCode(_ context.Context, _ sandbox.Caller, _ string, req guest.CodeRequest, fn func(guest.CodeEvent) error) error {
	f.mu.Lock()
	f.runs = append(f.runs, req)
	f.mu.Unlock()
	if req.ContextID != "" {
		if err := f.find(req.ContextID); err != nil {
			return err
		}
	}
	out := []byte("é" + req.Code)
	evs := []guest.CodeEvent{
		{Kind: guest.EventStdout, Data: out[:1]}, // half of é
		{Kind: guest.EventStdout, Data: out[1:]},
		{Kind: guest.EventResult, Result: &guest.CodeResult{Main: true, Data: map[string][]byte{"text/plain": []byte("'42'"), "image/png": {0x89, 'P', 'N', 'G'}, "application/json": []byte(`{"a":1}`)}}},
	}
	if req.Code == "1/0" {
		evs = append(evs, guest.CodeEvent{Kind: guest.EventError, Error: &guest.CodeError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: []string{"line 1", "line 2"}}})
	}
	evs = append(evs, guest.CodeEvent{Kind: guest.EventEnd, End: &guest.CodeEnd{ExecutionCount: 3}})
	for _, ev := range evs {
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

func TestInterpreter(t *testing.T) {
	h := newHarness(t)
	sb := h.envdSandbox()
	if sb.TrafficAccessToken == nil || *sb.TrafficAccessToken == *sb.EnvdAccessToken {
		t.Fatalf("traffic token: %v", sb.TrafficAccessToken)
	}
	hdr := func(extra ...string) []string {
		return append([]string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", interpreterPort, "Content-Type", "application/json"}, extra...)
	}
	traffic := []string{"E2B-Traffic-Access-Token", *sb.TrafficAccessToken}
	for name, extra := range map[string][]string{"no token": nil, "a wrong token": {"E2B-Traffic-Access-Token", "x"}, "the envd token as traffic token": {"E2B-Traffic-Access-Token", *sb.EnvdAccessToken}} {
		if r := h.do("", "POST", "/execute", `{"code":"1"}`, hdr(extra...)...); r.code != http.StatusUnauthorized {
			t.Errorf("execute with %s: %d %s", name, r.code, r.body)
		}
	}
	if len(h.contexts.runs) != 0 {
		t.Fatal("code ran without a token")
	}
	r := h.do("", "POST", "/execute", `{"code":"1/0"}`, hdr(traffic...)...)
	if r.code != 200 || r.hdr.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("execute: %d %v %s", r.code, r.hdr, r.body)
	}
	var types []string
	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSuffix(string(r.body), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		types = append(types, m["type"].(string))
		lines = append(lines, m)
	}
	if got := strings.Join(types, ","); got != "stdout,result,error,number_of_executions,end_of_execution" {
		t.Fatalf("lines: %s\n%s", got, r.body)
	}
	if lines[0]["text"] != "é1/0" {
		t.Fatalf("stdout split inside a character: %q", lines[0]["text"])
	}
	if res := lines[1]; res["is_main_result"] != true || res["text"] != "42" || res["png"] != "iVBORw==" || res["json"].(map[string]any)["a"] != 1.0 {
		t.Fatalf("result: %v", res)
	}
	if e := lines[2]; e["name"] != "ZeroDivisionError" || e["traceback"] != "line 1\nline 2" || lines[3]["execution_count"] != 3.0 {
		t.Fatalf("error and count: %v %v", e, lines[3])
	}
	// The envd token is accepted too (the SDK's /execute sends both).
	if r := h.do("", "POST", "/execute", `{"code":"1","language":"js"}`, hdr("X-Access-Token", *sb.EnvdAccessToken)...); r.code != 200 || h.contexts.runs[1].Language != "javascript" {
		t.Fatalf("execute with the envd token: %d %s", r.code, r.body)
	}
	for body, want := range map[string]int{
		`{"code":"1","context_id":"ctx9","language":"python"}`: 400,
		`{"code":"1","language":"r"}`:                          400,
		`{"code":"1","env_vars":{"A":"1"}}`:                    400,
		`{"code":"1","context_id":"ctx9"}`:                     404,
		`{"code":"1","context_id":"../x"}`:                     404,
		`{`:                                                    400,
	} {
		if r := h.do("", "POST", "/execute", body, hdr(traffic...)...); r.code != want {
			t.Errorf("execute %s: %d %s, want %d", body, r.code, r.body, want)
		}
	}
	// Contexts: create, list (without the default ones), restart, remove.
	r = h.do("", "POST", "/contexts", `{"language":"python","cwd":"/tmp"}`, hdr(traffic...)...)
	var c e2bContext
	r.json(t, &c)
	if r.code != 200 || c.ID == "" || c.Language != "python" || c.Cwd != "/tmp" {
		t.Fatalf("create context: %d %s", r.code, r.body)
	}
	var listed []e2bContext
	h.do("", "GET", "/contexts", "", hdr(traffic...)...).json(t, &listed)
	if len(listed) != 1 || listed[0].ID != c.ID {
		t.Fatalf("list contexts: %+v", listed)
	}
	if r := h.do("", "POST", "/execute", `{"code":"1","context_id":"`+c.ID+`"}`, hdr(traffic...)...); r.code != 200 {
		t.Fatalf("execute in a context: %d %s", r.code, r.body)
	}
	if r := h.do("", "POST", "/contexts/"+c.ID+"/restart", "", hdr(traffic...)...); r.code != 200 {
		t.Fatalf("restart: %d %s", r.code, r.body)
	}
	if r := h.do("", "DELETE", "/contexts/"+c.ID, "", hdr(traffic...)...); r.code != 200 {
		t.Fatalf("remove: %d %s", r.code, r.body)
	}
	if r := h.do("", "DELETE", "/contexts/nope", "", hdr(traffic...)...); r.code != 404 || string(r.body) != "Context nope not found" {
		t.Fatalf("remove a missing context: %d %s", r.code, r.body)
	}
}
