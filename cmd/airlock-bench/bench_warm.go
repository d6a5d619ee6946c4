package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// warmBench measures a create until its first exec answers through this
// host's API, runs times starting a sandbox, then runs times taking one
// from a warm pool of one (refilled between creates, untimed), on
// runtime rtName; then, if concurrent > 0, that many creates at once from
// a pool of that size, filled first.
func warmBench(ctx context.Context, m *sandbox.Manager, rtName string, runs, concurrent int) ([][3]string, error) {
	m.Runtime = func(context.Context) (string, error) { return rtName, nil }
	defer func() { m.Runtime = func(context.Context) (string, error) { return "qemu", nil } }()
	hostAPI, err := api.New(api.Config{Sandboxes: m, Files: m, Execs: m, Contexts: m, Events: m.Store, Keys: m.Store})
	if err != nil {
		return nil, err
	}
	srv := httptest.NewServer(hostAPI)
	defer srv.Close()
	k, key, err := m.Store.CreateKey(ctx, store.APIKey{Tenant: "bench-warm", MaxSandboxes: concurrent + 4, MaxVCPUs: concurrent + 8,
		MaxMemoryMiB: (concurrent + 8) * 512, MaxDiskMiB: (concurrent + 8) * 4096, RatePerMin: 100000})
	if err != nil {
		return nil, err
	}
	defer func() { _ = m.Store.RevokeKey(context.WithoutCancel(ctx), k.ID) }()
	hc := &http.Client{Timeout: 10 * time.Minute}

	var cold, warm, coldPost, warmPost, coldCode, warmCode []time.Duration
	for range runs {
		d, post, src, err := createUntilExec(ctx, hc, srv.URL, key)
		if err != nil {
			return nil, fmt.Errorf("starting a sandbox: %w", err)
		}
		if src != "" {
			return nil, fmt.Errorf("a create with no warm pool came from %q", src)
		}
		cold, coldPost = append(cold, d), append(coldPost, post)
		c, src, err := createFirstCode(ctx, hc, srv.URL, key)
		if err != nil {
			return nil, fmt.Errorf("starting a sandbox: %w", err)
		}
		if src != "" {
			return nil, fmt.Errorf("a create with no warm pool came from %q", src)
		}
		coldCode = append(coldCode, c)
	}

	const pool = "bench"
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.RunWarm(wctx); close(done) }()
	defer func() {
		// The pool's sandbox goes before the filler stops.
		m.DeleteWarmPool(pool)
		err := waitFor(ctx, time.Minute, func() bool {
			sbs, err := m.Store.ListSandboxes(ctx)
			return err == nil && !slices.ContainsFunc(sbs, func(sb store.Sandbox) bool { return sb.Tenant == sandbox.WarmTenant })
		})
		if err != nil {
			fmt.Println("bench: the warm pool's sandbox was not removed:", err)
		}
		cancel()
		<-done
	}()
	if err := m.SetWarmPool(pool, sandbox.WarmPool{Image: "base", Size: 1}); err != nil {
		return nil, err
	}
	var fill []time.Duration
	filled := func() error {
		t := time.Now()
		if err := waitFor(ctx, 5*time.Minute, func() bool {
			st, err := m.WarmPools(ctx)
			return err == nil && st[pool].Ready == 1
		}); err != nil {
			st, _ := m.WarmPools(ctx)
			return fmt.Errorf("the warm pool did not fill (%+v): %w", st[pool], err)
		}
		fill = append(fill, time.Since(t))
		return nil
	}
	for range runs {
		if err := filled(); err != nil {
			return nil, err
		}
		d, post, src, err := createUntilExec(ctx, hc, srv.URL, key)
		if err != nil {
			return nil, fmt.Errorf("taking a warm sandbox: %w", err)
		}
		if src != "warm:"+pool {
			return nil, fmt.Errorf("a create with a ready warm sandbox came from %q", src)
		}
		warm, warmPost = append(warm, d), append(warmPost, post)
		if err := filled(); err != nil {
			return nil, err
		}
		// A pool sandbox counts as ready once started; on gVisor its
		// kernel may still be starting, and the first code waits for it.
		c, src, err := createFirstCode(ctx, hc, srv.URL, key)
		if err != nil {
			return nil, fmt.Errorf("taking a warm sandbox: %w", err)
		}
		if src != "warm:"+pool {
			return nil, fmt.Errorf("a create with a ready warm sandbox came from %q", src)
		}
		warmCode = append(warmCode, c)
	}
	w, c := median(warm), median(cold)
	wc, cc := median(warmCode), median(coldCode)
	var rows [][3]string
	if concurrent > 0 {
		r, err := warmConcurrent(ctx, m, hc, srv.URL, key, pool, concurrent, w)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return append([][3]string{{
		fmt.Sprintf("create until the first exec answers, %s, taking a warm pool's sandbox, vs starting one", rtName),
		fmt.Sprintf("%s (%.2fx)", ms(w), float64(w)/float64(c)),
		fmt.Sprintf("median of %d each, this host's API; starting one: %s; the create alone (POST answered): %s taking one, %s starting one; the rest is the first exec; the pool (base, 1 vCPU, 512 MiB, size 1) refilled between creates in %s (median, untimed)",
			runs, ms(c), ms(median(warmPost)), ms(median(coldPost)), ms(median(fill))),
	}, {
		fmt.Sprintf("first Python code call, %s, in a sandbox taken from a warm pool, vs one started for the create", rtName),
		fmt.Sprintf("%s (%.2fx)", ms(wc), float64(wc)/float64(cc)),
		fmt.Sprintf("median of %d each: POST /v1/sandboxes/{id}/code print(6*7) right after the create, through this host's API; started for the create: %s", runs, ms(cc)),
	}}, rows...), nil
}

// warmConcurrent fills warm pool pool to n sandboxes, then makes n creates
// at once through the API at base, each until its first exec answers, and
// states their p99 against one (one, measured before). Every create must
// take a pool's sandbox; the pool refills meanwhile, as it would.
func warmConcurrent(ctx context.Context, m *sandbox.Manager, hc *http.Client, base, key, pool string, n int, one time.Duration) ([3]string, error) {
	if err := m.SetWarmPool(pool, sandbox.WarmPool{Image: "base", Size: n}); err != nil {
		return [3]string{}, err
	}
	fmt.Fprintf(os.Stderr, "bench: filling a warm pool of %d\n", n)
	t := time.Now()
	if err := waitFor(ctx, 20*time.Minute, func() bool {
		st, err := m.WarmPools(ctx)
		return err == nil && st[pool].Ready == n
	}); err != nil {
		st, _ := m.WarmPools(ctx)
		return [3]string{}, fmt.Errorf("the warm pool of %d did not fill (%+v): %w", n, st[pool], err)
	}
	fill := time.Since(t)
	type res struct {
		id, src string
		d       time.Duration
		err     error
	}
	// The sandboxes are removed once all have answered, so that no
	// removal runs beside a create being timed.
	do := apiDo(ctx, hc, base, key)
	out := make(chan res, n)
	t = time.Now()
	for range n {
		go func() {
			id, src, d, _, err := createThenExec(do)
			out <- res{id, src, d, err}
		}()
	}
	var ds []time.Duration
	var ids []string
	var firstErr error
	for range n {
		r := <-out
		if r.id != "" {
			ids = append(ids, r.id)
		}
		switch {
		case firstErr != nil:
		case r.err != nil:
			firstErr = fmt.Errorf("%d creates at once from a warm pool: %w", n, r.err)
		case r.src != "warm:"+pool:
			firstErr = fmt.Errorf("%d creates at once from a warm pool of %d: one came from %q", n, n, r.src)
		}
		ds = append(ds, r.d)
	}
	wall := time.Since(t)
	for _, id := range ids {
		_, _ = do("DELETE", "/v1/sandboxes/"+id, "", http.StatusNoContent)
	}
	if firstErr != nil {
		return [3]string{}, firstErr
	}
	slices.Sort(ds)
	p99 := ds[len(ds)*99/100]
	return [3]string{
		fmt.Sprintf("%d creates at once, each until its first exec answers, from a warm pool of %d: p99, vs one from the pool", n, n),
		fmt.Sprintf("%s (%.2fx)", ms(p99), float64(p99)/float64(one)),
		fmt.Sprintf("all %d took a pool's sandbox; p50 %s, %s wall for all; one from the pool: %s; the pool filled in %s, and refills while they run; this host's API", n, ms(ds[len(ds)/2]), ms(wall), ms(one), ms(fill)),
	}, nil
}

// createFirstCode creates a sandbox through the API at base and times its
// first code call (Python, the default context), then deletes it.
func createFirstCode(ctx context.Context, hc *http.Client, base, key string) (time.Duration, string, error) {
	do := apiDo(ctx, hc, base, key)
	id, source, err := apiCreate(do)
	if err != nil {
		return 0, "", err
	}
	defer func() { _, _ = do("DELETE", "/v1/sandboxes/"+id, "", http.StatusNoContent) }()
	t := time.Now()
	out, err := do("POST", "/v1/sandboxes/"+id+"/code", `{"code":"print(6*7)"}`, http.StatusOK)
	d := time.Since(t)
	if err != nil {
		return 0, "", err
	}
	if !strings.Contains(string(out), "42") {
		return 0, "", fmt.Errorf("the first code call answered %s", out)
	}
	return d, source, nil
}

// waitFor polls cond every 20 ms until it holds, for up to d.
func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out after " + d.String())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
