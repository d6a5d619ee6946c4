package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// metrics are the server's Prometheus metrics, in their own registry.
// Labels: tenant (API keys' tenants, which an admin names: few), sandbox_id
// only on the per-sandbox series of usageCollector, route patterns (never
// raw paths) and status codes; never a guest's string.
type metrics struct {
	reg      *prometheus.Registry
	creates  prometheus.Counter
	execLat  *prometheus.HistogramVec // by tenant
	execs    *prometheus.CounterVec   // by tenant, result
	failures *prometheus.CounterVec
	requests *prometheus.CounterVec
	usage    *usageCollector
}

// sandboxCollector reports sandboxes by state at scrape time.
type sandboxCollector struct {
	sb   Sandboxes
	desc *prometheus.Desc
}

func (c sandboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sbs, err := c.sb.List(ctx, sandbox.Caller{Admin: true, Via: "metrics"})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	n := map[store.State]int{store.StateCreating: 0, store.StateRunning: 0, store.StateStopping: 0, store.StateFailed: 0,
		store.StatePausing: 0, store.StatePaused: 0, store.StateResuming: 0}
	for _, sb := range sbs {
		if _, ok := n[sb.State]; ok {
			n[sb.State]++
		}
	}
	for st, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), string(st))
	}
}

// diskCollector reports the state dir's free space and reserve, when the
// sandboxes' implementation knows them (the manager does).
type diskCollector struct {
	d interface {
		Disk() (statedir.DiskFigures, error)
	}
	free, resv *prometheus.Desc
}

func (c diskCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.free; ch <- c.resv }

func (c diskCollector) Collect(ch chan<- prometheus.Metric) {
	d, err := c.d.Disk()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.free, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.free, prometheus.GaugeValue, float64(d.Free))
	ch <- prometheus.MustNewConstMetric(c.resv, prometheus.GaugeValue, float64(d.Reserve))
}

func newMetrics(sb Sandboxes, snaps Snapshots) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		creates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "airlock_sandbox_creates_total", Help: "Sandboxes created through the API.",
		}),
		execLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "airlock_exec_start_seconds", Help: "Time to start an exec session (request to process started), by tenant.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12),
		}, []string{"tenant"}),
		execs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_execs_total", Help: "Exec sessions asked to start (API, terminals, E2B), by tenant and result (started, failed).",
		}, []string{"tenant", "result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_failures_total", Help: "Requests that failed on the server's side (5xx), by operation.",
		}, []string{"op"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "airlock_http_requests_total", Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
	}
	m.usage = newUsageCollector(sb, snaps)
	m.reg.MustRegister(m.creates, m.execLat, m.execs, m.failures, m.requests, m.usage,
		sandboxCollector{sb, prometheus.NewDesc("airlock_sandboxes", "Sandboxes by state.", []string{"state"}, nil)},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if d, ok := sb.(interface {
		Disk() (statedir.DiskFigures, error)
	}); ok {
		m.reg.MustRegister(diskCollector{d,
			prometheus.NewDesc("airlock_state_dir_free_bytes", "Free bytes on the state dir's filesystem.", nil, nil),
			prometheus.NewDesc("airlock_state_dir_reserve_bytes", "Free bytes kept in reserve: work that could use them is refused (507).", nil, nil)})
	}
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// routeOp names a route pattern for the failures counter ("POST
// /v1/sandboxes/{id}/exec" -> "exec").
func routeOp(pattern string) string {
	_, p, ok := strings.Cut(pattern, " ")
	if !ok {
		p = pattern // a route for all methods
	}
	if strings.HasSuffix(p, "/{path...}") {
		return "preview"
	}
	p = strings.TrimPrefix(p, "/v1/")
	if p == "" {
		return "other"
	}
	parts := strings.Split(p, "/")
	return parts[len(parts)-1]
}

// statusWriter records the status code; it passes Flush and deadlines
// through (http.ResponseController uses Unwrap).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush lets NDJSON streams flush through the wrapper.
func (w *statusWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

// instrument counts requests by route pattern (never the raw path: ids
// are not labels) and status code.
func (s *Server) instrument(pattern string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			s.metrics.requests.WithLabelValues(pattern, strconv.Itoa(code)).Inc()
		}()
		h.ServeHTTP(sw, r)
	})
}
