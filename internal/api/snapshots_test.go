package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func TestSnapshotCreateListDelete(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	const id = "aliceaaaaaaa"

	r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/snapshot", strings.NewReader(`{"name":"after-setup"}`))
	if r.code != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", r.code, r.body)
	}
	var sn Snapshot
	if err := json.Unmarshal(r.body, &sn); err != nil {
		t.Fatal(err)
	}
	if sn.Name != "after-setup" || sn.SandboxID != id || sn.SizeBytes != 64<<20 || sn.CPUs != 1 || sn.MemoryMB != 512 || sn.ID == "" {
		t.Fatalf("snapshot answer: %s", r.body)
	}
	if strings.Contains(string(r.body), `"env"`) {
		t.Fatalf("snapshot shows env: %s", r.body)
	}
	// The name is the tenant's now.
	if r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/snapshot", strings.NewReader(`{"name":"after-setup"}`)); r.code != http.StatusConflict {
		t.Fatalf("second snapshot: %d %s", r.code, r.body)
	}
	for _, body := range []string{`{}`, `{"name":"-bad"}`, `{"name":"_fork-x"}`, `{"name":"a","extra":1}`} {
		if r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/snapshot", strings.NewReader(body)); r.code != http.StatusBadRequest {
			t.Errorf("snapshot %s: %d %s", body, r.code, r.body)
		}
	}

	// Listed and read by alice; bob sees none of it (404 like a missing one).
	var list struct{ Snapshots []Snapshot }
	if err := json.Unmarshal(h.do(h.alice, "GET", "/v1/snapshots", nil).body, &list); err != nil || len(list.Snapshots) != 1 || list.Snapshots[0].Name != "after-setup" {
		t.Fatalf("alice's list: %+v %v", list, err)
	}
	if err := json.Unmarshal(h.do(h.bob, "GET", "/v1/snapshots", nil).body, &list); err != nil || len(list.Snapshots) != 0 {
		t.Fatalf("bob's list: %+v %v", list, err)
	}
	if r := h.do(h.alice, "GET", "/v1/snapshots/after-setup", nil); r.code != http.StatusOK {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	missing := h.do(h.bob, "GET", "/v1/snapshots/nothing", nil)
	for _, r := range []resp{h.do(h.bob, "GET", "/v1/snapshots/after-setup", nil), h.do(h.bob, "DELETE", "/v1/snapshots/after-setup", nil), missing} {
		e := r.err(t)
		if r.code != http.StatusNotFound || e.Error.Message != "snapshot not found" {
			t.Errorf("bob: %d %s", r.code, r.body)
		}
	}
	// An admin lists every tenant's with ?all=1 and acts on one with ?tenant=.
	if err := json.Unmarshal(h.do(h.admin, "GET", "/v1/snapshots?all=1", nil).body, &list); err != nil || len(list.Snapshots) != 1 || list.Snapshots[0].Tenant != "alice" {
		t.Fatalf("admin's list: %+v %v", list, err)
	}
	if r := h.do(h.admin, "GET", "/v1/snapshots/after-setup?tenant=alice", nil); r.code != http.StatusOK {
		t.Fatalf("admin get: %d %s", r.code, r.body)
	}
	if err := json.Unmarshal(h.do(h.alice, "GET", "/v1/snapshots?all=1&tenant=bob", nil).body, &list); err != nil || len(list.Snapshots) != 1 {
		t.Fatalf("a tenant's all=1 must be ignored: %+v %v", list, err)
	}

	// A sandbox made from it keeps it from being removed.
	r = h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"from_snapshot":"after-setup","metadata":{"m":"1"},"timeout_s":60}`))
	if r.code != http.StatusCreated {
		t.Fatalf("create from snapshot: %d %s", r.code, r.body)
	}
	var sb Sandbox
	if err := json.Unmarshal(r.body, &sb); err != nil {
		t.Fatal(err)
	}
	if sb.Source != "snapshot:after-setup" || sb.CPUs != 1 || sb.DiskUsageBytes != int64(len(sb.ID))<<20 || sb.Metadata["m"] != "1" {
		t.Fatalf("from snapshot: %s", r.body)
	}
	if o := h.fake.created[len(h.fake.created)-1]; o.Tenant != "alice" || o.CPUs != 0 || o.Timeout.Seconds() != 60 {
		t.Fatalf("create options %+v", o)
	}
	if r := h.do(h.bob, "POST", "/v1/sandboxes", strings.NewReader(`{"from_snapshot":"after-setup"}`)); r.code != http.StatusNotFound {
		t.Fatalf("bob from alice's snapshot: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"from_snapshot":"after-setup","env":{"A":"b"}}`)); r.code != http.StatusBadRequest {
		t.Fatalf("from snapshot with env: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"from_snapshot":"after-setup","cpus":2}`)); r.code != http.StatusBadRequest {
		t.Fatalf("from snapshot with another size: %d %s", r.code, r.body)
	}
	r = h.do(h.alice, "DELETE", "/v1/snapshots/after-setup", nil)
	if r.code != http.StatusPreconditionFailed || strings.Contains(r.err(t).Error.Message, sb.ID) {
		t.Fatalf("delete in use: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "DELETE", "/v1/sandboxes/"+sb.ID, nil); r.code != http.StatusNoContent {
		t.Fatal(r.code)
	}
	if r := h.do(h.alice, "DELETE", "/v1/snapshots/after-setup", nil); r.code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}

	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{Type: "snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range evs {
		actions = append(actions, e.Action)
	}
	if got := strings.Join(actions, ","); got != "snapshot.create,snapshot.delete" {
		t.Fatalf("audit: %s", got)
	}
}

func TestSnapshotRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	h.fake.mu.Lock()
	sb := h.fake.sbs["aliceaaaaaaa"]
	sb.Metadata = map[string]string{"busy": "1"}
	h.fake.sbs["aliceaaaaaaa"] = sb
	h.fake.mu.Unlock()
	r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/snapshot", strings.NewReader(`{"name":"s"}`))
	if r.code != http.StatusPreconditionFailed || !strings.Contains(r.err(t).Error.Message, "force") {
		t.Fatalf("busy: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/snapshot", strings.NewReader(`{"name":"s","force":true}`)); r.code != http.StatusCreated {
		t.Fatalf("forced: %d %s", r.code, r.body)
	}
}

func TestFork(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{MaxSandboxes: 4})
	const id = "aliceaaaaaaa"
	r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/fork", strings.NewReader(`{"count":3}`))
	if r.code != http.StatusCreated {
		t.Fatalf("fork: %d %s", r.code, r.body)
	}
	var out struct{ Sandboxes []Sandbox }
	if err := json.Unmarshal(r.body, &out); err != nil || len(out.Sandboxes) != 3 {
		t.Fatalf("fork answer: %s", r.body)
	}
	for _, f := range out.Sandboxes {
		if f.Source != "fork:"+id || f.Tenant != "alice" || f.State != "running" {
			t.Fatalf("fork: %+v", f)
		}
	}
	// Fork bases are not the tenant's to see (an admin's all=1 shows them).
	var list struct{ Snapshots []Snapshot }
	if err := json.Unmarshal(h.do(h.alice, "GET", "/v1/snapshots", nil).body, &list); err != nil || len(list.Snapshots) != 0 {
		t.Fatalf("list shows fork bases: %+v %v", list, err)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"from_snapshot":"_fork-0"}`)); r.code != http.StatusNotFound {
		t.Fatalf("create from a fork base: %d %s", r.code, r.body)
	}
	if err := json.Unmarshal(h.do(h.admin, "GET", "/v1/snapshots?all=true", nil).body, &list); err != nil || len(list.Snapshots) != 1 {
		t.Fatalf("admin list: %+v %v", list, err)
	}
	// Four sandboxes now: one more fork is over quota, and nothing is forked.
	r = h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/fork", nil)
	if r.code != http.StatusTooManyRequests || !strings.Contains(r.err(t).Error.Message, "max_sandboxes") {
		t.Fatalf("fork over quota: %d %s", r.code, r.body)
	}
	h.fake.mu.Lock()
	forks := len(h.fake.forks)
	h.fake.mu.Unlock()
	if forks != 1 {
		t.Fatalf("forks: %d", forks)
	}
	for _, body := range []string{`{"count":0}`, `{"count":17}`} {
		if r := h.do(h.alice, "POST", "/v1/sandboxes/"+id+"/fork", strings.NewReader(body)); r.code != http.StatusBadRequest {
			t.Errorf("fork %s: %d %s", body, r.code, r.body)
		}
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: id, Type: "sandbox.fork"})
	if err != nil || len(evs) != 1 || evs[0].Detail["count"] != float64(3) {
		t.Fatalf("audit: %+v %v", evs, err)
	}
}

func TestForkAllOrNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	h.fake.mu.Lock()
	sb := h.fake.sbs["aliceaaaaaaa"]
	sb.Metadata = map[string]string{"fail": "1"}
	h.fake.sbs["aliceaaaaaaa"] = sb
	h.fake.mu.Unlock()
	if r := h.do(h.alice, "POST", "/v1/sandboxes/aliceaaaaaaa/fork", strings.NewReader(`{"count":3}`)); r.code != http.StatusTooManyRequests {
		t.Fatalf("fork: %d %s", r.code, r.body)
	}
	sbs, _ := h.fake.List(t.Context(), sandbox.Local())
	if len(sbs) != 2 {
		t.Fatalf("partial forks left behind: %d sandboxes", len(sbs))
	}
}

func TestPruneNeedsAdmin(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	if r := h.do(h.alice, "POST", "/v1/snapshots/prune", nil); r.code != http.StatusForbidden || r.err(t).Error.Code != "permission_denied" {
		t.Fatalf("tenant prune: %d %s", r.code, r.body)
	}
	r := h.do(h.admin, "POST", "/v1/snapshots/prune", nil)
	if r.code != http.StatusOK || !strings.Contains(string(r.body), `"freed_bytes":5242880`) {
		t.Fatalf("admin prune: %d %s", r.code, r.body)
	}
}

func TestSandboxShowsDiskUsage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa", nil)
	if !strings.Contains(string(r.body), `"disk_usage_bytes":12582912`) || !strings.Contains(string(r.body), `"source":""`) {
		t.Fatalf("get: %s", r.body)
	}
}
