package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

func TestPauseResume(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	const id = "aliceaaaaaaa"

	r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/pause", nil) // no body: force false
	if r.code != http.StatusOK {
		t.Fatalf("pause: %d %s", r.code, r.body)
	}
	var p struct {
		Sandbox
		Pause pauseStats `json:"pause"`
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatal(err)
	}
	if p.State != "paused" || p.PausedAt == nil || p.LifetimeLeftS == nil || *p.LifetimeLeftS != 600 ||
		p.Pause.StateBytes != 123<<20 || p.Pause.SaveMs != 800 {
		t.Fatalf("pause answer: %s", r.body)
	}
	// Pausing again is a no-op; so is the listing's view of it.
	if r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/pause", strings.NewReader(`{"force":true}`)); r.code != http.StatusOK {
		t.Fatalf("second pause: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v1/sandboxes?state=paused", nil); !strings.Contains(string(r.body), id) {
		t.Fatalf("list state=paused: %s", r.body)
	}

	r = h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/resume", nil)
	var sb Sandbox
	if err := json.Unmarshal(r.body, &sb); r.code != http.StatusOK || err != nil {
		t.Fatalf("resume: %d %s", r.code, r.body)
	}
	if sb.State != "running" || sb.LifetimeLeftS != nil || sb.PausedAt == nil {
		t.Fatalf("resume answer: %s", r.body)
	}
	if strings.Contains(string(r.body), "lifetime_left_s") {
		t.Fatalf("lifetime_left_s shown while running: %s", r.body)
	}

	if r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/keepalive", nil); r.code != http.StatusNoContent {
		t.Fatalf("keepalive: %d %s", r.code, r.body)
	}
	h.fake.mu.Lock()
	touches := h.fake.touches
	h.fake.mu.Unlock()
	if len(touches) != 1 || touches[0] != id {
		t.Fatalf("touches: %v", touches)
	}

	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range evs {
		actions = append(actions, e.Action)
	}
	if got := strings.Join(actions, ","); got != "sandbox.pause,sandbox.pause,sandbox.resume" {
		t.Fatalf("audit: %s", got)
	}
	if d := evs[0].Detail; d["force"] != false || d["was"] != "running" {
		t.Fatalf("pause detail: %v", d)
	}
}

func TestPauseRefusedWhileBusy(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"metadata":{"busy":"1"}}`))
	var sb Sandbox
	if err := json.Unmarshal(r.body, &sb); err != nil || r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	r = h.do(h.alice, "POST", "/v1/sandboxes/"+sb.ID+"/pause", strings.NewReader(`{}`))
	if r.code != http.StatusPreconditionFailed || r.err(t).Error.Code != "failed_precondition" {
		t.Fatalf("busy pause: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/"+sb.ID+"/pause", strings.NewReader(`{"force":true}`)); r.code != http.StatusOK {
		t.Fatalf("forced pause: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/"+sb.ID+"/pause", strings.NewReader(`{"force":"yes"}`)); r.code != http.StatusBadRequest {
		t.Fatalf("bad body: %d %s", r.code, r.body)
	}
}

func TestCreateIdlePause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"idle_pause_s":300}`))
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	h.fake.mu.Lock()
	got := h.fake.created[len(h.fake.created)-1].IdlePause
	h.fake.mu.Unlock()
	if got.Seconds() != 300 {
		t.Fatalf("IdlePause %s", got)
	}
	for _, body := range []string{
		`{"idle_pause_s":-1}`,
		`{"idle_pause_s":604801}`,
	} {
		r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(body))
		if r.code != http.StatusBadRequest || !strings.Contains(r.err(t).Error.Message, "idle_pause_s") {
			t.Errorf("%s: %d %s", body, r.code, r.body)
		}
	}
	// Secrets no longer keep a sandbox from pausing (their values are
	// sealed for the resume): idle pause and secrets go together.
	r = h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"idle_pause_s":60,"network":{"secrets":[{"name":"K","hosts":["api.example.com"],"value":"v"}]}}`))
	if r.code != http.StatusCreated {
		t.Fatalf("idle pause with a secret: %d %s", r.code, r.body)
	}
}
