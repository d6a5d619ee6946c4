package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestLocalActsAsItsCaller serves the API in memory (the CLI's local mode)
// and checks that a request there acts as the caller given to ServeLocal,
// without a key, with the manager's own error text and no request id; and
// that the same server on a network listener still wants a key.
func TestLocalActsAsItsCaller(t *testing.T) {
	f, st := newFakeOnCatalog(t)
	f.add("bobbbbbbbbbb", "bob")
	s, err := New(Config{Sandboxes: f, Files: f, Execs: f, Contexts: f, Ports: f, Snapshots: f, Events: st, Keys: st})
	if err != nil {
		t.Fatal(err)
	}
	get := func(hc *http.Client, url string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", url, nil)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}

	admin := s.ServeLocal(sandbox.Local())
	res, body := get(admin.Client(), "http://airlock.local/v1/sandboxes/bobbbbbbbbbb")
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `"tenant":"bob"`) {
		t.Fatalf("local admin reads bob's sandbox: %d %s", res.StatusCode, body)
	}
	// A missing sandbox: the manager's words (the fake's "not found: ...",
	// where a key gets the API's "sandbox not found"), no request id.
	res, body = get(admin.Client(), "http://airlock.local/v1/sandboxes/aaaaaaaaaaaa")
	var e struct {
		Error struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if res.StatusCode != http.StatusNotFound || e.Error.Code != "not_found" || e.Error.Message != "not found: sandbox not found" ||
		e.Error.RequestID != "" || res.Header.Get("X-Request-Id") != "" {
		t.Errorf("local 404: %d %s (X-Request-Id %q)", res.StatusCode, body, res.Header.Get("X-Request-Id"))
	}

	// A tenant served locally sees only its own.
	alice := s.ServeLocal(sandbox.Caller{Tenant: "alice", Limits: sandbox.DefaultLimits, Via: "cli"})
	if res, body := get(alice.Client(), "http://airlock.local/v1/sandboxes/bobbbbbbbbbb"); res.StatusCode != http.StatusNotFound {
		t.Errorf("local tenant alice reads bob's sandbox: %d %s", res.StatusCode, body)
	}
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}

	// The same server on a listener: no key, no access.
	srv := httptest.NewServer(s)
	defer srv.Close()
	if res, body := get(srv.Client(), srv.URL+"/v1/sandboxes/bobbbbbbbbbb"); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("network request without a key: %d %s", res.StatusCode, body)
	}

	// Closed: the client can no longer reach it.
	if err := admin.Close(); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://airlock.local/v1/sandboxes", nil)
	if res, err := admin.Client().Do(req); err == nil {
		res.Body.Close()
		t.Errorf("request after Close answered %d", res.StatusCode)
	}
}
