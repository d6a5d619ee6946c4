package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/apispec"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

type harness struct {
	t                 testing.TB
	url               string
	catalog           string // the catalog's file
	fake              *fake
	st                *store.Store
	alice, bob, admin string      // keys
	logs              *syncBuffer // the server's log, at debug level
	sec               *fakeSecrets
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// newHarness serves a Server on the fake; tune, if any, sets its test
// knobs before it serves.
func newHarness(t testing.TB, aliceLimits store.APIKey, tune ...func(*Server)) *harness {
	t.Helper()
	catalog := filepath.Join(t.TempDir(), "catalog.db")
	st, err := store.Open(t.Context(), catalog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &harness{t: t, catalog: catalog, fake: newFake(), st: st, logs: &syncBuffer{}}
	h.fake.ev = st
	aliceLimits.Tenant = "alice"
	_, h.alice, _ = st.CreateKey(t.Context(), aliceLimits)
	_, h.bob, _ = st.CreateKey(t.Context(), store.APIKey{Tenant: "bob"})
	_, h.admin, err = st.CreateKey(t.Context(), store.APIKey{Tenant: "ops", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	// Volumes and templates are the real manager's, on the harness's
	// catalog (mkfs.ext4 makes volume images in a temporary state dir; a
	// template build gets as far as its Dockerfile and FROM, as no image
	// is there).
	vols := &sandbox.Manager{L: statedir.Layout{Root: t.TempDir()}, Store: st, DiskReserve: -1}
	h.sec = &fakeSecrets{Manager: vols, f: h.fake}
	s, err := New(Config{Sandboxes: h.fake, Files: h.fake, Execs: h.fake, Contexts: h.fake, Ports: h.fake, Browsers: h.fake, Snapshots: h.fake, Volumes: vols, Templates: vols, Secrets: h.sec, Events: st, Keys: st,
		Log: slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tune {
		f(s)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	h.url = srv.URL
	h.fake.add("aliceaaaaaaa", "alice")
	h.fake.add("bobbbbbbbbbb", "bob")
	return h
}

type resp struct {
	code int
	hdr  http.Header
	body []byte
}

func (h *harness) do(key, method, path string, body io.Reader) resp {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.url+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if err := apispec.Check(method, path, res.StatusCode, res.Header.Get("Content-Type"), b); err != nil {
		h.t.Errorf("the response departs from api/openapi.yaml: %v", err)
	}
	return resp{res.StatusCode, res.Header, b}
}

type errBody struct {
	Error struct{ Code, Message, RequestID string }
}

func (r resp) err(t *testing.T) errBody {
	t.Helper()
	var e errBody
	if err := json.Unmarshal(r.body, &e); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	var raw map[string]map[string]string
	_ = json.Unmarshal(r.body, &raw)
	e.Error.RequestID = raw["error"]["request_id"]
	if e.Error.RequestID == "" || e.Error.RequestID != r.hdr.Get("X-Request-Id") {
		t.Fatalf("request id %q in body, %q in header", e.Error.RequestID, r.hdr.Get("X-Request-Id"))
	}
	return e
}

// concrete fills a route pattern with the given sandbox id (a route for
// all methods is tried with POST).
func concrete(pattern, id string) (method, path string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = http.MethodPost, pattern
	}
	path = strings.ReplaceAll(path, "{id}", id)
	path = strings.ReplaceAll(path, "{exec_id}", fakeExecID)
	path = strings.ReplaceAll(path, "{ctx}", "c1")
	path = strings.ReplaceAll(path, "{port}", "8000")
	path = strings.ReplaceAll(path, "{path...}", "index.html")
	if strings.Contains(path, "/files") {
		path += "?path=/etc/x"
	}
	return method, path
}

func TestThreat103SecureByDefault(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	for _, rt := range routes {
		m, p := concrete(rt.pattern, "aliceaaaaaaa")
		for _, key := range []string{"", "al_aaaaaaaa_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", h.alice + "x"} {
			r := h.do(key, m, p, strings.NewReader("{}"))
			if !rt.auth {
				if r.code != http.StatusOK {
					t.Errorf("%s: %d without auth", rt.pattern, r.code)
				}
				continue
			}
			if r.code != http.StatusUnauthorized || r.err(t).Error.Code != "unauthenticated" {
				t.Errorf("%s with key %q: %d %s", rt.pattern, key, r.code, r.body)
			}
		}
	}
	evs, _ := h.st.ListEvents(t.Context(), store.EventFilter{})
	if len(evs) == 0 || evs[0].Action != "auth.denied" {
		t.Fatalf("no auth.denied events: %+v", evs)
	}
	for _, e := range evs {
		if strings.Contains(e.Action+toJSON(e.Detail), h.alice) {
			t.Fatal("a key was written to the audit trail")
		}
	}
}

func toJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestThreat104CrossTenantIsAbsence checks every sandbox route: another tenant's
// sandbox, a missing one and a malformed id answer the same bytes (except
// the request id).
func TestThreat104CrossTenantIsAbsence(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{RatePerMin: 60000}) // three requests per route, in one burst
	n := 0
	for _, rt := range routes {
		if !strings.Contains(rt.pattern, "{id}") {
			continue
		}
		n++
		var bodies []string
		for _, id := range []string{"bobbbbbbbbbb", "missingaaaaa", "BAD..id"} {
			m, p := concrete(rt.pattern, id)
			r := h.do(h.alice, m, p, strings.NewReader(`{"cmd":["true"],"path":"/x","signal":9,"timeout_s":5}`))
			e := r.err(t)
			if r.code != http.StatusNotFound {
				t.Errorf("%s on %s: %d %s", rt.pattern, id, r.code, r.body)
			}
			bodies = append(bodies, strings.Replace(string(r.body), e.Error.RequestID, "", 1))
		}
		if bodies[0] != bodies[1] || bodies[1] != bodies[2] {
			t.Errorf("%s: bodies differ:\n%s", rt.pattern, strings.Join(bodies, ""))
		}
		// The owner and admin get through (not 404 for the sandbox).
		for _, key := range []string{h.bob, h.admin} {
			m, p := concrete(rt.pattern, "bobbbbbbbbbb")
			if rt.pattern == "DELETE /v1/sandboxes/{id}" {
				continue
			}
			r := h.do(key, m, p, strings.NewReader(`{"cmd":["true"],"path":"/x","signal":9,"timeout_s":5}`))
			if r.code == http.StatusNotFound && strings.Contains(string(r.body), "sandbox not found") {
				t.Errorf("%s: owner/admin got %s", rt.pattern, r.body)
			}
		}
	}
	if n < 15 {
		t.Fatalf("only %d sandbox routes", n)
	}
}

func TestListAndEventsScoped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	ids := func(key string) string {
		var out struct{ Sandboxes []Sandbox }
		_ = json.Unmarshal(h.do(key, "GET", "/v1/sandboxes", nil).body, &out)
		var s []string
		for _, sb := range out.Sandboxes {
			s = append(s, sb.ID)
		}
		return strings.Join(s, ",")
	}
	if got := ids(h.alice); got != "aliceaaaaaaa" {
		t.Errorf("alice sees %q", got)
	}
	if got := ids(h.admin); !strings.Contains(got, "aliceaaaaaaa") || !strings.Contains(got, "bobbbbbbbbbb") {
		t.Errorf("admin sees %q", got)
	}
	h.do(h.bob, "PUT", "/v1/sandboxes/bobbbbbbbbbb/files?path=/secret", strings.NewReader("x"))
	var evs struct {
		Events []store.Event
		Next   int64
	}
	_ = json.Unmarshal(h.do(h.alice, "GET", "/v1/events", nil).body, &evs)
	if len(evs.Events) != 0 {
		t.Errorf("alice sees bob's events: %+v", evs.Events)
	}
	_ = json.Unmarshal(h.do(h.admin, "GET", "/v1/events", nil).body, &evs)
	if len(evs.Events) != 1 || evs.Events[0].Action != "file.write" || evs.Events[0].Detail["path"] != "/secret" || evs.Next != evs.Events[0].Seq {
		t.Errorf("admin events: %+v", evs)
	}
}

func TestQuotas(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{MaxSandboxes: 2, MaxVCPUs: 3, MaxMemoryMiB: 2048})
	create := func(body string) resp { return h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(body)) }
	if r := create(`{"cpus":4}`); r.code != 429 || !strings.Contains(r.err(t).Error.Message, "max_vcpus") {
		t.Errorf("vcpus: %d %s", r.code, r.body)
	}
	if r := create(`{"memory_mb":2048}`); r.code != 429 || !strings.Contains(r.err(t).Error.Message, "max_memory_mb") {
		t.Errorf("memory: %d %s", r.code, r.body)
	}
	if r := create(`{"env":{"K":"V"},"metadata":{"m":"1"}}`); r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	if o := h.fake.created[0]; o.Tenant != "alice" || o.Env["K"] != "V" {
		t.Errorf("create options %+v", o)
	}
	if r := create(`{}`); r.code != 429 || r.err(t).Error.Code != "resource_exhausted" || !strings.Contains(r.err(t).Error.Message, "max_sandboxes") {
		t.Errorf("sandboxes: %d %s", r.code, r.body)
	}
	if r := create(`{"network":"host"}`); r.code != 400 {
		t.Errorf("network: %d %s", r.code, r.body)
	}
}

func TestThreat099HostAPIAbuse(t *testing.T) {
	t.Parallel()
	// Burst 1 and a token every 30 s: the second request is refused
	// however slowly a loaded machine (-race, CI) runs the first.
	h := newHarness(t, store.APIKey{RatePerMin: 2})
	if r := h.do(h.alice, "GET", "/v1/sandboxes", nil); r.code != 200 {
		t.Fatalf("first request: %d %s", r.code, r.body)
	}
	last := h.do(h.alice, "GET", "/v1/sandboxes", nil)
	if last.code != 429 || !strings.Contains(last.err(t).Error.Message, "2 requests per minute") {
		t.Fatalf("second request: %d %s", last.code, last.body)
	}
	if r := h.do(h.bob, "GET", "/v1/sandboxes", nil); r.code != 200 {
		t.Fatalf("bob is limited by alice's bucket: %d", r.code)
	}
}

func TestBodyCap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	big := `{"metadata":{"k":"` + strings.Repeat("x", MaxJSONBody) + `"}}`
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(big))
	if r.code != 413 || r.err(t).Error.Code != "too_large" {
		t.Fatalf("%d %s", r.code, r.body[:min(len(r.body), 200)])
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"bogus":1}`)); r.code != 400 {
		t.Fatalf("unknown field: %d", r.code)
	}
}

func TestExecNDJSON(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	lines := func(r resp) []map[string]any {
		t.Helper()
		if r.code != 200 || r.hdr.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("%d %s %s", r.code, r.hdr.Get("Content-Type"), r.body)
		}
		var out []map[string]any
		for l := range strings.SplitSeq(strings.TrimSpace(string(r.body)), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			out = append(out, m)
		}
		return out
	}
	r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/exec", strings.NewReader(`{"cmd":["cat"],"env":{"B":"req"},"stdin":"hi"}`))
	ls := lines(r)
	if len(ls) != 4 || ls[0]["type"] != "start" || ls[0]["exec_id"] != fakeExecID || ls[0]["pid"] != 42.0 ||
		ls[1]["type"] != "stdout" || ls[1]["data"] != "out\uFFFD" || ls[2]["data"] != "hi" ||
		ls[3]["type"] != "exit" || ls[3]["code"] != 3.0 || ls[3]["signal"] != 0.0 || ls[3]["timeout"] != false {
		t.Fatalf("lines %v", ls)
	}
	if env := strings.Join(h.fake.starts[0].Env, " "); env != "A=sandbox B=req" || !h.fake.starts[0].Stdin {
		t.Errorf("env %q stdin %v", env, h.fake.starts[0].Stdin)
	}
	if a := h.fake.actors[0]; a.Tenant != "alice" || a.KeyID == "" {
		t.Errorf("actor %+v", a)
	}
	r = h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/exec?encoding=base64", strings.NewReader(`{"cmd":["cat"],"stdin":"`+base64.StdEncoding.EncodeToString([]byte("\x00\x01"))+`"}`))
	ls = lines(r)
	if ls[1]["data"] != base64.StdEncoding.EncodeToString([]byte("out\xff")) {
		t.Errorf("base64 stdout %v", ls[1])
	}
	r = h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/exec", strings.NewReader(`{"cmd":["sleep","9"],"background":true}`))
	if r.code != 202 || !strings.Contains(string(r.body), fakeExecID) {
		t.Errorf("background: %d %s", r.code, r.body)
	}
	ls = lines(h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/execs/"+fakeExecID+"/stream", nil))
	if ls[0]["type"] != "stdout" || ls[len(ls)-1]["type"] != "exit" {
		t.Errorf("stream: %v", ls)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/execs/bbbbbbbbbbbbbbbb", nil); r.code != 404 || r.err(t).Error.Message != "exec not found" {
		t.Errorf("missing exec: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/exec", strings.NewReader(`{"cmd":[]}`)); r.code != 400 {
		t.Errorf("empty cmd: %d", r.code)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	data := bytes.Repeat([]byte("0123456789"), 100_000)
	r := h.do(h.alice, "PUT", "/v1/sandboxes/aliceaaaaaaa/files?path=/tmp/f&mode=0600", bytes.NewReader(data))
	if r.code != 200 || !strings.Contains(string(r.body), `"size":1000000`) {
		t.Fatalf("put: %d %s", r.code, r.body)
	}
	r = h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files?path=/tmp/f", nil)
	if r.code != 200 || !bytes.Equal(r.body, data) || r.hdr.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("get: %d, %d bytes", r.code, len(r.body))
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files?path=/nope", nil); r.code != 404 || r.err(t).Error.Code != "not_found" {
		t.Fatalf("missing file: %d %s", r.code, r.body)
	}
	for _, p := range []string{"", "rel", "/a/../b", "/a/", "/a%00b"} {
		if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files/stat?path="+p, nil); r.code != 400 {
			t.Errorf("path %q: %d", p, r.code)
		}
	}
	if r := h.do(h.alice, "DELETE", "/v1/sandboxes/aliceaaaaaaa/files?path=/tmp/f", nil); r.code != 204 {
		t.Errorf("delete: %d", r.code)
	}
}

// TestRenameFile: the rename route moves a file; both paths are checked
// like any file route's, and another tenant's sandbox is not found.
func TestRenameFile(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	if r := h.do(h.alice, "PUT", "/v1/sandboxes/aliceaaaaaaa/files?path=/tmp/a", strings.NewReader("x")); r.code != 200 {
		t.Fatalf("put: %d %s", r.code, r.body)
	}
	if r := h.do(h.bob, "POST", "/v1/sandboxes/aliceaaaaaaa/files/rename", strings.NewReader(`{"from":"/tmp/a","to":"/tmp/b"}`)); r.code != 404 {
		t.Fatalf("bob renames in alice's sandbox: %d %s", r.code, r.body)
	}
	for _, tc := range []struct{ body, msg string }{
		{`{"from":"/tmp/a"}`, "to is required"},
		{`{"from":"tmp/a","to":"/tmp/b"}`, "from must be absolute"},
		{`{"from":"/tmp/a","to":"/tmp/../b"}`, "to must be clean"},
		{`{"from":"/","to":"/tmp/b"}`, "root directory"},
		{`{"from":"/tmp/a","to":"/tmp/b","x":1}`, ""},
	} {
		r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/files/rename", strings.NewReader(tc.body))
		if r.code != 400 || !strings.Contains(r.err(t).Error.Message, tc.msg) {
			t.Errorf("%s: %d %s; want 400 saying %q", tc.body, r.code, r.body, tc.msg)
		}
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/files/rename", strings.NewReader(`{"from":"/tmp/a","to":"/tmp/b"}`)); r.code != 204 {
		t.Fatalf("rename: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files?path=/tmp/b", nil); r.code != 200 || string(r.body) != "x" {
		t.Fatalf("the renamed file: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/files/stat?path=/tmp/a", nil); r.code != 404 {
		t.Fatalf("the old name: %d %s", r.code, r.body)
	}
}

func TestErrorsAndHealth(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do("", "GET", "/nope", nil)
	if r.code != 404 || r.err(t).Error.Code != "not_found" {
		t.Errorf("unknown route: %d %s", r.code, r.body)
	}
	if r := h.do("", "GET", "/healthz", nil); r.code != 200 || r.hdr.Get("X-Request-Id") == "" || strings.TrimSpace(string(r.body)) != `{"ok":true}` {
		t.Errorf("healthz: %d %s", r.code, r.body)
	}
	r = h.do("", "GET", "/metrics", nil)
	for _, m := range []string{"airlock_sandboxes{state=\"running\"} 2", "airlock_http_requests_total", "airlock_sandbox_creates_total"} {
		if !strings.Contains(string(r.body), m) {
			t.Errorf("metrics lack %s", m)
		}
	}
}

// TestThreat108TokenScopeAndRotation: a second key of a tenant (a
// rotation) reaches the tenant's sandboxes; revoking the first takes
// effect on its next request (no cache), without touching the second;
// the catalog holds a hash of each key, never the key.
func TestThreat108TokenScopeAndRotation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	rec, alice2, err := h.st.CreateKey(t.Context(), store.APIKey{Tenant: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{h.alice, alice2} {
		if r := h.do(key, "GET", "/v1/sandboxes/aliceaaaaaaa", nil); r.code != http.StatusOK {
			t.Fatalf("a key of alice's: %d %s", r.code, r.body)
		}
	}
	// Bob's key is scoped to bob, whatever it asks.
	if r := h.do(h.bob, "GET", "/v1/sandboxes/aliceaaaaaaa", nil); r.code != http.StatusNotFound {
		t.Fatalf("bob reads alice's sandbox: %d", r.code)
	}
	first, err := h.st.LookupKey(t.Context(), h.alice)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.st.RevokeKey(t.Context(), first.ID); err != nil {
		t.Fatal(err)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa", nil); r.code != http.StatusUnauthorized {
		t.Fatalf("a revoked key: %d %s", r.code, r.body)
	}
	if r := h.do(alice2, "GET", "/v1/sandboxes/aliceaaaaaaa", nil); r.code != http.StatusOK {
		t.Fatalf("the rotated key after the old one was revoked: %d %s", r.code, r.body)
	}
	if rec.ID == first.ID {
		t.Fatal("two keys share an id")
	}
	// Neither key, nor its secret part, is in the catalog's file.
	if err := h.st.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{h.alice, alice2, h.bob, h.admin} {
		secret := key[strings.LastIndex(key, "_")+1:]
		for _, f := range []string{h.catalog, h.catalog + "-wal"} {
			b, err := os.ReadFile(f)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("%s holds a key's secret", filepath.Base(f))
			}
		}
	}
}

// TestKeyInXAPIKeyHeader: a key is accepted in X-API-KEY (how E2B's SDKs
// send it) as in Authorization; a wrong one is refused; when both headers
// are set, Authorization decides.
func TestKeyInXAPIKeyHeader(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	get := func(hdr map[string]string) int {
		req, err := http.NewRequestWithContext(t.Context(), "GET", h.url+"/v1/sandboxes", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if c := get(map[string]string{"X-API-KEY": h.alice}); c != http.StatusOK {
		t.Errorf("X-API-KEY with a good key: %d", c)
	}
	if c := get(map[string]string{"X-API-KEY": h.alice + "x"}); c != http.StatusUnauthorized {
		t.Errorf("X-API-KEY with a bad key: %d", c)
	}
	if c := get(map[string]string{"Authorization": "Bearer " + h.alice + "x", "X-API-KEY": h.alice}); c != http.StatusUnauthorized {
		t.Errorf("a bad Authorization beside a good X-API-KEY: %d", c)
	}
}
