package e2e

import (
	"os"

	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/airlock-sandbox/airlock/internal/apispec"
)

// apiServer is a running `airlock serve` on a free loopback port.
type apiServer struct {
	t    *testing.T
	base string
	hc   *http.Client
}

// startServe starts `airlock serve` with args added to its flags.
func startServe(t *testing.T, e env, args ...string) *apiServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// "{port}" in an argument is the server's port (a preview domain
	// names it).
	_, port, _ := net.SplitHostPort(addr)
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "{port}", port)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := e.cmd(ctx, nil, append([]string{"serve", "--listen", addr}, args...)...)
	var logs bytes.Buffer
	c.Stdout, c.Stderr = &logs, &logs
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.WaitDelay = 40 * time.Second
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := c.Wait(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("airlock serve did not shut down cleanly: %v\n%s", err, logs.String())
		}
	})
	s := &apiServer{t: t, base: "http://" + addr, hc: &http.Client{Timeout: 5 * time.Minute}}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := s.hc.Get(s.base + "/healthz"); err == nil {
			res.Body.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("airlock serve did not come up:\n%s", logs.String())
		}
	}
}

func (s *apiServer) do(key, method, path string, body io.Reader) (int, []byte) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+path, body)
	if err != nil {
		s.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := s.hc.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		s.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	if err := apispec.Check(method, path, res.StatusCode, res.Header.Get("Content-Type"), b); err != nil {
		s.t.Errorf("the real server departs from api/openapi.yaml: %v", err)
	}
	return res.StatusCode, b
}

func withoutRequestID(b []byte) string {
	var m map[string]map[string]any
	_ = json.Unmarshal(b, &m)
	delete(m["error"], "request_id")
	out, _ := json.Marshal(m)
	return string(out)
}

// TestAPI drives the real server: auth, tenancy, quota, exec and a file
// round trip, on one sandbox.
func TestAPI(t *testing.T) {
	e := setup(t)
	alice := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-alice", "--max-sandboxes", "1"))
	bob := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-bob"))
	s := startServe(t, e)

	if code, b := s.do("", "GET", "/v1/sandboxes", nil); code != 401 || !strings.Contains(string(b), "unauthenticated") {
		t.Fatalf("no key: %d %s", code, b)
	}
	if code, _ := s.do(alice+"x", "GET", "/v1/sandboxes", nil); code != 401 {
		t.Fatalf("bad key: %d", code)
	}

	code, b := s.do(alice, "POST", "/v1/sandboxes", strings.NewReader(`{"env":{"GREETING":"hi"},"timeout_s":600}`))
	if code != 201 {
		t.Fatalf("create: %d %s", code, b)
	}
	var sb struct{ ID, State, Tenant string }
	_ = json.Unmarshal(b, &sb)
	t.Cleanup(func() { s.do(alice, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	if sb.State != "running" || sb.Tenant != "e2e-alice" {
		t.Fatalf("created %s", b)
	}

	if code, b := s.do(alice, "POST", "/v1/sandboxes", strings.NewReader(`{}`)); code != 429 || !strings.Contains(string(b), "max_sandboxes") {
		t.Errorf("second create: %d %s", code, b)
	}

	code1, b1 := s.do(bob, "GET", "/v1/sandboxes/"+sb.ID, nil)
	code2, b2 := s.do(bob, "GET", "/v1/sandboxes/aaaaaaaaaaaa", nil)
	if code1 != 404 || code2 != 404 || withoutRequestID(b1) != withoutRequestID(b2) {
		t.Errorf("cross-tenant %d %s vs missing %d %s", code1, b1, code2, b2)
	}
	// Every sandbox-scoped route in the spec: tenant B gets exactly what a
	// missing sandbox gets, a 404.
	routes := sandboxRoutes(t)
	if len(routes) < 15 {
		t.Fatalf("only %d sandbox routes found in api/openapi.yaml", len(routes))
	}
	t.Logf("checking %d sandbox routes as another tenant", len(routes))
	for _, r := range routes {
		req := func(id string) (int, []byte) {
			p := strings.NewReplacer("{id}", id, "{exec_id}", "aaaaaaaaaaaaaaaa", "{ctx}", "c1").Replace(r.path)
			if strings.Contains(p, "/files") {
				p += "?path=/tmp/x"
			}
			return s.do(bob, r.method, p, strings.NewReader(r.body()))
		}
		c1, b1 := req(sb.ID)
		c2, b2 := req("aaaaaaaaaaaa")
		if c1 != 404 || c2 != 404 || withoutRequestID(b1) != withoutRequestID(b2) {
			t.Errorf("%s %s as another tenant: %d %s; missing sandbox: %d %s", r.method, r.path, c1, b1, c2, b2)
		}
	}

	t.Run("exec", func(t *testing.T) {
		code, b := s.do(alice, "POST", "/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"cmd":["sh","-c","cat; echo $GREETING; exit 7"],"stdin":"in-"}`))
		if code != 200 {
			t.Fatalf("exec: %d %s", code, b)
		}
		var stdout strings.Builder
		var types []string
		var exit struct{ Code int }
		for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
			var l struct{ Type, Data string }
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			types = append(types, l.Type)
			switch l.Type {
			case "stdout":
				stdout.WriteString(l.Data)
			case "exit":
				_ = json.Unmarshal(sc.Bytes(), &exit)
			}
		}
		if types[0] != "start" || types[len(types)-1] != "exit" || stdout.String() != "in-hi\n" || exit.Code != 7 {
			t.Errorf("exec stream %v stdout %q exit %d", types, stdout.String(), exit.Code)
		}
	})

	t.Run("preview", func(t *testing.T) {
		code, b := s.do(alice, "POST", "/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"cmd":["sh","-c","cd /etc && setsid python3 -m http.server 8000 >/dev/null 2>&1 </dev/null & for i in $(seq 50); do python3 -c 'import socket;socket.create_connection((\"127.0.0.1\",8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"]}`))
		if code != 200 || !strings.Contains(string(b), `"code":0`) {
			t.Fatalf("start a guest web server: %d %s", code, b)
		}
		if code, b := s.do(alice, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/hostname", nil); code != 200 || string(b) != "airlock\n" {
			t.Errorf("preview: %d %q", code, b)
		}
		if code, _ := s.do("", "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/hostname", nil); code != 401 {
			t.Errorf("preview without a key: %d", code)
		}
		if code, _ := s.do(bob, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/hostname", nil); code != 404 {
			t.Errorf("preview as another tenant: %d", code)
		}
		if code, b := s.do(alice, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8001/", nil); code < 500 {
			t.Errorf("preview of a closed guest port: %d %s", code, b)
		}
	})

	data := make([]byte, 5<<20)
	_, _ = rand.Read(data)
	want := sha256.Sum256(data)
	if code, b := s.do(alice, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/blob.bin", bytes.NewReader(data)); code != 200 || !strings.Contains(string(b), `"size":5242880`) {
		t.Fatalf("upload: %d %s", code, b)
	}
	code, got := s.do(alice, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/blob.bin", nil)
	if code != 200 || sha256.Sum256(got) != want {
		t.Fatalf("download: %d, %d bytes, sha256 match %v", code, len(got), sha256.Sum256(got) == want)
	}
	if code, b := s.do(alice, "GET", "/v1/events?sandbox="+sb.ID, nil); code != 200 || !strings.Contains(string(b), "file.write") || !strings.Contains(string(b), "sandbox.create") {
		t.Errorf("events: %d %s", code, b)
	}
	if code, b := s.do(alice, "DELETE", "/v1/sandboxes/"+sb.ID, nil); code != 204 {
		t.Errorf("delete: %d %s", code, b)
	}
}

type specRoute struct{ method, path string }

// body is a valid request body for the route, so that only tenancy can
// make it fail.
func (r specRoute) body() string {
	switch {
	case strings.HasSuffix(r.path, "/timeout"):
		return `{"timeout_s":60}`
	case strings.HasSuffix(r.path, "/exec"):
		return `{"cmd":["true"]}`
	case strings.HasSuffix(r.path, "/signal"):
		return `{"signal":15}`
	case strings.HasSuffix(r.path, "/mkdir"):
		return `{"path":"/tmp/y"}`
	default:
		return "x"
	}
}

// sandboxRoutes lists the spec's routes that take a sandbox id.
func sandboxRoutes(t *testing.T) []specRoute {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	var out []specRoute
	for p, ops := range spec.Paths {
		if !strings.Contains(p, "{id}") {
			continue
		}
		for m := range ops {
			switch m {
			case "get", "put", "post", "delete", "patch":
				out = append(out, specRoute{strings.ToUpper(m), p})
			}
		}
	}
	return out
}
