package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/shim/shimtest"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// testAPI is the real API server of `airlock serve` (api.Server over a
// sandbox.Manager) on an httptest server, on a shimtest state dir: the
// sandboxes run on the fake runtime and their shims in this process
// (Manager.StartShim), reached over their sockets as in production. The
// CLI talks to it with an API key of tenant "cli" from the catalog
// (runCLI: an admin key, as publishing ports and pruning snapshots need),
// or to the same state dir through its in-process server
// (runLocal). It records the requests the CLI sends.
type testAPI struct {
	env *shimtest.Env
	m   *sandbox.Manager
	srv *httptest.Server
	key string

	mu   sync.Mutex
	reqs []apiRequest
}

// apiRequest is one request the server got.
type apiRequest struct {
	method, path, query string
	// raw is a JSON body as sent (trimmed), body the same decoded.
	raw  string
	body map[string]any
	// requestID is the X-Request-Id of the answer.
	requestID string
}

func newTestAPI(t *testing.T) *testAPI {
	t.Helper()
	e := shimtest.New(t)
	a := &testAPI{env: e}
	// No free-space reserve: the test machine's disk is not under test.
	a.m = &sandbox.Manager{L: e.L, Store: e.Store, DiskReserve: -1, StartShim: e.Starter(t, inProcessShim(e))}
	s, err := api.New(api.Config{Sandboxes: a.m, Files: a.m, Execs: a.m, Contexts: a.m, Ports: a.m, Snapshots: a.m, Volumes: a.m, Secrets: a.m, Events: a.m.Store, Keys: a.m.Store})
	if err != nil {
		t.Fatal(err)
	}
	if _, a.key, err = e.Store.CreateKey(t.Context(), store.APIKey{Tenant: "cli", Admin: true}); err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := apiRequest{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery}
		if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			rec.raw = strings.TrimSpace(string(b))
			_ = json.Unmarshal(b, &rec.body)
		}
		// Recorded before it is served, and its request id before any of
		// the answer leaves: a command that got its answer finds both.
		a.mu.Lock()
		i := len(a.reqs)
		a.reqs = append(a.reqs, rec)
		a.mu.Unlock()
		iw := &idWriter{ResponseWriter: w, note: func(id string) {
			a.mu.Lock()
			a.reqs[i].requestID = id
			a.mu.Unlock()
		}}
		s.ServeHTTP(iw, r)
		iw.noteID()
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// idWriter notes the request id of an answer (X-Request-Id, set by the
// server first) before any of the answer is written. Flush and the rest
// pass through Unwrap (http.ResponseController); Flush is also a method,
// for handlers that assert http.Flusher.
type idWriter struct {
	http.ResponseWriter
	once sync.Once
	note func(id string)
}

func (w *idWriter) noteID() { w.once.Do(func() { w.note(w.Header().Get("X-Request-Id")) }) }

func (w *idWriter) WriteHeader(code int) {
	w.noteID()
	w.ResponseWriter.WriteHeader(code)
}

func (w *idWriter) Write(b []byte) (int, error) {
	w.noteID()
	return w.ResponseWriter.Write(b)
}

func (w *idWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *idWriter) Flush() {
	w.noteID()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// inProcessShim runs a shim from its document on e's fake runtime, as
// `airlock shim` would on the runtime the document names.
func inProcessShim(e *shimtest.Env) shimtest.RunFunc {
	return func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error {
		return shim.Run(context.Background(), shim.Config{
			StateDir: doc.StateDir, ID: doc.ID, Ready: ready, Lock: lock, Runtime: e.Runtime, Secrets: doc.Secrets,
			DNS: doc.DNS, UpstreamCAFile: doc.UpstreamCAFile, TestDialMap: doc.TestDialMap, DiskReserve: doc.DiskReserve,
		})
	}
}

// requests returns the requests of method whose path ends with suffix, in
// the order they came.
func (a *testAPI) requests(method, suffix string) []apiRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []apiRequest
	for _, r := range a.reqs {
		if r.method == method && strings.HasSuffix(r.path, suffix) {
			out = append(out, r)
		}
	}
	return out
}

// creates returns the bodies of the create requests.
func (a *testAPI) creates() []map[string]any {
	var out []map[string]any
	for _, r := range a.requests("POST", "/v1/sandboxes") {
		out = append(out, r.body)
	}
	return out
}

// lastRequestID is the request id of the last answer.
func (a *testAPI) lastRequestID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reqs[len(a.reqs)-1].requestID
}

// sandboxes lists the catalog's sandboxes.
func (a *testAPI) sandboxes(t *testing.T) []store.Sandbox {
	t.Helper()
	sbs, err := a.env.Store.ListSandboxes(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return sbs
}

type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the airlock command line against a's server with
// AIRLOCK_HOST and AIRLOCK_API_KEY set, as main would, and returns its
// exit code.
func runCLI(t *testing.T, a *testAPI, stdin io.Reader, args ...string) cliResult {
	t.Helper()
	return execCLI(t, &globals{host: a.srv.URL, apiKey: a.key}, stdin, append([]string{"--state-dir", filepath.Join(t.TempDir(), "unused")}, args...))
}

// runCLIEnv is runCLI with env as the CLI's environment (secret values).
func runCLIEnv(t *testing.T, a *testAPI, env map[string]string, args ...string) cliResult {
	t.Helper()
	return execCLI(t, &globals{host: a.srv.URL, apiKey: a.key, env: env}, nil, append([]string{"--state-dir", filepath.Join(t.TempDir(), "unused")}, args...))
}

// runLocal runs the airlock command line without AIRLOCK_HOST on a's state
// dir: through the in-process API server on a manager of its own, whose
// shims run in this process too.
func runLocal(t *testing.T, a *testAPI, stdin io.Reader, args ...string) cliResult {
	t.Helper()
	g := &globals{startShim: a.env.Starter(t, inProcessShim(a.env))}
	return execCLI(t, g, stdin, append([]string{"--state-dir", a.env.L.Root, "--runtime", "qemu", "--disk-reserve", "0"}, args...))
}

func execCLI(t *testing.T, g *globals, stdin io.Reader, args []string) cliResult {
	t.Helper()
	root := rootCmd(g)
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	if stdin != nil {
		root.SetIn(stdin)
	}
	root.SetArgs(args)
	code := 0
	if err := root.ExecuteContext(t.Context()); err != nil {
		code = report(&errb, err)
	}
	return cliResult{out.String(), errb.String(), code}
}
