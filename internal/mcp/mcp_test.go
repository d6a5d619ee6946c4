package mcp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// connect serves one stdio-style session over in-memory transports and
// returns its client; the returned func ends it and waits for cleanup.
func connect(t *testing.T, h *Handler) (*sdk.ClientSession, func()) {
	t.Helper()
	ct, st := sdk.NewInMemoryTransports()
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- h.ServeStdio(ctx, st) }()
	c := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil)
	cs, err := c.Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	end := func() {
		_ = cs.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeStdio: %v", err)
		}
	}
	return cs, end
}

func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) (string, *sdk.CallToolResult) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res
}

func newHandler(t *testing.T, f *fake, mod func(*Config)) *Handler {
	cfg := Config{Service: f}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

func TestToolsList(t *testing.T) {
	h := newHandler(t, newFake(), nil)
	cs, end := connect(t, h)
	defer end()
	res, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("%s: no description or schema", tl.Name)
		}
	}
	want := []string{"browser_click", "browser_download", "browser_eval", "browser_navigate", "browser_press", "browser_screenshot",
		"browser_scroll", "browser_snapshot", "browser_tab_close", "browser_tab_new", "browser_tab_switch", "browser_tabs", "browser_text", "browser_type",
		"context_create", "context_list", "context_reset", "exec", "file_list", "file_read", "file_write",
		"run_code", "sandbox_create", "sandbox_fork", "sandbox_kill", "sandbox_list", "sandbox_network_set", "sandbox_pause", "sandbox_resume", "sandbox_secret_remove", "sandbox_secret_set", "sandbox_set_timeout", "sandbox_snapshot"}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("tools = %v, want %v", names, want)
	}
}

func TestSessionLifecycle(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)

	txt, res := call(t, cs, "exec", map[string]any{"cmd": []string{"echo", "hi"}})
	if res.IsError || !strings.Contains(txt, "echo hi") || !strings.Contains(txt, "exit_code: 0") {
		t.Fatalf("exec: %q", txt)
	}
	if ids := f.ids(); len(ids) != 1 {
		t.Fatalf("sandboxes after exec = %v, want the session's one", ids)
	}
	def := f.ids()[0]
	txt, res = call(t, cs, "exec", map[string]any{"cmd": []string{"balloon"}})
	if !res.IsError || !strings.Contains(txt, "killed: out of memory") || !strings.Contains(txt, "killed by signal 9") {
		t.Errorf("OOM-killed exec: %q", txt)
	}
	txt, res = call(t, cs, "exec", map[string]any{"cmd": []string{"fail"}})
	if !res.IsError || !strings.Contains(txt, "boom") || !strings.Contains(txt, "exit_code: 3") {
		t.Errorf("failing exec: %q", txt)
	}
	if ids := f.ids(); len(ids) != 1 {
		t.Errorf("the default sandbox was not reused: %v", ids)
	}

	txt, res = call(t, cs, "sandbox_create", map[string]any{"cpus": 2, "metadata": map[string]string{"a": "b"}})
	if res.IsError {
		t.Fatalf("create: %s", txt)
	}
	var sb sandboxView
	if err := json.Unmarshal([]byte(txt), &sb); err != nil || sb.CPUs != 2 {
		t.Fatalf("create: %q (%v)", txt, err)
	}
	rs, err := cs.ListResources(t.Context(), nil)
	if err != nil || len(rs.Resources) != 2 {
		t.Fatalf("resources = %v, %v; want 2", rs, err)
	}
	rr, err := cs.ReadResource(t.Context(), &sdk.ReadResourceParams{URI: "airlock://sandbox/" + sb.ID})
	if err != nil || !strings.Contains(rr.Contents[0].Text, sb.ID) {
		t.Errorf("read resource: %v %v", rr, err)
	}
	if txt, res = call(t, cs, "sandbox_set_timeout", map[string]any{"sandbox_id": sb.ID, "timeout_s": 120}); res.IsError {
		t.Errorf("set timeout: %s", txt)
	}
	if txt, _ = call(t, cs, "sandbox_list", nil); !strings.Contains(txt, sb.ID) || !strings.Contains(txt, def) {
		t.Errorf("list: %s", txt)
	}
	if txt, res = call(t, cs, "sandbox_kill", map[string]any{"sandbox_id": sb.ID}); res.IsError {
		t.Errorf("kill: %s", txt)
	}
	if rs, _ = cs.ListResources(t.Context(), nil); len(rs.Resources) != 1 {
		t.Errorf("resources after kill = %d, want 1", len(rs.Resources))
	}
	end()
	if ids := f.ids(); len(ids) != 0 {
		t.Errorf("sandboxes left after the session ended: %v", ids)
	}
	acts := f.actions()
	for _, want := range []string{"sandbox.create", "sandbox.timeout", "sandbox.delete"} {
		if !slices.ContainsFunc(acts, func(a string) bool { return strings.HasPrefix(a, want+":mcp:") }) {
			t.Errorf("audit %v lacks %s", acts, want)
		}
	}
}

func TestKeepSandboxes(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, func(c *Config) { c.KeepSandboxes = true })
	cs, end := connect(t, h)
	call(t, cs, "sandbox_create", nil)
	end()
	if len(f.ids()) != 1 {
		t.Errorf("--keep-sandboxes: sandbox removed")
	}
}

func TestRunCodeAndFiles(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	cs, end := connect(t, h)
	defer end()
	txt, res := call(t, cs, "run_code", map[string]any{"code": "x = 41 + 1"})
	if res.IsError || !strings.Contains(txt, "ran x = 41 + 1") || !strings.Contains(txt, "--- result ---\n42") {
		t.Errorf("run_code: %q", txt)
	}
	var img *sdk.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*sdk.ImageContent); ok {
			img = ic
		}
	}
	if img == nil || img.MIMEType != "image/png" || string(img.Data) != string(png) {
		t.Errorf("run_code image = %+v", img)
	}
	// return_files: each file is an image, named in the text.
	txt, res = call(t, cs, "run_code", map[string]any{"code": "savefig", "return_files": []string{"out/*.png"}})
	n := 0
	for _, c := range res.Content {
		if _, ok := c.(*sdk.ImageContent); ok {
			n++
		}
	}
	if res.IsError || n != 2 || !strings.Contains(txt, "--- file out/*.png (an image) ---") {
		t.Errorf("run_code return_files: %d images, %q", n, txt)
	}
	// A context that is still starting at the deadline says so.
	if txt, res = call(t, cs, "run_code", map[string]any{"code": "cold"}); !res.IsError || !strings.Contains(txt, "while the code context was starting (still starting python context (25s))") {
		t.Errorf("run_code past its deadline while starting: %q", txt)
	}
	txt, res = call(t, cs, "run_code", map[string]any{"code": "raise"})
	if !res.IsError || !strings.Contains(txt, "ValueError: bad") || !strings.Contains(txt, "Traceback") {
		t.Errorf("run_code error: %q", txt)
	}
	if _, res = call(t, cs, "run_code", map[string]any{"code": "1", "language": "cobol"}); !res.IsError {
		t.Error("bad language accepted")
	}
	if txt, res = call(t, cs, "context_create", map[string]any{"id": "c1"}); res.IsError || !strings.Contains(txt, `"c1"`) {
		t.Errorf("context_create: %s", txt)
	}
	if txt, _ = call(t, cs, "context_list", nil); !strings.Contains(txt, `"python"`) {
		t.Errorf("context_list: %s", txt)
	}
	if txt, res = call(t, cs, "context_reset", map[string]any{"context": "nope"}); !res.IsError || !strings.Contains(txt, "no context") {
		t.Errorf("context_reset of a missing context: %s", txt)
	}

	if txt, res = call(t, cs, "file_write", map[string]any{"path": "/root/a.txt", "content": "hello"}); res.IsError {
		t.Fatalf("file_write: %s", txt)
	}
	if txt, _ = call(t, cs, "file_read", map[string]any{"path": "/root/a.txt"}); txt != "hello" {
		t.Errorf("file_read = %q", txt)
	}
	if txt, _ = call(t, cs, "file_read", map[string]any{"path": "/root/a.txt", "max_bytes": 2}); !strings.HasPrefix(txt, "he\n[truncated") {
		t.Errorf("capped file_read = %q", txt)
	}
	call(t, cs, "file_write", map[string]any{"path": "/root/p.png", "content": "iVBORw0KGgpmYWtlcG5n", "encoding": "base64"})
	txt, res = call(t, cs, "file_read", map[string]any{"path": "/root/p.png"})
	if !strings.Contains(txt, "iVBORw0KGgpmYWtlcG5n") || len(res.Content) != 2 {
		t.Errorf("binary file_read = %q (%d parts)", txt, len(res.Content))
	}
	if txt, _ = call(t, cs, "file_list", map[string]any{"path": "/root/"}); !strings.Contains(txt, "/root/a.txt") {
		t.Errorf("file_list: %s", txt)
	}
	if txt, res = call(t, cs, "file_read", map[string]any{"path": "relative"}); !res.IsError || !strings.Contains(txt, "absolute") {
		t.Errorf("relative path: %s", txt)
	}
}

func TestOutputCap(t *testing.T) {
	h := newHandler(t, newFake(), func(c *Config) { c.MaxOutputBytes = 1000 })
	cs, end := connect(t, h)
	defer end()
	txt, _ := call(t, cs, "exec", map[string]any{"cmd": []string{"big"}})
	if len(txt) > 2000 || !strings.Contains(txt, "stdout truncated: 1047576 more bytes dropped") {
		t.Errorf("capped exec: %d bytes, %q", len(txt), txt[max(0, len(txt)-300):])
	}
}

func TestValidation(t *testing.T) {
	h := newHandler(t, newFake(), nil)
	cs, end := connect(t, h)
	defer end()
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"sandbox_create", map[string]any{"network": "open"}, "network"},
		{"sandbox_create", map[string]any{"image": "nope"}, "unknown image"},
		{"sandbox_kill", map[string]any{"sandbox_id": "nope"}, "sandbox not found"},
		{"sandbox_set_timeout", map[string]any{"sandbox_id": "x", "timeout_s": 0}, "timeout_s"},
		{"exec", map[string]any{"cmd": []string{}}, "cmd"},
		{"exec", map[string]any{"cmd": []string{"x"}, "timeout_s": 999999}, "timeout_s"},
	} {
		txt, res := call(t, cs, tc.tool, tc.args)
		if !res.IsError || !strings.Contains(txt, tc.want) {
			t.Errorf("%s %v = %q, want an error about %q", tc.tool, tc.args, txt, tc.want)
		}
	}
}

// TestHTTPTenants checks that HTTP sessions see only their tenant's
// sandboxes, stay bound to their key, and lose their sandboxes on DELETE.
func TestHTTPTenants(t *testing.T) {
	f := newFake()
	h := newHandler(t, f, nil)
	keys := map[string]Principal{"ka": {Tenant: "a", KeyID: "ka"}, "kb": {Tenant: "b", KeyID: "kb"}}
	hh := h.HTTPHandler(func(r *http.Request) (Principal, bool) {
		p, ok := keys[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		return p, ok
	})
	srv := httptest.NewServer(hh)
	defer srv.Close()
	open := func(key string) *sdk.ClientSession {
		hc := &http.Client{Transport: bearer{key}}
		c := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil)
		cs, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	a, b := open("ka"), open("kb")
	txt, _ := call(t, a, "sandbox_create", nil)
	var sb sandboxView
	_ = json.Unmarshal([]byte(txt), &sb)
	if txt, _ = call(t, b, "sandbox_list", nil); strings.Contains(txt, sb.ID) {
		t.Errorf("tenant b sees a's sandbox: %s", txt)
	}
	if txt, res := call(t, b, "sandbox_kill", map[string]any{"sandbox_id": sb.ID}); !res.IsError {
		t.Errorf("tenant b killed a's sandbox: %s", txt)
	}
	if txt, _ = call(t, a, "sandbox_list", nil); !strings.Contains(txt, sb.ID) {
		t.Errorf("tenant a does not see its sandbox: %s", txt)
	}
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Post(srv.URL, "application/json", strings.NewReader(`{}`)); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no key: %v %v", resp, err)
	}
	_ = a.Close() // DELETE ends the session
	deadline := time.Now().Add(5 * time.Second)
	for len(f.ids()) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ids := f.ids(); len(ids) != 0 {
		t.Errorf("sandboxes left after the HTTP session ended: %v", ids)
	}
	_ = b.Close()
	if err := h.Close(t.Context()); err != nil {
		t.Error(err)
	}
}

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}
