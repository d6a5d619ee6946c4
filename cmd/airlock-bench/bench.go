package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// benchOptions are the command's flags.
type benchOptions struct {
	runs, execs, apiConcurrent, warmConcurrent, netMiB, neighbourExecs int
	procExecs                                                          int // the process audit rows' loop
	procRuntimes                                                       []string
	secretsReqs                                                        int // the secret interceptor rows' requests
	simSandboxes                                                       int // the cluster simulation's sandboxes
	volMiB, volFiles                                                   int // the volume rows' workload
	transferMiB                                                        int64
	only                                                               []string // row groups to measure; none for all
	e2bRuns                                                            int
	json                                                               bool   // print JSON instead of the table
	codeRuns                                                           int    // fresh sandboxes per language in the first code run rows
	density                                                            int    // most idle sandboxes per runtime in the density rows
	densityReserveMiB                                                  int64  // MemAvailable the density rows keep
	e2bDir                                                             string // test/e2b: bench.mjs and the pinned SDK
}

// benchGroups are the row groups --only selects from.
var benchGroups = []string{"start", "code", "density", "neighbour", "bare", "pause", "fork", "template", "net", "proc", "secrets", "volumes", "browser", "api", "e2b", "cluster", "warm"}

// want reports whether row group g is measured.
func (o benchOptions) want(g string) bool {
	return len(o.only) == 0 || slices.Contains(o.only, g)
}

// bench measures every row and prints the table on stdout (progress on
// stderr). When a group fails, the rows measured before it are printed
// before the error is returned.
func bench(ctx context.Context, cfg config, o benchOptions) (err error) {
	runs, execs := o.runs, o.execs
	// qemu unless a row names its runtime (a later --runtime wins).
	c := airlockCLI{ctx: ctx, cfg: cfg, base: []string{"--state-dir", cfg.stateDir, "--accel", cfg.accel, "--runtime", "qemu"}}
	cli := c.run
	m, done, err := openManager(ctx, cfg)
	if err != nil {
		return err
	}
	defer done()
	bc, err := m.L.LoadBootConfig()
	if err != nil {
		return err
	}
	rt, err := newQEMU(cfg, bc)
	if err != nil {
		return err
	}
	caps, err := rt.Probe(ctx)
	if err != nil {
		return err
	}
	var rows []row
	h := header{Accel: caps.Accel, AccelReason: caps.AccelReason, VMM: caps.VMMVersion, Kernel: bc.KernelRelease, CPUs: cpuCount()}
	defer func() {
		if err != nil && len(rows) > 0 {
			fmt.Fprintln(os.Stderr, "bench: the rows measured before the error:")
			_ = printTable(os.Stderr, h, rows)
		}
	}()

	// The runtimes present: qemu, and gvisor where runsc is installed.
	runtimes := []string{"qemu"}
	if _, err := gvisor.FindRunsc(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: no runsc, no gvisor rows:", err)
	} else {
		runtimes = append(runtimes, "gvisor")
	}
	hasGVisor := len(runtimes) > 1
	// perRuntime measures a row group on each runtime present (progress
	// says what, an error names group) and adds its rows.
	perRuntime := func(what, group string, measure func(rtName string) ([][3]string, error)) error {
		for _, rtName := range runtimes {
			fmt.Fprintf(os.Stderr, "bench: %s %s rows\n", rtName, what)
			rs, err := measure(rtName)
			if err != nil {
				return fmt.Errorf("%s %s: %w", rtName, group, err)
			}
			for _, r := range rs {
				rows = append(rows, row{r[0], r[1], r[2]})
			}
		}
		return nil
	}

	if o.want("start") {
		if err := perRuntime("start, exec and memory", "bench", func(rtName string) ([][3]string, error) {
			return startBench(ctx, m, cli, rtName, runs, execs)
		}); err != nil {
			return err
		}
	}
	if o.codeRuns > 0 && o.want("code") {
		if err := perRuntime("first code run", "code bench", func(rtName string) ([][3]string, error) {
			return codeBench(c, rtName, o.codeRuns)
		}); err != nil {
			return err
		}
	}
	if o.density > 0 && o.want("density") {
		if err := perRuntime(fmt.Sprintf("density (up to %d idle sandboxes)", o.density), "density bench", func(rtName string) ([][3]string, error) {
			return densityBench(ctx, c, m.L, rtName, o.density, o.densityReserveMiB<<20)
		}); err != nil {
			return err
		}
	}
	if o.neighbourExecs > 0 && o.want("neighbour") {
		if err := perRuntime("CPU-burning neighbour", "neighbour bench", func(rtName string) ([][3]string, error) {
			return neighbourBench(ctx, m, cli, rtName, o.neighbourExecs)
		}); err != nil {
			return err
		}
	}
	if hasGVisor && o.want("start") {
		var gvD []time.Duration
		for range runs {
			t := time.Now()
			out, err := cli("--runtime", "gvisor", "run", "--", "python3", "-c", "print(6*7)")
			if err != nil || out != "42" {
				return fmt.Errorf("gvisor run: %q %v", out, err)
			}
			gvD = append(gvD, time.Since(t))
		}
		rows = append(rows, row{"`airlock run --runtime gvisor -- python3 -c 'print(6*7)'`", ms(median(gvD)), fmt.Sprintf("median of %d; gVisor systrap", runs)})
	}

	if o.want("bare") {
		if err := perRuntime("bare baselines", "bare bench", func(rtName string) ([][3]string, error) {
			return bareBench(ctx, m, cli, bc, cfg.stateDir, rtName, runs)
		}); err != nil {
			return err
		}
	}

	if o.want("pause") {
		if err := perRuntime("pause/resume", "pause bench", func(rtName string) ([][3]string, error) {
			var rows [][3]string
			for _, fill := range []int{0, 128} {
				pr, err := pauseBench(ctx, m, cli, rtName, runs, fill)
				if err != nil {
					return nil, err
				}
				rows = append(rows, pr...)
			}
			return rows, nil
		}); err != nil {
			return err
		}
	}
	if o.want("fork") {
		if err := perRuntime("snapshot and fork", "fork bench", func(rtName string) ([][3]string, error) {
			fr, err := forkBench(ctx, m, cli, rtName)
			if err != nil {
				return nil, err
			}
			_, err = m.PruneSnapshots(ctx, sandbox.Local()) // the forks' base
			return fr, err
		}); err != nil {
			return err
		}
	}

	if o.want("warm") {
		if err := perRuntime("warm pool", "warm bench", func(rtName string) ([][3]string, error) {
			return warmBench(ctx, m, rtName, runs, o.warmConcurrent)
		}); err != nil {
			return err
		}
	}

	if o.want("cluster") {
		fmt.Fprintln(os.Stderr, "bench: cluster rows")
		cr, err := clusterBench(ctx, cfg, m, cli, runs, o.simSandboxes)
		if err != nil {
			return fmt.Errorf("cluster bench: %w", err)
		}
		rows = append(rows, cr...)
	}

	if o.want("template") {
		if err := perRuntime("template", "template bench", func(rtName string) ([][3]string, error) {
			// The manager builds on rtName for these rows only.
			m.Runtime = func(context.Context) (string, error) { return rtName, nil }
			defer func() { m.Runtime = func(context.Context) (string, error) { return "qemu", nil } }()
			return templateBench(ctx, m, runs, rtName)
		}); err != nil {
			return err
		}
	}

	if o.netMiB > 0 && o.want("net") {
		fmt.Fprintln(os.Stderr, "bench: network rows")
		nr, err := netBench(ctx, c, o.netMiB, 50)
		if err != nil {
			return fmt.Errorf("network bench: %w", err)
		}
		for _, r := range nr {
			rows = append(rows, row{r[0], r[1], r[2]})
		}
	}

	if o.procExecs > 0 && o.want("proc") {
		procRuntimes := o.procRuntimes
		if len(procRuntimes) == 0 {
			procRuntimes = runtimes
		}
		for _, rtName := range procRuntimes {
			fmt.Fprintf(os.Stderr, "bench: %s process audit rows\n", rtName)
			pr, err := procBench(ctx, c, rtName, o.procExecs, 3)
			if err != nil {
				return fmt.Errorf("%s process audit bench: %w", rtName, err)
			}
			for _, r := range pr {
				rows = append(rows, row{r[0], r[1], r[2]})
			}
		}
	}

	if o.secretsReqs > 0 && o.want("secrets") {
		fmt.Fprintln(os.Stderr, "bench: secret interceptor rows (HTTP/1.1 and HTTP/2, host only)")
		sr, err := secretsBench(ctx, o.secretsReqs, 5)
		if err != nil {
			return fmt.Errorf("secret interceptor bench: %w", err)
		}
		for _, r := range sr {
			rows = append(rows, row{r[0], r[1], r[2]})
		}
	}

	if o.volMiB > 0 && o.want("volumes") {
		fmt.Fprintln(os.Stderr, "bench: volume and host mount rows")
		vr, err := volumesBench(ctx, c, runtimes, o.volMiB, o.volFiles)
		if err != nil {
			return fmt.Errorf("volume bench: %w", err)
		}
		for _, r := range vr {
			rows = append(rows, row{r[0], r[1], r[2]})
		}
	}

	if o.want("browser") {
		fmt.Fprintln(os.Stderr, "bench: browser rows (host Chromium, browser sandboxes)")
		br, err := browserBench(ctx, c, m.L, caps.Accel)
		if err != nil {
			return fmt.Errorf("browser bench: %w", err)
		}
		for _, r := range br {
			rows = append(rows, row{r[0], r[1], r[2]})
		}
	}

	if o.apiConcurrent > 0 && o.want("api") {
		fmt.Fprintln(os.Stderr, "bench: API rows (starts airlock serve)")
		ar, err := apiBench(ctx, cfg, m, runs, o.apiConcurrent, o.transferMiB)
		if err != nil {
			return fmt.Errorf("api bench: %w", err)
		}
		rows = append(rows, ar...)
	}

	if o.e2bRuns > 0 && o.want("e2b") {
		fmt.Fprintln(os.Stderr, "bench: E2B SDK rows (starts airlock serve and node)")
		er, err := e2bBench(ctx, cfg, o.e2bDir, o.e2bRuns)
		if err != nil {
			return fmt.Errorf("e2b bench: %w", err)
		}
		rows = append(rows, er...)
	}

	if o.json {
		return printJSON(os.Stdout, h, rows)
	}
	return printTable(os.Stdout, h, rows)
}

// startBench measures one runtime: `run -- true`, create until the first
// exec answers, the exec round trip through the shim, and an idle
// sandbox's host memory. Rows name the runtime.
func startBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error), rtName string, runs, execs int) ([][3]string, error) {
	rcli := func(args ...string) (string, error) { return cli(append([]string{"--runtime", rtName}, args...)...) }
	// Warm-up: builds the template (qemu) or extracts the image tree
	// (gvisor) if missing.
	if _, err := rcli("run", "--", "true"); err != nil {
		return nil, fmt.Errorf("warm-up run: %w", err)
	}
	var rows [][3]string
	var runD []time.Duration
	for range runs {
		t := time.Now()
		if _, err := rcli("run", "--", "true"); err != nil {
			return nil, err
		}
		runD = append(runD, time.Since(t))
	}
	rows = append(rows, [3]string{"`airlock run -- true` (create+exec+rm, CLI processes), " + rtName, ms(median(runD)), fmt.Sprintf("median of %d", runs)})

	var createD []time.Duration
	var ids []string
	defer func() {
		for _, id := range ids {
			_, _ = cli("rm", id)
		}
	}()
	for range runs {
		t := time.Now()
		id, err := rcli("create")
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
		if _, err := cli("exec", id, "--", "true"); err != nil {
			return nil, err
		}
		createD = append(createD, time.Since(t))
	}
	how := "template clone"
	if rtName == "gvisor" {
		how = "runsc, shared image tree"
	}
	rows = append(rows, [3]string{"`create` until the first exec answers (" + how + "), " + rtName, ms(median(createD)), fmt.Sprintf("median of %d, two CLI processes", runs)})

	// Exec round trip through the manager and the shim, in one client.
	var execD []time.Duration
	for range execs {
		t := time.Now()
		if err := benchTrue(ctx, m, ids[0]); err != nil {
			return nil, err
		}
		execD = append(execD, time.Since(t))
	}
	rows = append(rows, [3]string{"exec round trip (`true`, via shim socket), " + rtName, ms(median(execD)), fmt.Sprintf("median of %d", execs)})
	// The floor under it: what the guest itself takes to fork and exec
	// `true` and wait for it (a shell loop, timed inside the guest).
	spawn, err := guestSpawn(cli, ids[0])
	if err != nil {
		return nil, err
	}
	rows = append(rows, [3]string{"exec round trip, vs the guest's own fork, exec and wait of `true`, " + rtName,
		fmt.Sprintf("%s (%.1fx)", ms(median(execD)), float64(median(execD))/float64(spawn)),
		fmt.Sprintf("in the guest: %.1f ms per `true` (a shell loop of %d, timed in the guest); the rest is airlock's path and the guest's exec envelope", float64(spawn)/float64(time.Millisecond), guestSpawnLoop)})

	time.Sleep(2 * time.Second) // let the idle guest settle
	rss, pss := sandboxMemory(m.L.ShimLock(ids[0]))
	what := "host memory of an idle sandbox (shim + VMM), " + rtName
	if rtName == "gvisor" {
		what = "host memory of an idle sandbox (shim + runsc, gofer, sentry), " + rtName
	}
	rows = append(rows, [3]string{what, fmt.Sprintf("RSS %d MiB, PSS %d MiB", rss>>10, pss>>10), fmt.Sprintf("%d sandboxes running", len(ids))})
	idle, err := idleCPURow(ctx, m.L, ids[0], rtName)
	if err != nil {
		return nil, err
	}
	return append(rows, idle), nil
}

// guestSpawnLoop is how many `true`s guestSpawn times.
const guestSpawnLoop = 100

// guestSpawn is how long sandbox id's guest takes to fork, exec and wait
// for `/bin/true`, timed inside the guest over a shell loop.
func guestSpawn(cli func(...string) (string, error), id string) (time.Duration, error) {
	loop := fmt.Sprintf(`s=$(date +%%s%%N); i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done; e=$(date +%%s%%N); echo $(( (e-s) / %d ))`, guestSpawnLoop, guestSpawnLoop)
	out, err := cli("exec", id, "--", "sh", "-c", loop)
	if err != nil {
		return 0, fmt.Errorf("the guest's spawn loop: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || ns <= 0 {
		return 0, fmt.Errorf("the guest's spawn loop printed %q", out)
	}
	return time.Duration(ns), nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func cpuCount() int {
	n, _ := strconv.Atoi(strings.TrimSpace(func() string { out, _ := exec.Command("nproc").Output(); return string(out) }()))
	return n
}

// sandboxMemory sums RSS and PSS (KiB) of the shim whose pid is in lockFile
// and all its descendants (the VMM).
func sandboxMemory(lockFile string) (rss, pss int64) {
	for _, pid := range sandboxPIDs(lockFile) {
		r, p := smapsRollup(pid)
		rss += r
		pss += p
	}
	return rss, pss
}

func smapsRollup(pid int) (rss, pss int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fs[1], 10, 64)
		switch fs[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	return rss, pss
}

// bareBoot boots the kernel+initramfs with a plain QEMU command line (the
// notes' recipe, no airlock code in the loop) and times it to the banner.
func bareBoot(ctx context.Context, bc statedir.BootConfig, stateDir string) (time.Duration, error) {
	dir, err := os.MkdirTemp("", "airlock-bench-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	khz, err := qemu.HostTSCkHz(stateDir)
	if err != nil {
		return 0, err
	}
	accel, extra := "tcg", " tsc_early_khz="+strconv.FormatInt(khz, 10) // without it a third of TCG boots hang
	start := time.Now()
	q := exec.Command("qemu-system-x86_64", "-M", "microvm,x-option-roms=off,isa-serial=on", "-accel", accel, "-cpu", "max",
		"-m", "256", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "null",
		"-kernel", bc.Kernel, "-initrd", bc.Initrd, "-append", "console=ttyS0 quiet panic=-1 airlock.probe=1"+extra,
		"-device", "virtio-serial-device", "-chardev", "socket,id=agent,path="+sock,
		"-device", "virtserialport,chardev=agent,name=airlock")
	q.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := q.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = q.Process.Kill(); _ = q.Wait() }()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	type res struct {
		d   time.Duration
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- res{0, err}
			return
		}
		defer c.Close()
		buf := make([]byte, len(agentapi.Banner))
		_, err = io.ReadFull(c, buf)
		ch <- res{time.Since(start), err}
	}()
	select {
	case r := <-ch:
		return r.d, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// benchTrue runs `true` in sandbox id through the manager's exec path and
// waits for its exit (code 0).
func benchTrue(ctx context.Context, m *sandbox.Manager, id string) error {
	st, err := m.Exec(ctx, sandbox.Local(), id, guest.ExecSpec{Argv: []string{"true"}}, false)
	if err != nil {
		return fmt.Errorf("exec true: %w", err)
	}
	defer st.Close()
	exit, err := guest.Drain(st, nil, nil)
	if err != nil || exit.Code != 0 {
		return fmt.Errorf("exec true: %v %+v", err, exit)
	}
	return nil
}
