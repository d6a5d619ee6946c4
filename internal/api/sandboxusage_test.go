package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestSandboxUsage: the usage route answers the guest's figures and the
// network's counters for a running sandbox of the caller's, without the
// network block when it has none; the route table and the spec agree
// (h.do checks every answer against api/openapi.yaml).
func TestSandboxUsage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	const id = "usagerouteaa" // unique: sampleCalls counts across tests
	h.fake.add(id, "alice")
	t0 := time.Now().UTC()
	r := h.do(h.alice, "GET", "/v1/sandboxes/"+id+"/usage", nil)
	if r.code != http.StatusOK {
		t.Fatalf("usage: %d %s", r.code, r.body)
	}
	var u SandboxUsage
	if err := json.Unmarshal(r.body, &u); err != nil {
		t.Fatal(err)
	}
	// The fake's figures (usage_test.go): 1.5 s busy, MemTotal = the
	// sandbox's 512 MiB with 128 MiB available, 256 MiB of 2 GiB disk.
	want := SandboxUsage{SandboxID: id, SampledAt: u.SampledAt, CPUs: 1, CPUSeconds: 1.5,
		MemoryBytes: 384 << 20, MemoryLimitBytes: 512 << 20, DiskBytes: 256 << 20, DiskLimitBytes: 2 << 30,
		Network: &NetworkUsage{ReceiveBytes: 3 << 20, TransmitBytes: 1 << 20, Connections: 2}}
	if u.Network == nil || *u.Network != *want.Network {
		t.Fatalf("network %+v, want %+v", u.Network, want.Network)
	}
	u.Network = want.Network
	if u != want {
		t.Fatalf("usage %+v, want %+v", u, want)
	}
	if u.SampledAt.Before(t0.Add(-time.Second)) || u.SampledAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("sampled_at %s, asked at %s", u.SampledAt, t0)
	}

	// The admin sees it too; without a network there is no network block.
	h.fake.setState(id, store.StateRunning, map[string]string{"usage": "nonet"})
	r = h.do(h.admin, "GET", "/v1/sandboxes/"+id+"/usage", nil)
	if r.code != http.StatusOK || strings.Contains(string(r.body), "network") {
		t.Fatalf("admin, no network: %d %s", r.code, r.body)
	}
	if n := sampleCalls(id); n != 2 {
		t.Fatalf("the guest was asked %d times, want 2", n)
	}
}

// TestSandboxUsageNeverResumes: a paused sandbox answers 412 naming its
// state; the guest is not asked and the sandbox stays paused.
func TestSandboxUsageNeverResumes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{}`))
	var sb Sandbox
	if err := json.Unmarshal(r.body, &sb); err != nil || r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil); r.code != http.StatusOK {
		t.Fatalf("pause: %d %s", r.code, r.body)
	}
	r = h.do(h.alice, "GET", "/v1/sandboxes/"+sb.ID+"/usage", nil)
	if r.code != http.StatusPreconditionFailed {
		t.Fatalf("usage of a paused sandbox: %d %s", r.code, r.body)
	}
	if e := r.err(t); e.Error.Code != "failed_precondition" || !strings.Contains(e.Error.Message, "the sandbox is paused") {
		t.Fatalf("error %+v", e)
	}
	if n := sampleCalls(sb.ID); n != 0 {
		t.Fatalf("the guest of a paused sandbox was asked %d times", n)
	}
	r = h.do(h.alice, "GET", "/v1/sandboxes/"+sb.ID, nil)
	if err := json.Unmarshal(r.body, &sb); err != nil || sb.State != "paused" {
		t.Fatalf("after the usage call: %d %s", r.code, r.body)
	}
}

// TestSandboxUsageGuestTimeout: a guest that does not answer in time is
// 503 unavailable, not a hung request or an internal error.
func TestSandboxUsageGuestTimeout(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{}, func(s *Server) { s.usageTimeout = 50 * time.Millisecond })
	const id = "usagehangaaa"
	h.fake.add(id, "alice")
	h.fake.setState(id, store.StateRunning, map[string]string{"usage": "hang"})
	r := h.do(h.alice, "GET", "/v1/sandboxes/"+id+"/usage", nil)
	if r.code != http.StatusServiceUnavailable {
		t.Fatalf("usage of a hung guest: %d %s", r.code, r.body)
	}
	if e := r.err(t); e.Error.Code != "unavailable" || !strings.Contains(e.Error.Message, "did not answer in time") {
		t.Fatalf("error %+v", e)
	}
}
