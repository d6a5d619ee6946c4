// Command airlock-bench measures an airlock installation and prints the
// latency and memory table of the README (`make bench`): cold runs, create
// until the first exec, the exec round trip and idle memory for each
// runtime present, pause/resume, fork, the sandbox network, volumes and
// host mounts next to the host's own disk, the HTTP API, and the E2B SDK
// next to airlock's own /v1.
//
// It drives a built airlock binary (--airlock) as a user would, and opens
// the same state directory for the rows that need the sandbox manager. It
// is a development tool, not part of the product binary.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/envknob"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// config is what every row needs: the airlock binary and the state it
// works on.
type config struct {
	airlock  string // absolute path of the airlock binary
	stateDir string
	accel    string
	log      *slog.Logger
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "airlock-bench:", err)
		os.Exit(1)
	}
}

// airlockCLI runs airlock commands as child processes, with the bench's
// --state-dir and --accel.
type airlockCLI struct {
	ctx  context.Context
	cfg  config
	base []string
}

// run runs airlock with args and returns its trimmed stdout.
func (c airlockCLI) run(args ...string) (string, error) { return c.runEnv(nil, args...) }

// runEnv is run with extra environment settings ("NAME=value") for this
// one command (and the shims it starts).
func (c airlockCLI) runEnv(env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(c.ctx, c.cfg.airlock, append(slices.Clone(c.base), args...)...)
	cmd.Stderr = os.Stderr
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// defaultAirlock is the airlock binary beside this one (make builds both
// into bin/).
func defaultAirlock() string {
	exe, err := os.Executable()
	if err != nil {
		return "airlock"
	}
	return filepath.Join(filepath.Dir(exe), "airlock")
}

// defaultE2BDir is test/e2b of the checkout this binary was built into
// (bin/airlock-bench).
func defaultE2BDir() string {
	exe, err := os.Executable()
	if err != nil {
		return filepath.Join("test", "e2b")
	}
	return filepath.Join(filepath.Dir(exe), "..", "test", "e2b")
}

func rootCmd() *cobra.Command {
	var cfg config
	var logLevel string
	var o benchOptions
	stateDir := os.Getenv("AIRLOCK_STATE_DIR")
	if stateDir == "" {
		stateDir = "/var/lib/airlock"
	}
	accel := os.Getenv("AIRLOCK_ACCEL")
	if accel == "" {
		accel = "auto"
	}
	cmd := &cobra.Command{
		Use:           "airlock-bench",
		Short:         "Measure start latency, exec round trip and memory of airlock; print a table",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("%w: --log-level %q", errdefs.ErrInvalid, logLevel)
			}
			cfg.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			var err error
			if cfg.stateDir, err = filepath.Abs(cfg.stateDir); err != nil {
				return err
			}
			if cfg.airlock, err = filepath.Abs(cfg.airlock); err != nil {
				return err
			}
			if _, err := os.Stat(cfg.airlock); err != nil {
				return fmt.Errorf("airlock binary (--airlock): %w", err)
			}
			for _, g := range o.only {
				if !slices.Contains(benchGroups, g) {
					return fmt.Errorf("%w: --only %q: the groups are %s", errdefs.ErrInvalid, g, strings.Join(benchGroups, ", "))
				}
			}
			if o.volMiB > 0 && o.volFiles < 1 {
				return fmt.Errorf("%w: --vol-files %d: at least 1", errdefs.ErrInvalid, o.volFiles)
			}
			return bench(cmd.Context(), cfg, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.airlock, "airlock", defaultAirlock(), "the airlock binary to measure")
	f.StringVar(&cfg.stateDir, "state-dir", stateDir, "airlock state directory, set up (env AIRLOCK_STATE_DIR)")
	f.StringVar(&cfg.accel, "accel", accel, "acceleration: auto, kvm or tcg (env AIRLOCK_ACCEL)")
	f.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	f.IntVar(&o.runs, "runs", 5, "samples for the latency rows")
	f.IntVar(&o.execs, "execs", 100, "samples for the exec round trip")
	f.StringSliceVar(&o.only, "only", nil, "measure only these row groups: "+strings.Join(benchGroups, ", "))
	f.BoolVar(&o.json, "json", false, "print the rows as JSON (name, value, unit, ratio, text, note) instead of the table")
	f.IntVar(&o.codeRuns, "code-runs", 3, "fresh sandboxes per language and runtime in the first code run rows (0 skips those rows)")
	f.IntVar(&o.density, "density", 200, "most idle sandboxes each runtime starts in the density rows (0 skips those rows)")
	f.Int64Var(&o.densityReserveMiB, "density-reserve-mib", 2048, "host memory (MemAvailable, MiB) the density rows stop at")
	f.IntVar(&o.neighbourExecs, "neighbour-execs", 30, "samples for the exec round trip beside a CPU-burning neighbour (0 skips those rows)")
	f.IntVar(&o.apiConcurrent, "api-concurrent", 50, "concurrent creates through the HTTP API (0 skips the API rows)")
	f.IntVar(&o.warmConcurrent, "warm-concurrent", 50, "concurrent creates from a warm pool of that size, in the warm rows (0 skips that row; at most 64)")
	f.IntVar(&o.netMiB, "net-mib", 64, "size of each network throughput transfer (0 skips the network rows)")
	f.IntVar(&o.procExecs, "proc-execs", 2000, "/bin/true runs of the process audit rows' exec loop (0 skips those rows)")
	f.StringSliceVar(&o.procRuntimes, "proc-runtimes", nil, "runtimes of the process audit rows (default: qemu, and gvisor where runsc is installed)")
	f.IntVar(&o.secretsReqs, "secrets-requests", 2000, "requests per protocol and run of the secret interceptor rows, HTTP/1.1 against HTTP/2 (0 skips those rows)")
	f.IntVar(&o.volMiB, "vol-mib", 256, "size of the file the volume rows write and read back (0 skips those rows)")
	f.IntVar(&o.volFiles, "vol-files", 2000, "4 KiB files the volume rows create")
	f.Int64Var(&o.transferMiB, "transfer-mib", 200, "size of the API upload/download")
	f.IntVar(&o.e2bRuns, "e2b-runs", 5, "samples for the E2B SDK rows and their /v1 baseline (0 skips those rows; skipped without node)")
	f.IntVar(&o.simSandboxes, "sim-sandboxes", 1000, "sandboxes of the cluster simulation rows (fake runtime, 10 nodes; 0 skips those rows)")
	f.StringVar(&o.e2bDir, "e2b-dir", defaultE2BDir(), "the folder of bench.mjs and the pinned E2B SDK (npm ci runs there when node_modules lacks it)")
	return cmd
}

// openManager opens the catalog of cfg's state directory. Shims the
// manager starts (resume, fork) run from the airlock binary under test.
func openManager(ctx context.Context, cfg config) (*sandbox.Manager, func(), error) {
	l := statedir.Layout{Root: cfg.stateDir}
	if _, err := os.Stat(l.Catalog()); err != nil {
		return nil, nil, fmt.Errorf("state dir %s is not set up (airlock setup): %w", cfg.stateDir, err)
	}
	st, err := store.Open(ctx, l.Catalog())
	if err != nil {
		return nil, nil, err
	}
	m := &sandbox.Manager{L: l, Store: st, Log: cfg.log, Exe: cfg.airlock,
		// The shims it starts get the flags and the environment knobs of
		// this process (as `airlock` gives its own), and the host cgroup
		// mode `airlock` would take from its environment.
		Shim: shimconf.Options{
			Accel: cfg.accel, LogLevel: "info", HostCgroups: cmp.Or(os.Getenv("AIRLOCK_HOST_CGROUPS"), "auto"),
			DNS: envknob.DNS.Get(), UpstreamCAFile: envknob.UpstreamCAFile.Get(), TestDialMap: envknob.TestDialMap.Get(),
			ProcAudit: envknob.ProcAudit.Get(),
		},
		// The rows the manager runs (pause, resume, fork) are qemu's; the
		// runtime rows create through the CLI with --runtime.
		Runtime: func(context.Context) (string, error) { return "qemu", nil }}
	return m, func() { st.Close() }, nil
}

// newQEMU is the qemu runtime, for the probe that heads the table.
func newQEMU(cfg config, bc statedir.BootConfig) (*qemu.Runtime, error) {
	return qemu.New(qemu.Config{StateDir: cfg.stateDir, Accel: cfg.accel, ProbeKernel: bc.Kernel, ProbeInitrd: bc.Initrd, Logger: cfg.log})
}
