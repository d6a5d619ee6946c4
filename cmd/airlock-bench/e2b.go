package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// e2bWhat names the measurement of the E2B rows.
const e2bWhat = "`Sandbox.create()` + first `commands.run('true')`"

// e2bBench measures issue #14's row: Sandbox.create() and the first
// commands.run('true') through the official E2B SDK (test/e2b/bench.mjs
// under node, against a real `airlock serve`), next to the same through
// airlock's own /v1 API from Go: POST /v1/sandboxes (template base, default
// size, lifetime 300 s, what the SDK asks for) and the first exec of
// `true`. The two alternate (SDK, /v1, SDK, /v1, ...) after one warm-up of
// each, so that the machine's noise falls on both alike; sandboxes are
// removed outside the timed parts. Without node or npm it returns one row
// that says the section was skipped.
func e2bBench(ctx context.Context, cfg config, dir string, runs int) ([]row, error) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s not found, no E2B rows\n", tool)
			return []row{{"E2B SDK " + e2bWhat + " vs `/v1`", "skipped: " + tool + " not found", "needs node >= 20 and npm"}}, nil
		}
	}
	script := filepath.Join(dir, "bench.mjs")
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("the SDK script (--e2b-dir): %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		// The install step of scripts/test-e2b.sh: the pinned SDKs.
		fmt.Fprintln(os.Stderr, "bench: npm ci in", dir)
		npm := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir, npm.Stdout, npm.Stderr = dir, os.Stderr, os.Stderr
		if err := npm.Run(); err != nil {
			return nil, fmt.Errorf("npm ci in %s: %w", dir, err)
		}
	}
	sdkVersion, err := packageVersion(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	if err != nil {
		return nil, err
	}
	nodeVersion, err := exec.CommandContext(ctx, "node", "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("node --version: %w", err)
	}

	base, stopServe, err := startServe(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer stopServe()
	cli := airlockCLI{ctx: ctx, cfg: cfg, base: []string{"--state-dir", cfg.stateDir, "--accel", cfg.accel, "--runtime", "qemu"}}
	key, err := cli.run("keys", "create", "--tenant", "bench-e2b")
	if err != nil {
		return nil, fmt.Errorf("keys create: %w", err)
	}
	defer func() {
		// e2b_<10 hex id><40 hex secret>
		if len(key) > 14 {
			if _, err := cli.run("keys", "revoke", key[4:14]); err != nil {
				fmt.Fprintln(os.Stderr, "bench: revoke the E2B key:", err)
			}
		}
	}()

	sdk, err := startSDKBench(ctx, script, base, key, runs+1)
	if err != nil {
		return nil, err
	}
	defer sdk.close()
	v1 := v1Client{ctx: ctx, hc: &http.Client{Timeout: 5 * time.Minute}, base: base, key: key}

	var sdkD, sdkCreate, sdkRun, v1D, v1Create, v1Run []time.Duration
	for i := range runs + 1 { // the first of each is the warm-up
		fmt.Fprintf(os.Stderr, "bench: e2b %d/%d\n", i, runs)
		s, err := sdk.next()
		if err != nil {
			return nil, err
		}
		create, run, err := v1.createRun()
		if err != nil {
			return nil, err
		}
		if i == 0 {
			continue
		}
		sdkD, sdkCreate, sdkRun = append(sdkD, msDur(s.TotalMS)), append(sdkCreate, msDur(s.CreateMS)), append(sdkRun, msDur(s.RunMS))
		v1D, v1Create, v1Run = append(v1D, create+run), append(v1Create, create), append(v1Run, run)
	}
	if err := sdk.close(); err != nil {
		return nil, err
	}

	note := fmt.Sprintf("%d of each, alternating with the other row after one warm-up each", runs)
	return []row{
		{fmt.Sprintf("E2B SDK %s (e2b %s, node %s): p50 / p90", e2bWhat, sdkVersion, strings.TrimSpace(string(nodeVersion))),
			ms(median(sdkD)) + " / " + ms(p90(sdkD)),
			note + fmt.Sprintf("; create %s + run %s (medians); the SDK runs `/bin/bash -l -c true`", ms(median(sdkCreate)), ms(median(sdkRun)))},
		{"the same through `/v1`: `POST /v1/sandboxes` + first `POST .../exec` of `true`: p50 / p90",
			ms(median(v1D)) + " / " + ms(p90(v1D)),
			note + fmt.Sprintf("; image base, default size, timeout_s 300; create %s + exec %s (medians)", ms(median(v1Create)), ms(median(v1Run)))},
		{"E2B SDK / `/v1`, create + first run: p50 / p90",
			fmt.Sprintf("%.2fx / %.2fx", float64(median(sdkD))/float64(median(v1D)), float64(p90(sdkD))/float64(p90(v1D))),
			"ratios of the two rows above"},
	}, nil
}

// p90 is the nearest-rank 90th percentile.
func p90(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(math.Ceil(0.9*float64(len(s))))-1]
}

func msDur(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func packageVersion(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var p struct{ Version string }
	if err := json.Unmarshal(b, &p); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return p.Version, nil
}

// startServe starts `airlock serve` on a free loopback port against the
// bench's state dir and waits until it answers /healthz. stop ends it
// (SIGTERM) and waits.
func startServe(ctx context.Context, cfg config) (base string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := exec.Command(cfg.airlock, "--state-dir", cfg.stateDir, "--accel", cfg.accel, "--log-level", "warn", "serve", "--access-log=false", "--listen", addr)
	srv.Stderr = os.Stderr
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := srv.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { _ = srv.Process.Signal(syscall.SIGTERM); _ = srv.Wait() }
	base = "http://" + addr
	hc := &http.Client{Timeout: 5 * time.Second}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
		if res, err := hc.Do(req); err == nil {
			res.Body.Close()
			return base, stop, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, errors.New("airlock serve did not answer /healthz within 20 s")
		}
	}
}

// sdkSample is one line of test/e2b/bench.mjs.
type sdkSample struct {
	SandboxID string  `json:"sandbox_id"`
	CreateMS  float64 `json:"create_ms"`
	RunMS     float64 `json:"run_ms"`
	TotalMS   float64 `json:"total_ms"`
}

// sdkBench is bench.mjs running in paced mode: each next() lets it do one
// iteration and returns its line.
type sdkBench struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
	done  bool
	err   error
}

func startSDKBench(ctx context.Context, script, base, key string, n int) (*sdkBench, error) {
	cmd := exec.CommandContext(ctx, "node", filepath.Base(script), "--paced", fmt.Sprint(n))
	cmd.Dir = filepath.Dir(script) // where node_modules/e2b is
	cmd.Env = append(os.Environ(), "E2B_API_URL="+base, "E2B_SANDBOX_URL="+base, "E2B_API_KEY="+key)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("node %s: %w", script, err)
	}
	return &sdkBench{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}, nil
}

func (b *sdkBench) next() (sdkSample, error) {
	if _, err := io.WriteString(b.stdin, "\n"); err != nil {
		return sdkSample{}, fmt.Errorf("bench.mjs: %w (%v)", err, b.close())
	}
	if !b.out.Scan() {
		return sdkSample{}, fmt.Errorf("bench.mjs ended early: %v", errors.Join(b.out.Err(), b.close()))
	}
	var s sdkSample
	if err := json.Unmarshal(b.out.Bytes(), &s); err != nil || s.SandboxID == "" {
		return sdkSample{}, fmt.Errorf("bench.mjs: unexpected line %q: %v", b.out.Text(), err)
	}
	return s, nil
}

// close ends the script's input and waits for it; it may be called again.
func (b *sdkBench) close() error {
	if !b.done {
		b.done = true
		b.stdin.Close()
		b.err = b.cmd.Wait()
		if b.err != nil {
			b.err = fmt.Errorf("node bench.mjs: %w", b.err)
		}
	}
	return b.err
}

// v1Client does the /v1 half of the E2B rows.
type v1Client struct {
	ctx       context.Context
	hc        *http.Client
	base, key string
}

func (c v1Client) do(method, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(c.ctx, method, c.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	res, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		res.Body.Close()
		return nil, fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, b)
	}
	return res, nil
}

// createRun creates a sandbox as the E2B SDK's default does (image base,
// default size, lifetime 300 s), runs `true` in it to its exit line, and
// removes it untimed.
func (c v1Client) createRun() (create, run time.Duration, err error) {
	t0 := time.Now()
	res, err := c.do(http.MethodPost, "/v1/sandboxes", `{"image":"base","timeout_s":300}`)
	if err != nil {
		return 0, 0, err
	}
	var sb struct{ ID string }
	err = json.NewDecoder(res.Body).Decode(&sb)
	res.Body.Close()
	if err != nil || sb.ID == "" {
		return 0, 0, fmt.Errorf("POST /v1/sandboxes: no id (%v)", err)
	}
	t1 := time.Now()
	defer func() {
		if res, derr := c.do(http.MethodDelete, "/v1/sandboxes/"+sb.ID, ""); derr != nil {
			err = errors.Join(err, derr)
		} else {
			res.Body.Close()
		}
	}()
	res, err = c.do(http.MethodPost, "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["true"]}`)
	if err != nil {
		return 0, 0, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var ev struct {
			Type string
			Code *int
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Type != "exit" {
			continue
		}
		if ev.Code == nil || *ev.Code != 0 {
			return 0, 0, fmt.Errorf("exec true: %s", sc.Text())
		}
		return t1.Sub(t0), time.Since(t1), nil
	}
	return 0, 0, fmt.Errorf("exec true: the stream ended without an exit line (%v)", sc.Err())
}
