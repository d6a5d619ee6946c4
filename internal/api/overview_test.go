package api

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Overview decides for the caller as the manager does: a tenant its own
// sandboxes, an admin every tenant's, the host and the runtime's reason.
func (f *fake) Overview(_ context.Context, c sandbox.Caller) (sandbox.Overview, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := sandbox.Overview{States: map[store.State]int{}, Runtime: "qemu",
		Activity: sandbox.Activity{Since: time.Unix(1_700_000_000, 0), Step: time.Hour, Creates: make([]int, 24), Failures: make([]int, 24)}}
	use := map[string]*sandbox.TenantUsage{}
	if !c.Admin {
		use[c.Tenant] = &sandbox.TenantUsage{Tenant: c.Tenant}
	}
	for _, sb := range f.sbs {
		if !c.Sees(sb) {
			continue
		}
		o.States[sb.State]++
		o.Activity.Creates[23]++
		u := use[sb.Tenant]
		if u == nil {
			u = &sandbox.TenantUsage{Tenant: sb.Tenant}
			use[sb.Tenant] = u
		}
		u.Sandboxes++
		u.VCPUs += sb.CPUs
		u.MemoryMiB += sb.MemoryMiB
		u.DiskMiB += sb.DiskMiB
	}
	for _, u := range use {
		o.Tenants = append(o.Tenants, *u)
	}
	if c.Admin {
		o.RuntimeWhy = "--runtime qemu"
		o.Host = &sandbox.HostFigures{Disk: statedir.DiskFigures{Total: 100 << 30, Free: 60 << 30, Reserve: 5 << 30}, MemTotal: 8 << 30, MemAvailable: 6 << 30}
	}
	return o, nil
}

// TestServerOverview: GET /v1/server gives a tenant its own figures and
// its key's quotas, nothing of another tenant and no host figures; an
// admin every tenant (those with keys and no sandbox too) with their
// quotas, the host and the runtime's reason. No key, no answer.
func TestServerOverview(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{MaxSandboxes: 3, MaxVCPUs: 5})
	if _, _, err := h.st.CreateKey(t.Context(), store.APIKey{Tenant: "carol", MaxMemoryMiB: 4096}); err != nil {
		t.Fatal(err)
	}
	get := func(key string) (ServerOverview, string) {
		t.Helper()
		r := h.do(key, "GET", "/v1/server", nil)
		if r.code != 200 {
			t.Fatalf("GET /v1/server: %d %s", r.code, r.body)
		}
		var o ServerOverview
		if err := json.Unmarshal(r.body, &o); err != nil {
			t.Fatal(err)
		}
		return o, string(r.body)
	}

	o, body := get(h.alice)
	if o.Admin || o.Host != nil || o.Runtime != (ServerRuntime{Name: "qemu"}) || strings.Contains(body, `"host"`) || strings.Contains(body, `"why"`) {
		t.Errorf("a tenant's overview has admin figures: %s", body)
	}
	if o.Sandboxes["running"] != 1 || o.Sandboxes["paused"] != 0 || len(o.Sandboxes) != len(allStates) {
		t.Errorf("alice's sandboxes by state: %v", o.Sandboxes)
	}
	def := sandbox.DefaultLimits
	want := TenantQuota{MaxSandboxes: 3, MaxVCPUs: 5, MaxMemoryMB: def.MaxMemoryMiB, MaxDiskMB: def.MaxDiskMiB, MaxSnapshots: def.MaxSnapshots, MaxVolumes: def.MaxVolumes}
	if len(o.Tenants) != 1 || o.Tenants[0].Tenant != "alice" || o.Tenants[0].Sandboxes != 1 || o.Tenants[0].Quota == nil || *o.Tenants[0].Quota != want {
		t.Errorf("alice's tenants: %s", body)
	}
	for _, other := range []string{"bob", "carol", "ops"} {
		if strings.Contains(body, other) {
			t.Errorf("alice's overview names %s: %s", other, body)
		}
	}
	if len(o.Activity.Creates) != 24 || o.Activity.BucketS != 3600 || o.Activity.Since.IsZero() {
		t.Errorf("alice's activity: %+v", o.Activity)
	}

	o, body = get(h.admin)
	if !o.Admin || o.Host == nil || o.Host.DiskFreeBytes != 60<<30 || o.Host.MemoryAvailableBytes != 6<<30 || o.Runtime.Why != "--runtime qemu" {
		t.Errorf("the admin's overview: %s", body)
	}
	if o.Sandboxes["running"] != 2 {
		t.Errorf("the admin's sandboxes by state: %v", o.Sandboxes)
	}
	var names []string
	byName := map[string]TenantUsage{}
	for _, u := range o.Tenants {
		names = append(names, u.Tenant)
		byName[u.Tenant] = u
	}
	if strings.Join(names, ",") != "alice,bob,carol,ops" {
		t.Errorf("the admin's tenants: %v", names)
	}
	if q := byName["carol"].Quota; q == nil || q.MaxMemoryMB != 4096 || byName["carol"].Sandboxes != 0 {
		t.Errorf("carol (a key, no sandbox): %+v", byName["carol"])
	}
	if q := byName["alice"].Quota; q == nil || *q != want || byName["bob"].Sandboxes != 1 {
		t.Errorf("alice and bob for the admin: %+v %+v", byName["alice"], byName["bob"])
	}

	if r := h.do("", "GET", "/v1/server", nil); r.code != 401 {
		t.Errorf("no key: %d %s", r.code, r.body)
	}
}

// Logs gives the console to whoever sees the sandbox and the supervisor's
// log to admins, as the manager does.
func (f *fake) Logs(_ context.Context, c sandbox.Caller, id string, tail int64) ([]sandbox.LogTail, error) {
	if _, err := f.lookup(c, id); err != nil {
		return nil, err
	}
	console := []byte("boot\n<b>guest</b>\xff\n")
	out := []sandbox.LogTail{{Source: sandbox.LogConsole, Exists: true, Size: int64(len(console)), Text: console[max(int64(len(console))-tail, 0):]}}
	if c.Admin {
		out = append(out, sandbox.LogTail{Source: sandbox.LogSupervisor})
	}
	return out, nil
}

// TestSandboxLogs: the logs route answers the console as text (invalid
// UTF-8 replaced), its end when tail_bytes is smaller, the supervisor's
// log only to an admin, and bob's sandbox as a missing one.
func TestSandboxLogs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	var out struct{ Logs []SandboxLog }
	r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/logs", nil)
	if err := json.Unmarshal(r.body, &out); r.code != 200 || err != nil {
		t.Fatalf("logs: %d %s", r.code, r.body)
	}
	if len(out.Logs) != 1 || out.Logs[0] != (SandboxLog{Source: "console", Exists: true, Size: 19, Text: "boot\n<b>guest</b>\uFFFD\n"}) {
		t.Errorf("alice's logs: %s", r.body)
	}
	r = h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/logs?tail_bytes=2", nil)
	out.Logs = nil
	if err := json.Unmarshal(r.body, &out); r.code != 200 || err != nil || len(out.Logs) != 1 || !out.Logs[0].Truncated || out.Logs[0].Text != "\uFFFD\n" {
		t.Errorf("the last 2 bytes: %d %s", r.code, r.body)
	}
	for _, q := range []string{"0", "x", "1048577"} {
		if r := h.do(h.alice, "GET", "/v1/sandboxes/aliceaaaaaaa/logs?tail_bytes="+q, nil); r.code != 400 {
			t.Errorf("tail_bytes=%s: %d", q, r.code)
		}
	}
	r = h.do(h.admin, "GET", "/v1/sandboxes/aliceaaaaaaa/logs", nil)
	out.Logs = nil
	if err := json.Unmarshal(r.body, &out); r.code != 200 || err != nil || len(out.Logs) != 2 || out.Logs[1].Source != "supervisor" || out.Logs[1].Exists {
		t.Errorf("the admin's logs: %d %s", r.code, r.body)
	}
	if r := h.do(h.bob, "GET", "/v1/sandboxes/aliceaaaaaaa/logs", nil); r.code != 404 {
		t.Errorf("bob reads alice's logs: %d %s", r.code, r.body)
	}
}
