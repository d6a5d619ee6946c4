package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// sampled counts the fake's SampleUsage calls by sandbox id (ids are
// unique across the tests that look; other tests' fakes, which do not
// share a mutex, count the same ids too: the counters are atomic).
var sampled sync.Map

// SampleUsage makes the fake a UsageSampler: a running sandbox answers
// figures derived from its row; one whose metadata has usage=hang answers
// only when ctx ends; usage=nonet has no network (no network counters).
func (f *fake) SampleUsage(ctx context.Context, id string) (guest.Usage, error) {
	n, _ := sampled.LoadOrStore(id, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	f.mu.Lock()
	sb, ok := f.sbs[id]
	f.mu.Unlock()
	switch {
	case !ok:
		return guest.Usage{}, errdefs.ErrNotFound
	case sb.State != store.StateRunning:
		return guest.Usage{}, errdefs.ErrFailedPrecondition
	case sb.Metadata["usage"] == "hang":
		<-ctx.Done()
		return guest.Usage{}, ctx.Err()
	}
	u := guest.Usage{CPUBusy: 1500 * time.Millisecond, CPUTotal: 4 * time.Second, CPUs: sb.CPUs,
		MemTotal: uint64(sb.MemoryMiB) << 20, MemAvailable: 128 << 20, DiskTotal: 2 << 30, DiskUsed: 256 << 20}
	if sb.Metadata["usage"] != "nonet" {
		u.Network = &guest.NetworkUsage{ReceiveBytes: 3 << 20, TransmitBytes: 1 << 20, ReceiveFrames: 2500, TransmitFrames: 1500,
			Connections: 2, DialsAllowed: 5, DialsDenied: 1, EgressBytes: 4096, FlowsLimited: 3, DatagramsLimited: 7}
	}
	return u, nil
}

// egressTotals are what the fake answers as TenantEgress (the recorded
// egress of ended runs), by fake.
var egressTotals sync.Map // *fake -> map[string]uint64

// TenantEgress makes the fake an EgressTotaler.
func (f *fake) TenantEgress(context.Context) (map[string]uint64, error) {
	v, _ := egressTotals.Load(f)
	m, _ := v.(map[string]uint64)
	return m, nil
}

func sampleCalls(id string) int64 {
	n, ok := sampled.Load(id)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// obsServer is a Server on the fake with keys for alice and bob, for the
// metrics and access log tests.
type obsServer struct {
	s           *Server
	f           *fake
	url         string
	alice, bob  string
	aliceKeyID  string
	accessLines *testutil.Buffer
}

func newObsServer(t *testing.T, withAccessLog bool) *obsServer {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o := &obsServer{f: newFake(), accessLines: &testutil.Buffer{}}
	o.f.ev = st
	rec, alice, err := st.CreateKey(t.Context(), store.APIKey{Tenant: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	o.alice, o.aliceKeyID = alice, rec.ID
	if _, o.bob, err = st.CreateKey(t.Context(), store.APIKey{Tenant: "bob"}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Sandboxes: o.f, Files: o.f, Execs: o.f, Contexts: o.f, Ports: o.f, Snapshots: o.f, Events: st, Keys: st}
	if withAccessLog {
		cfg.AccessLog = newJSONLogger(o.accessLines)
	}
	if o.s, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(o.s)
	t.Cleanup(srv.Close)
	o.url = srv.URL
	return o
}

func (o *obsServer) do(t *testing.T, key, method, path, body string, hdr ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, o.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, b
}

// scrape returns /metrics as series (name{labels} as the text format
// writes them, labels sorted) -> value.
func (o *obsServer) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	code, b := o.do(t, "", "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("GET /metrics: %d %s", code, b)
	}
	return testutil.ParseMetrics(t, b)
}

func (f *fake) setState(id string, st store.State, meta map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sbs[id]
	sb.State, sb.Metadata = st, meta
	f.sbs[id] = sb
}

// TestUsageMetrics: per-sandbox series carry sandbox_id and tenant, the
// per-tenant ones tenant alone, with the guest's figures; a paused
// sandbox is never asked (a scrape must not resume it) but its host disk
// is reported; a guest that does not answer is skipped and counted.
func TestUsageMetrics(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, false)
	o.f.add("usagealice01", "alice")
	o.f.add("usagealice02", "alice")
	o.f.add("usagebob0001", "bob")
	o.f.add("usagepaused1", "alice")
	o.f.setState("usagepaused1", store.StatePaused, nil)

	m := o.scrape(t)
	sb := func(name, id, tenant string) string {
		return fmt.Sprintf("%s{sandbox_id=%q,tenant=%q}", name, id, tenant)
	}
	const mib = 1 << 20
	want := map[string]float64{
		sb("airlock_sandbox_cpu_seconds_total", "usagealice01", "alice"):  1.5,
		sb("airlock_sandbox_memory_bytes", "usagealice01", "alice"):       (512 - 128) * mib,
		sb("airlock_sandbox_memory_limit_bytes", "usagealice01", "alice"): 512 * mib,
		sb("airlock_sandbox_disk_bytes", "usagealice01", "alice"):         256 * mib,
		sb("airlock_sandbox_disk_limit_bytes", "usagealice01", "alice"):   2048 * mib,
		sb("airlock_sandbox_host_disk_bytes", "usagealice01", "alice"):    12 * mib, // the fake's DiskUsage: len(id) MiB
		sb("airlock_sandbox_memory_bytes", "usagebob0001", "bob"):         384 * mib,
		sb("airlock_sandbox_host_disk_bytes", "usagepaused1", "alice"):    12 * mib,
		`airlock_tenant_cpu_seconds{tenant="alice"}`:                      3,
		`airlock_tenant_memory_bytes{tenant="alice"}`:                     2 * 384 * mib,
		`airlock_tenant_disk_bytes{tenant="alice"}`:                       2 * 256 * mib,
		`airlock_tenant_host_disk_bytes{tenant="alice"}`:                  3 * 12 * mib,
		`airlock_tenant_memory_bytes{tenant="bob"}`:                       384 * mib,
		`airlock_tenant_sandboxes{state="running",tenant="alice"}`:        2,
		`airlock_tenant_sandboxes{state="paused",tenant="alice"}`:         1,
		`airlock_tenant_sandboxes{state="running",tenant="bob"}`:          1,
		`airlock_metrics_sandboxes_skipped`:                               0,
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	for k := range m {
		if strings.Contains(k, `sandbox_id="usagepaused1"`) && !strings.HasPrefix(k, "airlock_sandbox_host_disk_bytes{") {
			t.Errorf("a paused sandbox has guest figures: %s", k)
		}
		if strings.HasPrefix(k, "airlock_tenant_") && strings.Contains(k, "sandbox_id") {
			t.Errorf("a per-tenant series carries sandbox_id: %s", k)
		}
	}
	if n := sampleCalls("usagepaused1"); n != 0 {
		t.Errorf("the scrape asked the paused sandbox's guest %d times", n)
	}

	// A guest that does not answer: left out and counted, the scrape
	// still answers.
	u := o.s.metrics.usage
	u.mu.Lock()
	u.perSandbox = 50 * time.Millisecond
	u.mu.Unlock()
	o.f.setState("usagealice02", store.StateRunning, map[string]string{"usage": "hang"})
	m = o.scrape(t)
	if m["airlock_metrics_sandboxes_skipped"] != 1 {
		t.Errorf("skipped = %v, want 1", m["airlock_metrics_sandboxes_skipped"])
	}
	if _, ok := m[sb("airlock_sandbox_memory_bytes", "usagealice02", "alice")]; ok {
		t.Error("a sandbox that did not answer has guest figures")
	}
	if got := m[`airlock_tenant_memory_bytes{tenant="alice"}`]; got != 384*mib {
		t.Errorf("alice's memory = %v, want only the answering sandbox's %v", got, 384*mib)
	}

	// Prometheus naming conventions (units, _total on counters only).
	mfs, err := o.s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "airlock_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestUsageNetworkMetrics: the network counters of each running sandbox
// with a network, as counters (bytes) and a gauge (connections) with
// sandbox_id and tenant, summed per tenant; a sandbox without a network
// has no network series but its other figures, and its tenant's sums are
// zero, not absent.
func TestUsageNetworkMetrics(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, false)
	o.f.add("netalice0001", "alice")
	o.f.add("netalice0002", "alice")
	o.f.add("netbobnonet1", "bob")
	o.f.setState("netbobnonet1", store.StateRunning, map[string]string{"usage": "nonet"})
	o.f.add("netpaused001", "alice")
	o.f.setState("netpaused001", store.StatePaused, nil)

	m := o.scrape(t)
	sb := func(name, id, tenant string) string {
		return fmt.Sprintf("%s{sandbox_id=%q,tenant=%q}", name, id, tenant)
	}
	const mib = 1 << 20
	want := map[string]float64{
		sb("airlock_sandbox_network_receive_bytes_total", "netalice0001", "alice"):  3 * mib,
		sb("airlock_sandbox_network_transmit_bytes_total", "netalice0001", "alice"): 1 * mib,
		sb("airlock_sandbox_network_connections", "netalice0001", "alice"):          2,
		sb("airlock_sandbox_network_receive_bytes_total", "netalice0002", "alice"):  3 * mib,
		sb("airlock_sandbox_memory_bytes", "netbobnonet1", "bob"):                   384 * mib,
		`airlock_tenant_network_receive_bytes{tenant="alice"}`:                      6 * mib,
		`airlock_tenant_network_transmit_bytes{tenant="alice"}`:                     2 * mib,
		`airlock_tenant_network_connections{tenant="alice"}`:                        4,
		`airlock_tenant_network_receive_bytes{tenant="bob"}`:                        0,
		`airlock_tenant_network_transmit_bytes{tenant="bob"}`:                       0,
		`airlock_tenant_network_connections{tenant="bob"}`:                          0,
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	for k := range m {
		if strings.HasPrefix(k, "airlock_sandbox_network_") && (strings.Contains(k, "netbobnonet1") || strings.Contains(k, "netpaused001")) {
			t.Errorf("a sandbox without a network, or paused, has network series: %s", k)
		}
	}
	// The types: bytes are counters (rate() works on them), connections
	// a gauge.
	mfs, err := o.s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, mf := range mfs {
		types[mf.GetName()] = mf.GetType().String()
	}
	for name, typ := range map[string]string{
		"airlock_sandbox_network_receive_bytes_total":  "COUNTER",
		"airlock_sandbox_network_transmit_bytes_total": "COUNTER",
		"airlock_sandbox_network_connections":          "GAUGE",
		"airlock_tenant_network_receive_bytes":         "GAUGE",
		"airlock_tenant_network_connections":           "GAUGE",
	} {
		if types[name] != typ {
			t.Errorf("%s is a %q, want %s", name, types[name], typ)
		}
	}
}

// TestUsageEgressMetrics: per-sandbox egress bytes and limit counters; a
// tenant's egress total adds its ended runs (recorded) to its running
// sandboxes' counts and never goes down.
func TestUsageEgressMetrics(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, false)
	o.f.add("egralice0001", "alice")
	o.f.add("egralice0002", "alice")
	egressTotals.Store(o.f, map[string]uint64{"alice": 10000, "carol": 500})
	m := o.scrape(t)
	for k, v := range map[string]float64{
		`airlock_sandbox_network_egress_bytes_total{sandbox_id="egralice0001",tenant="alice"}`:             4096,
		`airlock_sandbox_network_limited_total{kind="flows",sandbox_id="egralice0001",tenant="alice"}`:     3,
		`airlock_sandbox_network_limited_total{kind="datagrams",sandbox_id="egralice0002",tenant="alice"}`: 7,
		`airlock_tenant_network_egress_bytes_total{tenant="alice"}`:                                        10000 + 2*4096,
		`airlock_tenant_network_egress_bytes_total{tenant="carol"}`:                                        500,
	} {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	// A sandbox stops and its shim's count is not recorded yet: the total
	// holds; once recorded it grows.
	o.f.setState("egralice0002", store.StatePaused, nil)
	if got := o.scrape(t)[`airlock_tenant_network_egress_bytes_total{tenant="alice"}`]; got != 10000+2*4096 {
		t.Fatalf("alice's total after a stop: %v, want it held at %v", got, 10000+2*4096)
	}
	egressTotals.Store(o.f, map[string]uint64{"alice": 10000 + 4096 + 100, "carol": 500})
	if got := o.scrape(t)[`airlock_tenant_network_egress_bytes_total{tenant="alice"}`]; got != 10000+2*4096+100 {
		t.Fatalf("alice's total once recorded: %v", got)
	}
	mfs, err := o.s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.Contains(mf.GetName(), "egress") || strings.Contains(mf.GetName(), "limited") {
			if mf.GetType().String() != "COUNTER" {
				t.Errorf("%s is a %s, want a counter", mf.GetName(), mf.GetType())
			}
		}
	}
}

// TestUsageMetricsBudget: a scrape's cost is bounded by its budget, not by
// the number of sandboxes times a guest's timeout.
func TestUsageMetricsBudget(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, false)
	for i := range 4 {
		id := fmt.Sprintf("budgethang%02d", i)
		o.f.add(id, "alice")
		o.f.setState(id, store.StateRunning, map[string]string{"usage": "hang"})
	}
	u := o.s.metrics.usage
	u.mu.Lock()
	u.budget, u.perSandbox, u.workers = 200*time.Millisecond, time.Minute, 1
	u.mu.Unlock()
	t0 := time.Now()
	m := o.scrape(t)
	if took := time.Since(t0); took > 20*time.Second {
		t.Errorf("the scrape took %v with a budget of 200ms", took)
	}
	if m["airlock_metrics_sandboxes_skipped"] != 4 {
		t.Errorf("skipped = %v, want 4", m["airlock_metrics_sandboxes_skipped"])
	}
}

// TestExecMetrics: exec starts are counted and timed by tenant, failures
// apart.
func TestExecMetrics(t *testing.T) {
	t.Parallel()
	o := newObsServer(t, false)
	o.f.add("execalice001", "alice")
	o.f.add("execbob00001", "bob")
	if code, b := o.do(t, o.alice, "POST", "/v1/sandboxes/execalice001/exec", `{"cmd":["true"]}`); code != 200 {
		t.Fatalf("exec: %d %s", code, b)
	}
	if code, b := o.do(t, o.alice, "POST", "/v1/sandboxes/execbob00001/exec", `{"cmd":["true"]}`); code != 404 {
		t.Fatalf("exec in another tenant's sandbox: %d %s", code, b)
	}
	m := o.scrape(t)
	for k, v := range map[string]float64{
		`airlock_execs_total{result="started",tenant="alice"}`: 1,
		`airlock_execs_total{result="failed",tenant="alice"}`:  1,
		`airlock_exec_start_seconds_count{tenant="alice"}`:     1,
	} {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	if _, ok := m[`airlock_execs_total{result="started",tenant="bob"}`]; ok {
		t.Error("bob has execs")
	}
	if o.s.Execs() == nil {
		t.Error("Server.Execs is nil")
	}
}
