package shim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestAPIExecOneConnectionOneRead: one exec through the HTTP API (with
// stdin) reaches a real shim over one connection and reads the sandbox's
// row once; a second exec reuses the connection.
func TestAPIExecOneConnectionOneRead(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	m := h.manager()
	srv, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Events: h.st, Keys: h.st})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	_, key, err := h.st.CreateKey(t.Context(), store.APIKey{Tenant: "ops", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	exec := func() string {
		t.Helper()
		req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes/"+h.id+"/exec", strings.NewReader(`{"cmd":["cat"],"stdin":"hi"}`))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.Contains(string(b), `"data":"hi"`) || !strings.Contains(string(b), `{"code":0,`) {
			t.Fatalf("exec: %d %s", res.StatusCode, b)
		}
		return string(b)
	}
	reads := h.st.SandboxReads()
	exec()
	if n := h.st.SandboxReads() - reads; n != 1 {
		t.Errorf("one API exec read the sandbox row %d times, want 1", n)
	}
	if n := m.ShimDials(h.id); n != 1 {
		t.Errorf("one API exec dialed the shim %d times, want 1", n)
	}
	exec()
	if n := m.ShimDials(h.id); n != 1 {
		t.Errorf("two API execs dialed the shim %d times, want 1 (pooled)", n)
	}
	// A background exec's stdin reaches it although its start stream ended.
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	code, body := do("POST", "/v1/sandboxes/"+h.id+"/exec", `{"cmd":["cat"],"stdin":"in the background","background":true}`)
	var bg struct {
		ExecID string `json:"exec_id"`
	}
	if err := json.Unmarshal([]byte(body), &bg); code != 202 || err != nil {
		t.Fatalf("background exec: %d %s", code, body)
	}
	if code, body = do("GET", "/v1/sandboxes/"+h.id+"/execs/"+bg.ExecID+"/stream", ""); code != 200 ||
		!strings.Contains(body, `"data":"in the background"`) || !strings.Contains(body, `{"code":0,`) {
		t.Fatalf("background exec's stream: %d %s", code, body)
	}
	if n := m.ShimDials(h.id); n != 1 {
		t.Errorf("background exec and re-attach dialed the shim %d times, want 1", n)
	}

	// Another tenant's caller gets the sandbox-not-found answer from the
	// manager, and nothing reaches the shim.
	other := sandbox.Caller{Tenant: "other", KeyID: "k2", Via: "api"}
	for _, call := range []func() error{
		func() error {
			_, err := m.Exec(t.Context(), other, h.id, guest.ExecSpec{Argv: []string{"true"}}, false)
			return err
		},
		func() error { _, err := m.ListExecs(t.Context(), other, h.id); return err },
		func() error { _, err := m.GetExec(t.Context(), other, h.id, "aaaaaaaaaaaaaaaa"); return err },
	} {
		if err := call(); !errors.Is(err, errdefs.ErrNotFound) || guest.IsNoExec(err) {
			t.Errorf("another tenant: %v", err)
		}
	}
	if n := m.ShimDials(h.id); n != 1 {
		t.Errorf("another tenant's calls dialed the shim (%d dials)", n)
	}
}

// TestExecNotStarted: a command the guest cannot start is 422
// exec_not_started through the API and a guest.StartError through the
// manager, never "sandbox not found"; the sandbox keeps working.
func TestExecNotStarted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	m := h.manager()
	srv, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Events: h.st, Keys: h.st})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	_, key, err := h.st.CreateKey(t.Context(), store.APIKey{Tenant: "ops", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	post := func(id, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes/"+id+"/exec", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if _, err := m.WriteFile(t.Context(), sandbox.Local(), h.id, "/notexec", 0o644, strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		body     string
		notFound bool
	}{
		{`{"cmd":["/nonexistent/airlock-no-such-binary"]}`, true},
		{`{"cmd":["airlock-no-such-binary-in-path"]}`, true},
		{`{"cmd":["true"],"cwd":"/nonexistent-airlock-dir"}`, true},
		{`{"cmd":["true"],"user":"airlock-no-such-user"}`, true},
		{`{"cmd":["/notexec"]}`, false}, // not executable
	} {
		code, body := post(h.id, c.body)
		var e struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal([]byte(body), &e)
		if code != http.StatusUnprocessableEntity || e.Error.Code != "exec_not_started" ||
			strings.HasPrefix(e.Error.Message, guest.StartNotFound) != c.notFound {
			t.Errorf("%s: %d %s, want 422 exec_not_started (not found: %v)", c.body, code, body, c.notFound)
		}
	}
	_, err = m.Exec(t.Context(), sandbox.Local(), h.id, guest.ExecSpec{Argv: []string{"/nonexistent/airlock-no-such-binary"}}, false)
	if se, ok := guest.AsStartError(err); !ok || !se.NotFound || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("manager exec of a missing binary: %v, want a guest.StartError (not found) that is not ErrNotFound", err)
	}
	if code, body := post("nosuchsandbx", `{"cmd":["true"]}`); code != http.StatusNotFound || !strings.Contains(body, `"not_found"`) {
		t.Errorf("missing sandbox: %d %s, want 404 not_found", code, body)
	}
	if code, body := post(h.id, `{"cmd":["echo","still here"]}`); code != 200 || !strings.Contains(body, "still here") {
		t.Errorf("exec after refused starts: %d %s", code, body)
	}
}

// TestManagerAuditsEverySurface: file and code actions are recorded by the
// manager, so the local CLI's (Local caller, via "cli") are audited like
// an API key's.
func TestManagerAuditsEverySurface(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	defer h.stop(t)
	m := h.manager()
	c := sandbox.Local()
	c.Via = "cli"
	if _, err := m.WriteFile(t.Context(), c, h.id, "/tmp/audited", 0o644, strings.NewReader("abc")); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveFile(t.Context(), c, h.id, "/tmp/audited", false); err != nil {
		t.Fatal(err)
	}
	info, err := m.CreateContext(t.Context(), c, h.id, guest.ContextSpec{ID: "audited", Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.RunCode(t.Context(), c, h.id, guest.CodeRequest{ContextID: info.ID, Code: "1/0"}, func(guest.CodeEvent) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteContext(t.Context(), c, h.id, info.ID); err != nil {
		t.Fatal(err)
	}
	codeEvs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: h.id, Type: "code"})
	if err != nil || len(codeEvs) != 1 || codeEvs[0].Detail["context"] != "audited" || codeEvs[0].Detail["via"] != "cli" {
		t.Fatalf("code.run events: %+v %v", codeEvs, err)
	}
	ctxEvs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: h.id, Type: "context"})
	if err != nil || len(ctxEvs) != 2 || ctxEvs[0].Action != "context.create" || ctxEvs[1].Action != "context.delete" {
		t.Fatalf("context events: %+v %v", ctxEvs, err)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: h.id, Type: "file"})
	if err != nil || len(evs) != 2 || evs[0].Action != "file.write" || evs[0].Detail["size"] != float64(3) ||
		evs[0].Detail["via"] != "cli" || evs[1].Action != "file.delete" || evs[1].Detail["path"] != "/tmp/audited" {
		t.Fatalf("file events: %+v %v", evs, err)
	}
}
