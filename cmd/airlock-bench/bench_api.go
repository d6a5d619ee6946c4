package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// apiBench starts a real `airlock serve`, then measures creates through the
// API (one at a time and --api-concurrent at once) and a 200 MB upload and download with
// the server's peak RSS.
func apiBench(ctx context.Context, cfg config, m *sandbox.Manager, runs, concurrent int, transferMiB int64) ([]row, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	k, key, err := m.Store.CreateKey(ctx, store.APIKey{Tenant: "bench", MaxSandboxes: concurrent + 5, MaxVCPUs: concurrent + 5,
		MaxMemoryMiB: (concurrent + 5) * 512, MaxDiskMiB: (concurrent + 5) * 4096, RatePerMin: 100000})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := m.Store.RevokeKey(context.WithoutCancel(ctx), k.ID); err != nil {
			fmt.Fprintln(os.Stderr, "bench: revoke the API key:", err)
		}
	}()
	srv := exec.Command(cfg.airlock, "--state-dir", cfg.stateDir, "--accel", cfg.accel, "serve", "--listen", addr)
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = srv.Process.Signal(syscall.SIGTERM); _ = srv.Wait() }()
	base := "http://" + addr
	hc := &http.Client{Timeout: 10 * time.Minute}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := hc.Get(base + "/healthz"); err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("serve did not start")
		}
	}
	call := func(method, path string, body io.Reader, out any) error {
		req, err := http.NewRequestWithContext(ctx, method, base+path, body)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode >= 300 {
			b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, b)
		}
		if out != nil {
			return json.NewDecoder(res.Body).Decode(out)
		}
		_, err = io.Copy(io.Discard, res.Body)
		return err
	}
	create := func() (string, time.Duration, error) {
		t := time.Now()
		var sb struct{ ID string }
		err := call("POST", "/v1/sandboxes", strings.NewReader(`{}`), &sb)
		return sb.ID, time.Since(t), err
	}
	var rows []row

	var single []time.Duration
	for range runs {
		id, d, err := create()
		if err != nil {
			return nil, err
		}
		single = append(single, d)
		if err := call("DELETE", "/v1/sandboxes/"+id, nil, nil); err != nil {
			return nil, err
		}
	}
	rows = append(rows, row{"API `POST /v1/sandboxes`, one at a time", ms(median(single)), fmt.Sprintf("median of %d", runs)})

	var mu sync.Mutex
	var ds []time.Duration
	var ids []string
	var firstErr error
	var wg sync.WaitGroup
	t0 := time.Now()
	for range concurrent {
		wg.Go(func() {
			id, d, err := create()
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if err == nil {
				ds = append(ds, d)
				ids = append(ids, id)
			}
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	defer func() {
		for _, id := range ids {
			_ = call("DELETE", "/v1/sandboxes/"+id, nil, nil)
		}
	}()
	if firstErr != nil {
		return nil, fmt.Errorf("%d concurrent creates: %w", concurrent, firstErr)
	}
	slices.Sort(ds)
	p99 := ds[len(ds)*99/100]
	rows = append(rows, row{fmt.Sprintf("API creates, %d at once: p99, against one create", concurrent),
		fmt.Sprintf("%s (%.2fx)", ms(p99), float64(p99)/float64(median(single))),
		fmt.Sprintf("all %d succeeded; p50 %s, p95 %s; %s wall for all; one at a time %s", len(ds), ms(ds[len(ds)/2]), ms(ds[len(ds)*95/100]), ms(wall), ms(median(single)))})

	// Exec round trip through the API (start, stream and exit of `true`),
	// alternating with the same exec through the manager and the shim
	// socket (the start rows' exec round trip), on one sandbox.
	id := ids[0]
	var execD, shimD []time.Duration
	for range max(runs, 20) {
		t := time.Now()
		if err := call("POST", "/v1/sandboxes/"+id+"/exec", strings.NewReader(`{"cmd":["true"]}`), nil); err != nil {
			return nil, err
		}
		execD = append(execD, time.Since(t))
		t = time.Now()
		if err := benchTrue(ctx, m, id); err != nil {
			return nil, err
		}
		shimD = append(shimD, time.Since(t))
	}
	rows = append(rows, row{"API exec round trip (`POST .../exec` of `true`, NDJSON to the exit), vs via the shim socket",
		fmt.Sprintf("%s (%.2fx)", ms(median(execD)), float64(median(execD))/float64(median(shimD))),
		fmt.Sprintf("median of %d each, alternating, one sandbox; via the shim socket %s; target at most 1.5x", len(execD), ms(median(shimD)))})

	// 200 MB up and down through the API, server memory watched.
	src := make([]byte, 1<<20)
	_, _ = rand.Read(src)
	upHash := sha256.New()
	pr, pw := io.Pipe()
	go func() {
		for range transferMiB {
			upHash.Write(src)
			if _, err := pw.Write(src); err != nil {
				return
			}
		}
		pw.Close()
	}()
	t := time.Now()
	if err := call("PUT", "/v1/sandboxes/"+id+"/files?path=/srv/blob", pr, nil); err != nil {
		return nil, err
	}
	up := time.Since(t)
	t = time.Now()
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/sandboxes/"+id+"/files?path=/srv/blob", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	downHash := sha256.New()
	n, err := io.Copy(downHash, res.Body)
	res.Body.Close()
	if err != nil {
		return nil, err
	}
	down := time.Since(t)
	if n != transferMiB<<20 || !bytes.Equal(upHash.Sum(nil), downHash.Sum(nil)) {
		return nil, fmt.Errorf("download: %d bytes, sha256 mismatch=%v", n, !bytes.Equal(upHash.Sum(nil), downHash.Sum(nil)))
	}
	peak := vmHWM(srv.Process.Pid)
	rows = append(rows, row{fmt.Sprintf("API upload / download of %d MiB (sha256 equal)", transferMiB),
		fmt.Sprintf("%s / %s", ms(up), ms(down)), fmt.Sprintf("server peak RSS %d MiB over the whole run", peak>>10)})
	return rows, nil
}

// vmHWM returns a process's peak RSS in KiB.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			return v
		}
	}
	return 0
}
