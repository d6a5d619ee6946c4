package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fakeSandboxes is an in-memory manager that, like the real one, shows a
// caller only its tenant's sandboxes.
type fakeSandboxes struct {
	mu      sync.Mutex
	n       int
	sbs     map[string]store.Sandbox
	created []sandbox.CreateOptions
	callers []sandbox.Caller
	// usageCalls counts Usage calls.
	usageCalls int
}

func (f *fakeSandboxes) lookup(c sandbox.Caller, id string) (store.Sandbox, error) {
	sb, ok := f.sbs[id]
	if !ok || !c.Sees(sb) {
		return store.Sandbox{}, fmt.Errorf("%w: %w", errdefs.ErrNotFound, sandbox.ErrNoSandbox)
	}
	return sb, nil
}

func (f *fakeSandboxes) Create(_ context.Context, c sandbox.Caller, o sandbox.CreateOptions) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, o)
	f.callers = append(f.callers, c)
	if o.Image != "base" {
		return store.Sandbox{}, fmt.Errorf("%w: image %q", errdefs.ErrNotFound, o.Image)
	}
	f.n++
	now := time.Now().Add(time.Duration(f.n) * time.Millisecond)
	sb := store.Sandbox{ID: fmt.Sprintf("sbx%017d", f.n), State: store.StateRunning, Image: o.Image, CPUs: 1, MemoryMiB: 512, DiskMiB: 2048,
		CreatedAt: now, ExpiresAt: now.Add(o.Timeout), Metadata: o.Metadata, Env: o.Env, Tenant: c.Tenant, Network: o.Network}
	for _, v := range o.Volumes {
		switch v.Name {
		case "busy":
			return store.Sandbox{}, fmt.Errorf("%w: volume %q is mounted read-write by sandbox sbx0", errdefs.ErrConflict, v.Name)
		case "missing":
			return store.Sandbox{}, fmt.Errorf("%w: no volume %q", errdefs.ErrNotFound, v.Name)
		}
		sb.Mounts = append(sb.Mounts, store.Mount{VolumeID: "vol" + v.Name, VolumeName: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fakeSandboxes) Get(_ context.Context, c sandbox.Caller, id string) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookup(c, id)
}

func (f *fakeSandboxes) List(_ context.Context, c sandbox.Caller) ([]store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Sandbox
	for _, sb := range f.sbs {
		if c.Sees(sb) {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (f *fakeSandboxes) Remove(_ context.Context, c sandbox.Caller, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(c, id); err != nil {
		return err
	}
	delete(f.sbs, id)
	return nil
}

func (f *fakeSandboxes) SetTimeout(_ context.Context, c sandbox.Caller, id string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(c, id)
	if err != nil {
		return err
	}
	sb.ExpiresAt = time.Now().Add(d)
	f.sbs[id] = sb
	return nil
}

// SetNetwork validates and floor-checks like the manager and records the
// policy in the sandbox's network.
func (f *fakeSandboxes) SetNetwork(_ context.Context, c sandbox.Caller, id string, p sandbox.EgressPolicy) (sandbox.NetworkChange, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(c, id)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	next, err := sb.Network.WithEgress(p.Mode, p.Allow)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	if !c.Admin {
		if err := sandbox.CheckFloor(next); err != nil {
			return sandbox.NetworkChange{}, err
		}
	}
	sb.Network = next
	f.sbs[id] = sb
	return sandbox.NetworkChange{Network: next, Applied: "running"}, nil
}

func (f *fakeSandboxes) Pause(_ context.Context, c sandbox.Caller, id string, _ bool) (sandbox.PauseResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(c, id)
	if err != nil {
		return sandbox.PauseResult{}, err
	}
	sb.State, sb.LifetimeLeft = store.StatePaused, time.Until(sb.ExpiresAt)
	f.sbs[id] = sb
	return sandbox.PauseResult{}, nil
}

func (f *fakeSandboxes) Resume(_ context.Context, c sandbox.Caller, id string) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, err := f.lookup(c, id)
	if err != nil {
		return sb, err
	}
	sb.State = store.StateRunning
	f.sbs[id] = sb
	return sb, nil
}

func (f *fakeSandboxes) Touch(context.Context, sandbox.Caller, string) error { return nil }

// Usage reports a guest that used half a CPU since the last call.
func (f *fakeSandboxes) Usage(_ context.Context, c sandbox.Caller, id string) (guest.Usage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.lookup(c, id); err != nil {
		return guest.Usage{}, err
	}
	f.usageCalls++
	n := time.Duration(f.usageCalls)
	return guest.Usage{CPUBusy: n * time.Second, CPUTotal: n * 2 * time.Second, CPUs: 1, MemTotal: 512 << 20, MemAvailable: 384 << 20, MemCached: 64 << 20, DiskTotal: 2 << 30, DiskUsed: 1 << 30}, nil
}

type harness struct {
	t          *testing.T
	url        string
	fake       *fakeSandboxes
	execs      *fakeExecs
	files      *fakeFiles
	contexts   *fakeContexts
	snaps      *fakeSnapshots
	alice, bob string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &harness{t: t, fake: &fakeSandboxes{sbs: map[string]store.Sandbox{}}, execs: &fakeExecs{}, files: &fakeFiles{}, contexts: &fakeContexts{}}
	h.snaps = &fakeSnapshots{sbs: h.fake}
	_, h.alice, _ = st.CreateKey(t.Context(), store.APIKey{Tenant: "alice"})
	if _, h.bob, err = st.CreateKey(t.Context(), store.APIKey{Tenant: "bob"}); err != nil {
		t.Fatal(err)
	}
	s, err := api.New(api.Config{Sandboxes: h.fake, Files: struct{ api.Files }{}, Events: st, Keys: st, Secret: []byte(strings.Repeat("p", 32))}) // no file route is called
	if err == nil {
		err = Register(s, Config{Sandboxes: h.fake, Execs: h.execs, Files: h.files, Contexts: h.contexts, Snapshots: h.snaps, Secret: []byte(strings.Repeat("s", 32))})
	}
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

type resp struct {
	code int
	hdr  http.Header
	body []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("%d %s: %v", r.code, r.body, err)
	}
}

// do sends a request as E2B's SDK does: the key in X-API-KEY.
func (h *harness) do(key, method, path, body string, hdr ...string) resp {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, b}
}

func TestCreateGetKill(t *testing.T) {
	h := newHarness(t)
	r := h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"code-interpreter-v1","envVars":{"A":"1"},"metadata":{"k":"v"},"allow_internet_access":false,"autoPause":false,"someNewField":1}`)
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var sb Sandbox
	r.json(t, &sb)
	if sb.SandboxID == "" || sb.EnvdVersion != EnvdVersion || sb.TemplateID != "code-interpreter-v1" || sb.Domain != nil || !strings.Contains(string(r.body), `"domain":null`) {
		t.Fatalf("create answer: %s", r.body)
	}
	o := h.fake.created[0]
	if o.Image != "base" || o.Timeout != DefaultTimeout || o.Env["A"] != "1" || o.Metadata["k"] != "v" || o.Network.Mode != "deny" {
		t.Fatalf("create options: %+v", o)
	}
	if c := h.fake.callers[0]; c.Tenant != "alice" || c.Via != "e2b" {
		t.Fatalf("caller: %+v", c)
	}

	r = h.do(h.alice, "GET", "/sandboxes/"+sb.SandboxID, "")
	var d SandboxDetail
	r.json(t, &d)
	if r.code != 200 || d.State != "running" || d.MemoryMB != 512 || d.CPUCount != 1 || d.Metadata["k"] != "v" || d.AllowInternetAccess || d.EndAt.Before(d.StartedAt) {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	// Another tenant's sandbox is a 404 with code 404 in the body, like a
	// missing one (the SDK reads body.code).
	for _, who := range []string{h.bob, h.alice} {
		id := sb.SandboxID
		if who == h.alice {
			id = "nosuchsandboxaaaaaaa"
		}
		r = h.do(who, "GET", "/sandboxes/"+id, "")
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		r.json(t, &e)
		if r.code != 404 || e.Code != 404 || e.Message == "" {
			t.Fatalf("get as another tenant / missing: %d %s", r.code, r.body)
		}
	}
	if r = h.do(h.bob, "DELETE", "/sandboxes/"+sb.SandboxID, ""); r.code != 404 {
		t.Fatalf("kill as another tenant: %d %s", r.code, r.body)
	}
	if r = h.do(h.alice, "DELETE", "/sandboxes/"+sb.SandboxID, ""); r.code != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("kill: %d %s", r.code, r.body)
	}
	if r = h.do(h.alice, "DELETE", "/sandboxes/"+sb.SandboxID, ""); r.code != 404 || !strings.Contains(string(r.body), `"code":404`) {
		t.Fatalf("kill again: %d %s", r.code, r.body)
	}
}

func TestCreateRefusals(t *testing.T) {
	h := newHarness(t)
	for body, want := range map[string]string{
		`{"templateID":"nope"}`:               `template \"nope\" not found`,
		`{"timeout":0}`:                       "timeout must be between",
		`{"timeout":90000}`:                   "timeout must be between",
		`{"network":{"denyOut":["1.2.3.4"]}}`: "has no deny list",
		`{"network":{"rules":{"api.x.com":[{"transform":{"headers":{"A":"b"}}}]}}}`: "rules",
		`{"network":{"egressProxy":{"address":"p:8080"}}}`:                          "egressProxy",
		`{"network":{"allowPublicTraffic":true}}`:                                   "trafficAccessToken",
		`{"autoPause":true}`:                                        "onTimeout 'pause'",
		`{"autoResume":{"enabled":true}}`:                           "autoResume",
		`{"iam":{"tokens":{"t":{"audience":"a","tokenType":"b"}}}}`: "iam",
		`{"volumeMounts":[{"name":"v"}]}`:                           "volumeMounts",
		`{"volumeMounts":[{"path":"/data"}]}`:                       "volumeMounts",
		`{"templateID":`:                                            "bad JSON",
	} {
		r := h.do(h.alice, "POST", "/sandboxes", body)
		if r.code/100 != 4 || !strings.Contains(string(r.body), want) || !strings.Contains(string(r.body), fmt.Sprintf(`"code":%d`, r.code)) {
			t.Errorf("create %s: %d %s, want 4xx %q", body, r.code, r.body, want)
		}
	}
	if r := h.do("", "POST", "/v2/sandboxes", `{}`); r.code != http.StatusUnauthorized {
		t.Errorf("no key: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice+"0", "POST", "/v2/sandboxes", `{}`); r.code != http.StatusUnauthorized {
		t.Errorf("bad key: %d %s", r.code, r.body)
	}
	if len(h.fake.created) != 1 { // only the unknown template reached the manager
		t.Errorf("%d creates reached the manager", len(h.fake.created))
	}
	// Egress: deny all with exceptions is airlock's deny mode with allow
	// rules; allowOut alone allows what is allowed anyway.
	for body, want := range map[string]string{
		`{"network":{"denyOut":["0.0.0.0/0"],"allowOut":["api.example.com","1.1.1.1"]}}`: "deny [api.example.com 1.1.1.1]",
		`{"allow_internet_access":false,"network":{"allowOut":["pypi.org"]}}`:            "deny [pypi.org]",
		`{"network":{"allowOut":["pypi.org"],"allowPublicTraffic":false}}`:               " []",
	} {
		if r := h.do(h.alice, "POST", "/v2/sandboxes", body); r.code != http.StatusCreated {
			t.Fatalf("create %s: %d %s", body, r.code, r.body)
		}
		n := h.fake.created[len(h.fake.created)-1].Network
		if got := fmt.Sprintf("%s %v", n.Mode, n.Allow); got != want {
			t.Errorf("create %s: network %q, want %q", body, got, want)
		}
	}
}

func TestListFiltersAndPages(t *testing.T) {
	h := newHarness(t)
	var ids []string
	for i := range 5 {
		r := h.do(h.alice, "POST", "/v2/sandboxes", fmt.Sprintf(`{"metadata":{"n":"%d","tag":"a b&c"}}`, i%2))
		var sb Sandbox
		r.json(t, &sb)
		ids = append(ids, sb.SandboxID)
	}
	h.do(h.bob, "POST", "/v2/sandboxes", `{}`)
	if r := h.do(h.alice, "POST", "/sandboxes/"+ids[0]+"/pause", `{}`); r.code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/sandboxes/"+ids[0]+"/pause", `{}`); r.code != http.StatusConflict {
		t.Fatalf("pause again: %d %s", r.code, r.body)
	}
	list := func(q string) ([]ListedSandbox, string) {
		r := h.do(h.alice, "GET", "/v2/sandboxes?"+q, "")
		var out []ListedSandbox
		r.json(t, &out)
		if r.code != 200 {
			t.Fatalf("list %s: %d %s", q, r.code, r.body)
		}
		return out, r.hdr.Get("X-Next-Token")
	}
	all, next := list("")
	if len(all) != 5 || next != "" || all[0].SandboxID != ids[4] {
		t.Fatalf("list: %d entries, next %q, first %s", len(all), next, all[0].SandboxID)
	}
	if got, _ := list("state=paused"); len(got) != 1 || got[0].SandboxID != ids[0] || got[0].State != "paused" {
		t.Fatalf("state=paused: %+v", got)
	}
	// The SDK's triple encoding of {n: "0", tag: "a b&c"}.
	enc := "n=" + url.QueryEscape(url.QueryEscape("0")) + "&tag=" + url.QueryEscape(url.QueryEscape("a b&c"))
	if got, _ := list("metadata=" + url.QueryEscape(enc)); len(got) != 3 {
		t.Fatalf("metadata filter: %d entries", len(got))
	}
	page, next := list("limit=2")
	page2, next2 := list("limit=2&nextToken=" + next)
	page3, next3 := list("limit=2&nextToken=" + next2)
	if len(page) != 2 || len(page2) != 2 || len(page3) != 1 || next3 != "" || page2[0].SandboxID != ids[2] {
		t.Fatalf("pages: %d %d %d, next %q %q %q", len(page), len(page2), len(page3), next, next2, next3)
	}
	if r := h.do(h.alice, "GET", "/v2/sandboxes?state=dead", ""); r.code != 400 {
		t.Fatalf("bad state: %d", r.code)
	}
}

func TestConnectTimeoutAndSandboxTraffic(t *testing.T) {
	h := newHarness(t)
	var sb Sandbox
	h.do(h.alice, "POST", "/v2/sandboxes", `{"timeout":60}`).json(t, &sb)
	if r := h.do(h.alice, "POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":600}`); r.code != 200 {
		t.Fatalf("connect to a running sandbox: %d %s", r.code, r.body)
	}
	if left := time.Until(h.fake.sbs[sb.SandboxID].ExpiresAt); left < 590*time.Second {
		t.Fatalf("connect with timeout 600 left %v", left)
	}
	h.do(h.alice, "POST", "/sandboxes/"+sb.SandboxID+"/pause", `{}`)
	r := h.do(h.alice, "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":300}`)
	var again Sandbox
	r.json(t, &again)
	if r.code != http.StatusCreated || again.SandboxID != sb.SandboxID || h.fake.sbs[sb.SandboxID].State != store.StateRunning {
		t.Fatalf("connect to a paused sandbox: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":30}`); r.code != http.StatusNoContent {
		t.Fatalf("timeout: %d %s", r.code, r.body)
	}
	if left := time.Until(h.fake.sbs[sb.SandboxID].ExpiresAt); left > 31*time.Second {
		t.Fatalf("timeout 30 left %v", left)
	}
	if r := h.do(h.alice, "POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{}`); r.code != 400 {
		t.Fatalf("timeout without a value: %d", r.code)
	}
	// In-sandbox traffic is routed by its header: envd wants the sandbox's
	// token.
	r = h.do("", "POST", "/process.Process/List", `{}`, "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49983", "Content-Type", "application/json")
	if r.code != http.StatusUnauthorized || !strings.Contains(string(r.body), `"code":"unauthenticated"`) {
		t.Fatalf("envd RPC without a token: %d %s", r.code, r.body)
	}
	// /v1 is untouched by the E2B routes.
	if r := h.do(h.alice, "GET", "/v1/sandboxes", ""); r.code != 200 || !strings.Contains(string(r.body), sb.SandboxID) {
		t.Fatalf("/v1 list with X-API-KEY: %d %s", r.code, r.body)
	}
}

// TestLackedFeatures: E2B features airlock lacks answer 501 in E2B's
// shape with a message, to a valid key (and 401 without one).
func TestLackedFeatures(t *testing.T) {
	h := newHarness(t)
	for _, rt := range [][2]string{
		{"GET", "/secrets"}, {"POST", "/secrets"}, {"DELETE", "/secrets/s1"},
		{"GET", "/volumes"}, {"POST", "/volumes"}, {"GET", "/volumecontent/v1/file?path=/x"},
		{"POST", "/v3/templates"}, {"POST", "/v2/templates/t/builds/b"}, {"GET", "/templates/aliases/x"},
		{"GET", "/templates/t/builds/b/status"}, {"POST", "/templates/tags"},
	} {
		r := h.do(h.alice, rt[0], rt[1], `{}`)
		if r.code != http.StatusNotImplemented || !strings.Contains(string(r.body), `"code":501`) || !strings.Contains(string(r.body), "airlock does not have") {
			t.Errorf("%s %s: %d %s", rt[0], rt[1], r.code, r.body)
		}
		if r := h.do("", rt[0], rt[1], `{}`); r.code != http.StatusUnauthorized {
			t.Errorf("%s %s without a key: %d", rt[0], rt[1], r.code)
		}
	}
}
