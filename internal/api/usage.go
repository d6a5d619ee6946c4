package api

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// UsageSampler is an optional ability of a Sandboxes implementation, found
// by type assertion (the manager has it): /metrics reads each running
// sandbox's resource use with it. Sandboxes.Usage would not do: it resumes
// a paused sandbox, and a scrape must never wake one.
type UsageSampler interface {
	// SampleUsage asks sandbox id's guest for its resource use if the
	// sandbox is running; in any other state it is ErrFailedPrecondition
	// and the sandbox is left as it is. It acts for no tenant (the caller
	// is the server), is not activity (the idle timer does not see it) and
	// returns when ctx ends. Safe for concurrent use.
	SampleUsage(ctx context.Context, id string) (guest.Usage, error)
}

var _ UsageSampler = (*sandbox.Manager)(nil)

// EgressTotaler is an optional ability of a Sandboxes implementation,
// found by type assertion (the manager has it): the egress bytes of each
// tenant's ended shim runs, which /metrics adds to its running sandboxes'
// counts for the tenant's egress total.
type EgressTotaler interface {
	// TenantEgress returns each tenant's recorded egress bytes. Safe for
	// concurrent use.
	TenantEgress(ctx context.Context) (map[string]uint64, error)
}

var _ EgressTotaler = (*sandbox.Manager)(nil)

// What one scrape may cost: the sandbox list and every sample share
// usageBudget; one guest gets usagePerSandbox; usageWorkers sample at
// once. A sandbox that does not answer in time is left out of that
// scrape's per-sandbox and per-tenant figures and counted in
// airlock_metrics_sandboxes_skipped.
const (
	usageBudget     = 4 * time.Second
	usagePerSandbox = 2 * time.Second
	usageWorkers    = 8
)

// usageCollector reports resource use per sandbox and per tenant, sampled
// at scrape time: the guest's figures and its shim's network counters.
// Label sets: sandbox_id and tenant on the per-sandbox series
// (airlock_sandbox_*), tenant alone on the per-tenant ones
// (airlock_tenant_*); so the per-sandbox series number one per sandbox
// (running ones for the guest's figures, running ones with a network for
// the network's) and may be dropped at the scraper without losing the
// tenants'.
type usageCollector struct {
	sb      Sandboxes
	sampler UsageSampler       // nil: no guest figures
	hostDU  func(string) int64 // nil: no host disk figures
	totals  EgressTotaler      // nil: no recorded egress of ended runs

	budget, perSandbox time.Duration
	workers            int

	// mu lets one collection run at a time: concurrent scrapes queue, so at
	// most workers guests are asked at once.
	mu sync.Mutex
	// egress is the last egress total reported per tenant: the total never
	// goes down (a running sandbox a scrape misses, or a shim that ended
	// between the catalog read and its sample, would dip it).
	egress map[string]float64

	cpu, mem, memLimit, disk, diskLimit, hostDisk *prometheus.Desc // per sandbox
	netRx, netTx, netConns                        *prometheus.Desc // per sandbox with a network
	netEgress, netLimited                         *prometheus.Desc
	tCPU, tMem, tDisk, tHostDisk, tSandboxes      *prometheus.Desc // per tenant
	tNetRx, tNetTx, tNetConns, tNetEgress         *prometheus.Desc
	skipped                                       *prometheus.Desc
}

func newUsageCollector(sb Sandboxes, snaps Snapshots) *usageCollector {
	per := []string{"sandbox_id", "tenant"}
	ten := []string{"tenant"}
	c := &usageCollector{
		sb: sb, budget: usageBudget, perSandbox: usagePerSandbox, workers: usageWorkers,
		cpu:       prometheus.NewDesc("airlock_sandbox_cpu_seconds_total", "CPU time a running sandbox's guest has been busy since it booted, all vCPUs (the guest's own account).", per, nil),
		mem:       prometheus.NewDesc("airlock_sandbox_memory_bytes", "Memory a running sandbox's guest uses (total less available).", per, nil),
		memLimit:  prometheus.NewDesc("airlock_sandbox_memory_limit_bytes", "Memory a running sandbox's guest has (MemTotal).", per, nil),
		disk:      prometheus.NewDesc("airlock_sandbox_disk_bytes", "Bytes used on a running sandbox's root filesystem, as its guest sees it.", per, nil),
		diskLimit: prometheus.NewDesc("airlock_sandbox_disk_limit_bytes", "Size of a running sandbox's root filesystem, as its guest sees it.", per, nil),
		hostDisk:  prometheus.NewDesc("airlock_sandbox_host_disk_bytes", "Bytes a sandbox's files take on the host (disk overlay, saved memory of a paused one), in any state.", per, nil),
		netRx: prometheus.NewDesc("airlock_sandbox_network_receive_bytes_total",
			"Bytes a running sandbox received on its network: Ethernet frames its shim passed to the guest, headers included, counted on the host since the sandbox last started or resumed. Receive is the sandbox's point of view (downloads, answers to its requests).", per, nil),
		netTx: prometheus.NewDesc("airlock_sandbox_network_transmit_bytes_total",
			"Bytes a running sandbox transmitted on its network: Ethernet frames its guest sent to its shim, headers included, counted on the host since the sandbox last started or resumed. Transmit is the sandbox's point of view (uploads, its requests).", per, nil),
		netConns: prometheus.NewDesc("airlock_sandbox_network_connections", "TCP connections and UDP flows a running sandbox has open through its network, dialling or established.", per, nil),
		netEgress: prometheus.NewDesc("airlock_sandbox_network_egress_bytes_total",
			"Payload bytes the host sent to the internet for a running sandbox (TCP and UDP, no headers; DNS its shim answers is not counted), since the sandbox last started or resumed.", per, nil),
		netLimited: prometheus.NewDesc("airlock_sandbox_network_limited_total",
			"What a running sandbox's outbound abuse limits refused since it last started or resumed: kind flows (new connections over the connection rate or the distinct destinations per minute) or datagrams (UDP over the packet rate).", append(per, "kind"), nil),
		tCPU: prometheus.NewDesc("airlock_tenant_cpu_seconds",
			"CPU time the tenant's running sandboxes that answered have used since they booted (a gauge: it falls when a sandbox ends; for a rate use sum by (tenant) (rate(airlock_sandbox_cpu_seconds_total[5m]))).", ten, nil),
		tMem:       prometheus.NewDesc("airlock_tenant_memory_bytes", "Memory the tenant's running sandboxes that answered use.", ten, nil),
		tDisk:      prometheus.NewDesc("airlock_tenant_disk_bytes", "Bytes used on the root filesystems of the tenant's running sandboxes that answered.", ten, nil),
		tHostDisk:  prometheus.NewDesc("airlock_tenant_host_disk_bytes", "Bytes the tenant's sandboxes' files take on the host.", ten, nil),
		tSandboxes: prometheus.NewDesc("airlock_tenant_sandboxes", "The tenant's sandboxes by state.", []string{"tenant", "state"}, nil),
		tNetRx: prometheus.NewDesc("airlock_tenant_network_receive_bytes",
			"Bytes the tenant's running sandboxes that answered received on their networks (a gauge: it falls when a sandbox ends; for a rate use sum by (tenant) (rate(airlock_sandbox_network_receive_bytes_total[5m]))).", ten, nil),
		tNetTx: prometheus.NewDesc("airlock_tenant_network_transmit_bytes",
			"Bytes the tenant's running sandboxes that answered transmitted on their networks (a gauge: it falls when a sandbox ends; for a rate use sum by (tenant) (rate(airlock_sandbox_network_transmit_bytes_total[5m]))).", ten, nil),
		tNetConns: prometheus.NewDesc("airlock_tenant_network_connections", "TCP connections and UDP flows the tenant's running sandboxes that answered have open.", ten, nil),
		tNetEgress: prometheus.NewDesc("airlock_tenant_network_egress_bytes_total",
			"Payload bytes the host sent to the internet for the tenant's sandboxes, ended runs included: the totals their shims recorded when their networks closed (stop, pause, delete) plus the running sandboxes' counts. Never decreases while the server runs; a shim that crashes loses its run's count.", ten, nil),
		skipped: prometheus.NewDesc("airlock_metrics_sandboxes_skipped",
			"Running sandboxes this scrape left out because their guest did not answer in time or failed.", nil, nil),
	}
	c.sampler, _ = sb.(UsageSampler)
	c.totals, _ = sb.(EgressTotaler)
	c.egress = map[string]float64{}
	if snaps != nil {
		c.hostDU = snaps.DiskUsage
	}
	return c
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.mem, c.memLimit, c.disk, c.diskLimit, c.hostDisk,
		c.netRx, c.netTx, c.netConns, c.netEgress, c.netLimited,
		c.tCPU, c.tMem, c.tDisk, c.tHostDisk, c.tSandboxes, c.tNetRx, c.tNetTx, c.tNetConns, c.tNetEgress, c.skipped} {
		ch <- d
	}
}

// usageSample is what one scrape learnt of one sandbox.
type usageSample struct {
	u      guest.Usage
	guest  bool // u holds the guest's answer
	host   int64
	hostOK bool
}

// tenantUsage sums a tenant's samples.
type tenantUsage struct {
	cpu, mem, disk      float64
	host                float64
	netRx, netTx, conns float64
	egress              float64
	states              map[store.State]int
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.budget)
	defer cancel()
	sbs, err := c.sb.List(ctx, sandbox.Caller{Admin: true, Via: "metrics"})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.tSandboxes, err)
		return
	}
	samples := c.sample(ctx, sbs)
	tenants := map[string]*tenantUsage{}
	skipped := 0
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for i, sb := range sbs {
		t := tenants[sb.Tenant]
		if t == nil {
			t = &tenantUsage{states: map[store.State]int{}}
			tenants[sb.Tenant] = t
		}
		t.states[sb.State]++
		s := samples[i]
		if s.hostOK {
			gauge(c.hostDisk, float64(s.host), sb.ID, sb.Tenant)
			t.host += float64(s.host)
		}
		if c.sampler == nil || sb.State != store.StateRunning {
			continue
		}
		if !s.guest {
			skipped++
			continue
		}
		u := s.u
		used := float64(u.MemTotal - min(u.MemAvailable, u.MemTotal))
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, u.CPUBusy.Seconds(), sb.ID, sb.Tenant)
		gauge(c.mem, used, sb.ID, sb.Tenant)
		gauge(c.memLimit, float64(u.MemTotal), sb.ID, sb.Tenant)
		gauge(c.disk, float64(u.DiskUsed), sb.ID, sb.Tenant)
		gauge(c.diskLimit, float64(u.DiskTotal), sb.ID, sb.Tenant)
		t.cpu += u.CPUBusy.Seconds()
		t.mem += used
		t.disk += float64(u.DiskUsed)
		if n := u.Network; n != nil { // nil: the sandbox has no network
			ch <- prometheus.MustNewConstMetric(c.netRx, prometheus.CounterValue, float64(n.ReceiveBytes), sb.ID, sb.Tenant)
			ch <- prometheus.MustNewConstMetric(c.netTx, prometheus.CounterValue, float64(n.TransmitBytes), sb.ID, sb.Tenant)
			gauge(c.netConns, float64(n.Connections), sb.ID, sb.Tenant)
			ch <- prometheus.MustNewConstMetric(c.netEgress, prometheus.CounterValue, float64(n.EgressBytes), sb.ID, sb.Tenant)
			ch <- prometheus.MustNewConstMetric(c.netLimited, prometheus.CounterValue, float64(n.FlowsLimited), sb.ID, sb.Tenant, "flows")
			ch <- prometheus.MustNewConstMetric(c.netLimited, prometheus.CounterValue, float64(n.DatagramsLimited), sb.ID, sb.Tenant, "datagrams")
			t.netRx += float64(n.ReceiveBytes)
			t.netTx += float64(n.TransmitBytes)
			t.conns += float64(n.Connections)
			t.egress += float64(n.EgressBytes)
		}
	}
	if c.totals != nil {
		egress := map[string]float64{}
		for name, t := range tenants {
			egress[name] = t.egress
		}
		if rec, err := c.totals.TenantEgress(ctx); err == nil {
			for name, n := range rec {
				egress[name] += float64(n)
			}
		}
		for name, v := range egress {
			c.egress[name] = max(c.egress[name], v)
			ch <- prometheus.MustNewConstMetric(c.tNetEgress, prometheus.CounterValue, c.egress[name], name)
		}
	}
	for name, t := range tenants {
		for st, n := range t.states {
			gauge(c.tSandboxes, float64(n), name, string(st))
		}
		if c.hostDU != nil {
			gauge(c.tHostDisk, t.host, name)
		}
		if c.sampler != nil {
			gauge(c.tCPU, t.cpu, name)
			gauge(c.tMem, t.mem, name)
			gauge(c.tDisk, t.disk, name)
			gauge(c.tNetRx, t.netRx, name)
			gauge(c.tNetTx, t.netTx, name)
			gauge(c.tNetConns, t.conns, name)
		}
	}
	if c.sampler != nil {
		gauge(c.skipped, float64(skipped))
	}
}

// sample asks every sandbox of sbs for its figures, c.workers at a time,
// until ctx ends: those not reached by then are left zero.
func (c *usageCollector) sample(ctx context.Context, sbs []store.Sandbox) []usageSample {
	out := make([]usageSample, len(sbs))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(c.workers, len(sbs)) {
		wg.Go(func() {
			for i := range jobs {
				out[i] = c.sampleOne(ctx, sbs[i])
			}
		})
	}
feed:
	for i := range sbs {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return out
}

func (c *usageCollector) sampleOne(ctx context.Context, sb store.Sandbox) usageSample {
	var s usageSample
	if c.hostDU != nil {
		s.host, s.hostOK = c.hostDU(sb.ID), true
	}
	if c.sampler != nil && sb.State == store.StateRunning {
		sctx, cancel := context.WithTimeout(ctx, c.perSandbox)
		u, err := c.sampler.SampleUsage(sctx, sb.ID)
		cancel()
		s.u, s.guest = u, err == nil
	}
	return s
}

// meteredExecs counts and times exec starts by the caller's tenant.
type meteredExecs struct {
	Execs
	m *metrics
}

func (e meteredExecs) Exec(ctx context.Context, c sandbox.Caller, sandboxID string, spec guest.ExecSpec, killOnDetach bool) (guest.ExecStream, error) {
	t0 := time.Now()
	st, err := e.Execs.Exec(ctx, c, sandboxID, spec, killOnDetach)
	if err != nil {
		e.m.execs.WithLabelValues(c.Tenant, "failed").Inc()
		return st, err
	}
	e.m.execs.WithLabelValues(c.Tenant, "started").Inc()
	e.m.execLat.WithLabelValues(c.Tenant).Observe(time.Since(t0).Seconds())
	return st, nil
}
