package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// idleSettle is how long a sandbox is left alone before its idle CPU is
// measured (a restored guest pages in and settles for a few seconds), and
// idleWindow how long the measurement lasts.
const (
	idleSettle = 10 * time.Second
	idleWindow = 30 * time.Second
)

// densityBench starts idle sandboxes of rtName one after another (create
// until the first exec answers, through the CLI) until max run, the
// host's available memory falls below reserve, or a create fails or takes
// over a minute. Then it measures what they cost each, idle: memory (the
// drop of MemAvailable) and CPU (their shims' and VMMs' CPU time over
// idleWindow), and how the last create compares with the first.
func densityBench(ctx context.Context, c airlockCLI, l statedir.Layout, rtName string, max int, reserve int64) ([][3]string, error) {
	var ids []string
	defer func() { removeAll(c, ids) }()
	avail0 := memAvailable()
	var first, last time.Duration
	stop := fmt.Sprintf("the limit of %d", max)
	for len(ids) < max {
		if a := memAvailable(); a < reserve {
			stop = fmt.Sprintf("the memory reserve (%d MiB available, %d MiB kept)", a>>20, reserve>>20)
			break
		}
		t := time.Now()
		id, err := c.run("--runtime", rtName, "create")
		if err == nil {
			ids = append(ids, id)
			_, err = c.run("exec", id, "--", "true")
		}
		d := time.Since(t)
		if err != nil {
			stop = fmt.Sprintf("a failed create (%v)", err)
			break
		}
		if len(ids) == 1 {
			first = d
		}
		last = d
		if len(ids)%25 == 0 {
			fmt.Fprintf(os.Stderr, "bench: %s density: %d running, the last create %s\n", rtName, len(ids), ms(d))
		}
		if d > time.Minute {
			stop = "a create that took over a minute"
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	n := len(ids)
	if n == 0 {
		return nil, fmt.Errorf("%s density: no sandbox started: %s", rtName, stop)
	}
	var locks []string
	for _, id := range ids {
		locks = append(locks, l.ShimLock(id))
	}
	share, window, err := idleCPU(ctx, locks)
	if err != nil {
		return nil, err
	}
	each := share / float64(n) * 100
	mem := (avail0 - memAvailable()) / int64(n)
	p := "density, " + rtName + ": "
	return [][3]string{
		{p + "idle sandboxes started one after another", strconv.Itoa(n), "stopped by " + stop},
		{p + "host memory each (drop of MemAvailable / sandboxes)", fmt.Sprintf("%d MiB", mem>>20), fmt.Sprintf("%d MiB for %d", (mem*int64(n))>>20, n)},
		{p + "CPU each while idle (shims and VMMs)", fmt.Sprintf("%.2f%% of a core", each), fmt.Sprintf("%.2f%% for %d, over %.0f s", each*float64(n), n, window.Seconds())},
		{p + "last create until the first exec answers, against the first", fmt.Sprintf("%.2fx", float64(last)/float64(first)), fmt.Sprintf("%s then %s", ms(first), ms(last))},
	}, nil
}

// idleCPU leaves the sandboxes whose shims' lock files are given alone
// for idleSettle, then returns the CPU their shims and VMMs use over
// idleWindow, as a share of one core, and the window's length.
func idleCPU(ctx context.Context, shimLocks []string) (share float64, window time.Duration, err error) {
	if err := clock.Sleep(ctx, idleSettle); err != nil {
		return 0, 0, err
	}
	var pids []int
	for _, lock := range shimLocks {
		pids = append(pids, sandboxPIDs(lock)...)
	}
	cpu0, t0 := processCPU(pids), time.Now()
	if err := clock.Sleep(ctx, idleWindow); err != nil {
		return 0, 0, err
	}
	window = time.Since(t0)
	return float64(processCPU(pids)-cpu0) / float64(window), window, nil
}

// idleCPURow measures the CPU an idle sandbox's shim and VMM use.
func idleCPURow(ctx context.Context, l statedir.Layout, id, rtName string) ([3]string, error) {
	share, _, err := idleCPU(ctx, []string{l.ShimLock(id)})
	if err != nil {
		return [3]string{}, err
	}
	pct := share * 100
	what := "CPU of an idle sandbox (shim + VMM), " + rtName
	if rtName == "gvisor" {
		what = "CPU of an idle sandbox (shim + runsc, gofer, sentry), " + rtName
	}
	return [3]string{what, fmt.Sprintf("%.2f%% of a core", pct), fmt.Sprintf("over %.0f s, after %.0f s idle", idleWindow.Seconds(), idleSettle.Seconds())}, nil
}

// removeAll removes sandboxes, 50 per airlock rm.
func removeAll(c airlockCLI, ids []string) {
	for len(ids) > 0 {
		n := min(50, len(ids))
		_, _ = c.run(append([]string{"rm"}, ids[:n]...)...)
		ids = ids[n:]
	}
}

// sandboxPIDs returns the pid of the shim in lockFile and those of all
// its descendants (the VMM, or runsc and its sentry and gofer).
func sandboxPIDs(lockFile string) []int {
	b, err := os.ReadFile(lockFile)
	if err != nil {
		return nil
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil
	}
	var pids []int
	var walk func(pid int)
	walk = func(pid int) {
		pids = append(pids, pid)
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, t := range tasks {
			cb, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(cb)) {
				if c, err := strconv.Atoi(f); err == nil {
					walk(c)
				}
			}
		}
	}
	walk(pid)
	return pids
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's CPU times (100 on
// every Linux architecture airlock runs on).
const clockTick = 100

// processCPU sums the user and system CPU time of pids (those gone count
// nothing).
func processCPU(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command name, which may hold spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 { // utime and stime are fields 14 and 15 (11, 12 here)
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return time.Duration(ticks) * time.Second / clockTick
}

// memAvailable is MemAvailable of /proc/meminfo, in bytes.
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
