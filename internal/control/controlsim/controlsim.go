// Package controlsim simulates a cluster on the fake runtime, for the
// control tier's test and make bench: nodes that are each a real
// sandbox.Manager over its own state dir and catalog, with its shims in
// this process, behind a real node API (api.Server with the node token);
// two control tier replicas (control.Server) on one catalog; and
// concurrent clients that create every sandbox, run a command in each,
// then pause, resume and remove them all, each phase timed.
//
// What it measures is airlock's own work (placement, the catalog, the
// proxying, the shims and their sockets), not a VMM's: the fake runtime
// boots nothing. Kubernetes is not on a request's path (the Registry is a
// cache), so the nodes are a fixed list.
package controlsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/control"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/shim/shimtest"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Options size a simulation.
type Options struct {
	Nodes, Sandboxes, Clients int
	// Catalog is the control tier's catalog: a postgres:// URL, or ""
	// for a SQLite file in Dir.
	Catalog string
	// Dir holds the nodes' state dirs (an empty directory).
	Dir string
	// Direct skips the control tier: one node serves the API itself
	// (tenant keys in its own catalog), as a single host does. The
	// baseline of the cluster's figures.
	Direct bool
}

// Phase is one phase's timing: its wall time and each sandbox's latency.
type Phase struct {
	Name      string
	Wall      time.Duration
	Latencies []time.Duration
}

// Rate is the phase's sandboxes per second.
func (p Phase) Rate() float64 { return float64(len(p.Latencies)) / p.Wall.Seconds() }

// Quantile is the q-quantile of the latencies.
func (p Phase) Quantile(q float64) time.Duration {
	s := slices.Clone(p.Latencies)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// Result is what a simulation measured.
type Result struct {
	Phases []Phase // create, exec, pause, resume, remove
	// PerNode is how many sandboxes each node got (after the creates).
	PerNode map[string]int
}

type node struct {
	env *shimtest.Env
	m   *sandbox.Manager
	srv *httptest.Server
}

// Run runs one simulation. Every call must succeed; the first failure
// ends it with an error. Whatever it made is removed before it returns.
func Run(ctx context.Context, o Options) (res Result, err error) {
	if o.Nodes < 1 || o.Sandboxes < 1 || o.Clients < 1 || o.Direct && o.Nodes != 1 {
		return res, errors.New("controlsim: Nodes, Sandboxes and Clients must be positive (Direct: one node)")
	}
	token := []byte(strings.Repeat("s", api.MinNodeToken))
	var nodes []*node
	defer func() {
		for _, n := range nodes {
			if n.srv != nil {
				n.srv.Close()
			}
			// What an error left: removed, so no shim outlives Run.
			if sbs, lerr := n.m.Store.ListSandboxes(context.WithoutCancel(ctx)); lerr == nil {
				for _, sb := range sbs {
					_ = n.m.Remove(context.WithoutCancel(ctx), sandbox.Local(), sb.ID)
				}
			}
			n.env.Store.Close()
		}
	}()
	var static cluster.Static
	for i := range o.Nodes {
		dir := filepath.Join(o.Dir, fmt.Sprintf("node-%02d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return res, err
		}
		env, err := shimtest.Prepare(ctx, dir)
		if err != nil {
			return res, err
		}
		m := &sandbox.Manager{L: env.L, Store: env.Store, DiskReserve: -1}
		m.StartShim = func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error {
			go func() {
				_ = shim.Run(context.Background(), shim.Config{StateDir: doc.StateDir, ID: doc.ID, Ready: ready, Lock: lock,
					Runtime: env.Runtime, DNS: doc.DNS, DiskReserve: doc.DiskReserve, NoProcAudit: true})
			}()
			return nil
		}
		n := &node{env: env, m: m}
		nodes = append(nodes, n)
		cfg := api.Config{Sandboxes: m, Files: m, Execs: m, Events: m.Store, Keys: m.Store, NodeToken: token, Mover: m}
		if o.Direct {
			cfg.NodeToken, cfg.Mover = nil, nil
		}
		s, err := api.New(cfg)
		if err != nil {
			return res, err
		}
		n.srv = httptest.NewServer(s)
		static = append(static, cluster.Node{Name: fmt.Sprintf("sim-%02d", i), Address: n.srv.URL, Live: true,
			Runtimes: []string{"qemu"}, CPUs: 64, MemoryMiB: 256 << 10})
	}
	var bases []string
	var keys []string
	var cat *store.Store
	if o.Direct {
		bases, cat = []string{nodes[0].srv.URL}, nodes[0].m.Store
	} else {
		path := o.Catalog
		if path == "" {
			path = filepath.Join(o.Dir, "catalog.db")
		}
		for range 2 {
			st, err := store.Open(ctx, path)
			if err != nil {
				return res, err
			}
			defer st.Close()
			cat = st
			s, err := control.New(control.Config{Store: st, Nodes: static, NodeToken: token})
			if err != nil {
				return res, err
			}
			srv := httptest.NewServer(s)
			defer srv.Close()
			bases = append(bases, srv.URL)
		}
	}
	n := o.Sandboxes
	for i := range 5 {
		_, k, err := cat.CreateKey(ctx, store.APIKey{Tenant: fmt.Sprintf("sim-t%d", i), MaxSandboxes: n, MaxVCPUs: n, MaxMemoryMiB: n << 10,
			MaxDiskMiB: n << 12, RatePerMin: 1 << 20})
		if err != nil {
			return res, err
		}
		keys = append(keys, k)
	}
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients}}
	defer hc.CloseIdleConnections()
	call := func(i int, method, path, body string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, method, bases[i%len(bases)]+path, strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+keys[i%len(keys)])
		r, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b), nil
	}
	want := func(i int, method, path, body string, status int, has string) error {
		code, out, err := call(i, method, path, body)
		if err != nil {
			return err
		}
		if code != status || !strings.Contains(out, has) {
			return fmt.Errorf("%s %s: %d %s", method, path, code, out)
		}
		return nil
	}
	ids := make([]string, n)
	phase := func(name string, step func(i int) error) error {
		ph := Phase{Name: name, Latencies: make([]time.Duration, n)}
		work := make(chan int)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var failed error
		t0 := time.Now()
		for range o.Clients {
			wg.Go(func() {
				for i := range work {
					s := time.Now()
					err := step(i)
					ph.Latencies[i] = time.Since(s)
					if err != nil {
						mu.Lock()
						if failed == nil {
							failed = fmt.Errorf("controlsim: %s of sandbox %d: %w", name, i, err)
						}
						mu.Unlock()
					}
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		ph.Wall = time.Since(t0)
		res.Phases = append(res.Phases, ph)
		return failed
	}
	if err := phase("create", func(i int) error {
		code, out, err := call(i, "POST", "/v1/sandboxes", `{"cpus":1,"memory_mb":256}`)
		if err != nil {
			return err
		}
		var sb struct{ ID string }
		if code != http.StatusCreated || json.Unmarshal([]byte(out), &sb) != nil {
			return fmt.Errorf("create: %d %s", code, out)
		}
		ids[i] = sb.ID
		return nil
	}); err != nil {
		return res, err
	}
	res.PerNode = map[string]int{}
	for i, nd := range nodes {
		sbs, err := nd.m.Store.ListSandboxes(ctx)
		if err != nil {
			return res, err
		}
		res.PerNode[static[i].Name] = len(sbs)
	}
	for _, p := range []struct {
		name, method, path, body string
		status                   int
		has                      string
	}{
		{"exec", "POST", "/exec", `{"cmd":["echo","sim"]}`, http.StatusOK, `"data":"sim\n"`},
		{"pause", "POST", "/pause", `{}`, http.StatusOK, `"state":"paused"`},
		{"resume", "POST", "/resume", ``, http.StatusOK, `"state":"running"`},
		{"remove", "DELETE", "", ``, http.StatusNoContent, ""},
	} {
		if err := phase(p.name, func(i int) error { return want(i, p.method, "/v1/sandboxes/"+ids[i]+p.path, p.body, p.status, p.has) }); err != nil {
			return res, err
		}
	}
	if !o.Direct {
		if ps, err := cat.ListPlacements(ctx, ""); err != nil || len(ps) != 0 {
			return res, fmt.Errorf("controlsim: %d placements left after the removes (%v)", len(ps), err)
		}
	}
	for i, nd := range nodes {
		if sbs, err := nd.m.Store.ListSandboxes(ctx); err != nil || len(sbs) != 0 {
			return res, fmt.Errorf("controlsim: node %d still has %d sandboxes (%v)", i, len(sbs), err)
		}
	}
	return res, nil
}
