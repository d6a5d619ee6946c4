package main

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
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/control"
	"github.com/airlock-sandbox/airlock/internal/control/controlsim"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil/pgtest"
)

// The cluster rows: the control tier's cost on a create (real QEMU), a
// paused sandbox resumed on another node against the same one (real
// QEMU, two state dirs on this host), and the simulation's rates (fake
// runtime, 10 nodes). The control tier's catalog is a real PostgreSQL
// (Debian's, started for the rows) where it is installed. Kubernetes is
// not on any of these paths (the Registry is a cache the control tier
// reads), so the nodes are a fixed list.

// benchCatalog starts PostgreSQL for the rows (SQLite in dir if it is not
// installed); stop ends it.
func benchCatalog(ctx context.Context, dir string) (url, what string, stop func(), err error) {
	if _, berr := pgtest.Bin(); berr != nil || os.Geteuid() != 0 {
		return filepath.Join(dir, "catalog.db"), "SQLite catalog (no PostgreSQL here)", func() {}, nil
	}
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return "", "", nil, err
	}
	url, err = pg.Database(ctx)
	if err != nil {
		pg.Stop()
		return "", "", nil, err
	}
	return url, "PostgreSQL catalog", pg.Stop, nil
}

// clusterCreateRow measures create until the first exec answers through
// the control tier (a replica on the catalog, proxying to this host's
// node API) against the same through this host's own API, alternating,
// runs times each.
func clusterCreateRow(ctx context.Context, m *sandbox.Manager, catalog, catWhat string, runs int) (row, error) {
	token := []byte(strings.Repeat("b", api.MinNodeToken))
	nodeAPI, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Events: m.Store, Keys: m.Store, NodeToken: token, Mover: m})
	if err != nil {
		return row{}, err
	}
	hostAPI, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Events: m.Store, Keys: m.Store})
	if err != nil {
		return row{}, err
	}
	nodeSrv, hostSrv := httptest.NewServer(nodeAPI), httptest.NewServer(hostAPI)
	defer nodeSrv.Close()
	defer hostSrv.Close()
	cat, err := store.Open(ctx, catalog)
	if err != nil {
		return row{}, err
	}
	defer cat.Close()
	replica, err := control.New(control.Config{Store: cat, Nodes: cluster.Static{{Name: "bench", Address: nodeSrv.URL, Live: true,
		Runtimes: []string{"qemu"}, CPUs: 64, MemoryMiB: 256 << 10}}, NodeToken: token})
	if err != nil {
		return row{}, err
	}
	ctlSrv := httptest.NewServer(replica)
	defer ctlSrv.Close()
	lim := store.APIKey{Tenant: "bench-cluster", MaxSandboxes: 4, MaxVCPUs: 8, MaxMemoryMiB: 4096, RatePerMin: 100000}
	hk, hostKey, err := m.Store.CreateKey(ctx, lim)
	if err != nil {
		return row{}, err
	}
	defer func() { _ = m.Store.RevokeKey(context.WithoutCancel(ctx), hk.ID) }()
	_, ctlKey, err := cat.CreateKey(ctx, lim)
	if err != nil {
		return row{}, err
	}
	hc := &http.Client{Timeout: 10 * time.Minute}
	once := func(base, key string) (time.Duration, error) {
		d, _, _, err := createUntilExec(ctx, hc, base, key)
		return d, err
	}
	var host, ctl []time.Duration
	for range runs {
		d, err := once(hostSrv.URL, hostKey)
		if err != nil {
			return row{}, fmt.Errorf("through this host's API: %w", err)
		}
		host = append(host, d)
		if d, err = once(ctlSrv.URL, ctlKey); err != nil {
			return row{}, fmt.Errorf("through the control tier: %w", err)
		}
		ctl = append(ctl, d)
	}
	c, h := median(ctl), median(host)
	return row{"create until the first exec answers through the cluster's control tier, vs this host's own API",
		fmt.Sprintf("%s (%.2fx)", ms(c), float64(c)/float64(h)),
		fmt.Sprintf("median of %d each, alternating; one host's API: %s; the replica reserves on its %s and proxies to the node API; target at most 1.3x", runs, ms(h), catWhat)}, nil
}

// createUntilExec creates a sandbox through the API at base (as key),
// runs `true` in it, and returns how long that took, how long the create
// alone took, and where the sandbox came from (its source); it removes
// the sandbox untimed.
func createUntilExec(ctx context.Context, hc *http.Client, base, key string) (total, create time.Duration, source string, err error) {
	do := apiDo(ctx, hc, base, key)
	id, source, total, create, err := createThenExec(do)
	if id != "" {
		_, _ = do("DELETE", "/v1/sandboxes/"+id, "", http.StatusNoContent)
	}
	if err != nil {
		return 0, 0, "", err
	}
	return total, create, source, nil
}

// createThenExec creates a sandbox with do (apiDo) and runs `true` in it:
// its id ("" if the create failed; the caller removes it) and source, how
// long the create and the exec took, and how long the create alone.
func createThenExec(do func(method, path, body string, want int) ([]byte, error)) (id, source string, total, create time.Duration, err error) {
	t := time.Now()
	if id, source, err = apiCreate(do); err != nil {
		return "", "", 0, 0, err
	}
	create = time.Since(t)
	_, err = do("POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["true"]}`, http.StatusOK)
	return id, source, time.Since(t), create, err
}

// apiCreate creates a sandbox with do (apiDo) and returns its id and
// source; the caller removes it.
func apiCreate(do func(method, path, body string, want int) ([]byte, error)) (id, source string, err error) {
	out, err := do("POST", "/v1/sandboxes", `{}`, http.StatusCreated)
	if err != nil {
		return "", "", err
	}
	var sb struct{ ID, Source string }
	if err := json.Unmarshal(out, &sb); err != nil || sb.ID == "" {
		return "", "", fmt.Errorf("POST /v1/sandboxes: no id in %s", out)
	}
	return sb.ID, sb.Source, nil
}

// apiDo returns a function that makes one call to the API at base with
// key and returns its body, or an error if it answered other than want.
func apiDo(ctx context.Context, hc *http.Client, base, key string) func(method, path, body string, want int) ([]byte, error) {
	return func(method, path, body string, want int) ([]byte, error) {
		req, _ := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != want {
			return nil, fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, b)
		}
		return b, nil
	}
}

// moveRows pause a sandbox and resume it on the same node, and export it
// (pause and bundle) and resume it on a second node of this host (its own
// state dir, linked from this one's), runs times each.
func moveRows(ctx context.Context, cfg config, m *sandbox.Manager, cli func(...string) (string, error), runs int) ([]row, error) {
	dstDir, err := os.MkdirTemp(filepath.Dir(cfg.stateDir), "bench-node-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dstDir)
	bundles, err := os.MkdirTemp("", "bench-bundles-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bundles)
	if err := m.L.CloneSetup(statedir.Layout{Root: dstDir}); err != nil {
		return nil, err
	}
	c2 := cfg
	c2.stateDir = dstDir
	if err := os.WriteFile(filepath.Join(dstDir, "catalog.db"), nil, 0o600); err != nil {
		return nil, err
	}
	m2, closeM2, err := openManager(ctx, c2)
	if err != nil {
		return nil, err
	}
	defer closeM2()
	m.Bundles, m2.Bundles = bundle.Dir{Root: bundles}, bundle.Dir{Root: bundles}
	defer func() { m.Bundles = nil }()
	var pauseD, exportD, sameD, otherD []time.Duration
	var size int64
	for range runs {
		id, err := cli("create")
		if err != nil {
			return nil, err
		}
		err = func() error {
			defer func() {
				_ = m2.Remove(context.WithoutCancel(ctx), sandbox.Local(), id)
				_ = m.Remove(context.WithoutCancel(ctx), sandbox.Local(), id)
			}()
			if err := benchTrue(ctx, m, id); err != nil {
				return err
			}
			t := time.Now()
			if _, err := m.Pause(ctx, sandbox.Local(), id, false); err != nil {
				return err
			}
			pauseD = append(pauseD, time.Since(t))
			t = time.Now()
			if _, err := m.Resume(ctx, sandbox.Local(), id); err != nil {
				return err
			}
			if err := benchTrue(ctx, m, id); err != nil {
				return err
			}
			sameD = append(sameD, time.Since(t))
			t = time.Now()
			ex, err := m.Export(ctx, sandbox.Local(), id, false)
			if err != nil {
				return err
			}
			if ex.Bundle == nil {
				return errors.New("export wrote no bundle: " + ex.Unmovable)
			}
			exportD, size = append(exportD, time.Since(t)), ex.Bundle.Bytes
			t = time.Now()
			if _, err := m2.Import(ctx, sandbox.Local(), *ex.Bundle); err != nil {
				return err
			}
			if _, err := m2.Resume(ctx, sandbox.Local(), id); err != nil {
				return err
			}
			if err := benchTrue(ctx, m2, id); err != nil {
				return err
			}
			otherD = append(otherD, time.Since(t))
			return nil
		}()
		if err != nil {
			return nil, err
		}
	}
	p, e, s, o := median(pauseD), median(exportD), median(sameD), median(otherD)
	note := fmt.Sprintf("median of %d; fresh 512 MiB sandbox, bundle %d MiB in a local directory", runs, size>>20)
	return []row{
		{"pause with its bundle written (export), vs pause alone", fmt.Sprintf("%s (%.2fx)", ms(e), float64(e)/float64(p)), note + "; pause alone: " + ms(p)},
		{"resume on another node (import, digest check, resume until the first exec answers), vs on the same node", fmt.Sprintf("%s (%.2fx)", ms(o), float64(o)/float64(s)), note + "; same node: " + ms(s)},
	}, nil
}

// simRows run the cluster simulation (controlsim: fake runtime, 10
// nodes, two replicas, 50 clients) and, as its baseline in the same run,
// the same work against one node's own API.
func simRows(ctx context.Context, catalog, catWhat string, sandboxes int) ([]row, error) {
	run := func(o controlsim.Options) (controlsim.Result, error) {
		dir, err := os.MkdirTemp("", "bench-sim-")
		if err != nil {
			return controlsim.Result{}, err
		}
		defer os.RemoveAll(dir)
		o.Dir = dir
		return controlsim.Run(ctx, o)
	}
	cl, err := run(controlsim.Options{Nodes: 10, Sandboxes: sandboxes, Clients: 50, Catalog: catalog})
	if err != nil {
		return nil, err
	}
	one, err := run(controlsim.Options{Nodes: 1, Sandboxes: sandboxes, Clients: 50, Direct: true})
	if err != nil {
		return nil, err
	}
	lo, hi := sandboxes, 0
	for _, n := range cl.PerNode {
		lo, hi = min(lo, n), max(hi, n)
	}
	var rows []row
	for i, ph := range cl.Phases {
		base := one.Phases[i]
		what := fmt.Sprintf("cluster simulation: %s, %d sandboxes over 10 nodes by 50 clients through 2 replicas (fake runtime), vs one host's API", ph.Name, sandboxes)
		note := fmt.Sprintf("p50 %s, p99 %s; one host: %.0f/s, p99 %s (ratio: the cluster's rate over one host's); %s", ms(ph.Quantile(0.5)), ms(ph.Quantile(0.99)), base.Rate(), ms(base.Quantile(0.99)), catWhat)
		if ph.Name == "create" {
			note += fmt.Sprintf("; target 100/s or more; placement %d to %d per node", lo, hi)
		}
		rows = append(rows, row{what, fmt.Sprintf("%.0f/s (%.2fx)", ph.Rate(), ph.Rate()/base.Rate()), note})
	}
	return rows, nil
}

// clusterBench measures the cluster rows.
func clusterBench(ctx context.Context, cfg config, m *sandbox.Manager, cli func(...string) (string, error), runs, simSandboxes int) ([]row, error) {
	dir, err := os.MkdirTemp("", "bench-cluster-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	catalog, catWhat, stop, err := benchCatalog(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer stop()
	create, err := clusterCreateRow(ctx, m, catalog, catWhat, runs)
	if err != nil {
		return nil, fmt.Errorf("cluster create: %w", err)
	}
	rows := []row{create}
	mv, err := moveRows(ctx, cfg, m, cli, runs)
	if err != nil {
		return nil, fmt.Errorf("resume on another node: %w", err)
	}
	rows = append(rows, mv...)
	if simSandboxes > 0 {
		sr, err := simRows(ctx, catalog, catWhat, simSandboxes)
		if err != nil {
			return nil, fmt.Errorf("cluster simulation: %w", err)
		}
		rows = append(rows, sr...)
	}
	return rows, nil
}
