// Command airlock runs untrusted code in microVM sandboxes. One binary: the
// CLI, the per-sandbox shim (hidden `airlock shim`) and, later, the server.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/envknob"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries a process exit code out of a command.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

type globals struct {
	stateDir string
	accel    string
	runtime  string // "qemu", "gvisor" or "auto" (see pickRuntime)
	logLevel string
	log      *slog.Logger
	// diskReserve is --disk-reserve: "" for the default, "0" for none.
	diskReserve string
	// hostCgroups is --host-cgroups: auto, on or off.
	hostCgroups string

	rtOnce   sync.Once
	rtChoice runtimeChoice

	// host and apiKey come from AIRLOCK_HOST and AIRLOCK_API_KEY; with host
	// set, the sandbox commands go through that API server (see remote).
	host   string
	apiKey string

	// env, if set, replaces the process environment for secret values
	// (tests).
	env map[string]string
	// startShim, if set, is the manager's StartShim: tests set it to run
	// the shims of local commands in-process on the fake runtime. Nothing
	// sets it outside tests, and never from the environment.
	startShim func(shimconf.Doc, io.WriteCloser, *os.File) error
}

func defaultStateDir() string {
	if d := os.Getenv("AIRLOCK_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/airlock"
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "airlock")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "airlock")
}

func main() {
	g := &globals{host: os.Getenv("AIRLOCK_HOST"), apiKey: os.Getenv("AIRLOCK_API_KEY")}
	root := rootCmd(g)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		os.Exit(report(os.Stderr, err))
	}
}

// report prints a command's error on w and returns the exit code for it.
func report(w io.Writer, err error) int {
	if ee, ok := errors.AsType[*exitError](err); ok {
		if ee.msg != "" {
			fmt.Fprintln(w, "airlock:", ee.msg)
		}
		return ee.code
	}
	fmt.Fprintln(w, "airlock:", apiMsg(err))
	return 1
}

const rootLong = `Run untrusted code in microVM sandboxes.

The sandbox commands (run, create, exec, shell, cp, ls, inspect, rm, pause,
resume, touch, snapshot, fork, events, code, contexts) go through the HTTP
API: with AIRLOCK_HOST (e.g. http://127.0.0.1:7070) and AIRLOCK_API_KEY set,
of that airlock server (` + "`airlock serve`" + `); otherwise of an API server on
the local state directory (--state-dir) that airlock runs in its own process.
Flags, output and exit codes are the same either way. The other commands
(serve, keys, image, setup, doctor, logs, mcp) always use the local state
directory.

Environment:
  AIRLOCK_HOST       API server for the sandbox commands (default: in-process)
  AIRLOCK_API_KEY    API key for AIRLOCK_HOST (see ` + "`airlock keys create`" + `)
  AIRLOCK_STATE_DIR  default for --state-dir
  AIRLOCK_ACCEL      default for --accel
  AIRLOCK_HOST_CGROUPS  default for --host-cgroups
  AIRLOCK_DISK_RESERVE  default for --disk-reserve`

// rootCmd builds the command tree over g.
func rootCmd(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "airlock",
		Short:         "Run untrusted code in microVM sandboxes",
		Long:          rootLong,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return g.setup()
		},
	}
	accel := os.Getenv("AIRLOCK_ACCEL")
	if accel == "" {
		accel = "auto"
	}
	root.PersistentFlags().StringVar(&g.stateDir, "state-dir", defaultStateDir(), "state directory (env AIRLOCK_STATE_DIR)")
	root.PersistentFlags().StringVar(&g.accel, "accel", accel, "acceleration: auto (KVM if a probe guest boots, else TCG), kvm or tcg (env AIRLOCK_ACCEL)")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&g.diskReserve, "disk-reserve", os.Getenv("AIRLOCK_DISK_RESERVE"), "free space kept on the state dir's filesystem: creates, forks, pauses and snapshots that could use it are refused (e.g. 4G; 0: none; default: 5%, at least 2 GiB) (env AIRLOCK_DISK_RESERVE)")
	hostCg := cmp.Or(os.Getenv("AIRLOCK_HOST_CGROUPS"), "auto")
	root.PersistentFlags().StringVar(&g.hostCgroups, "host-cgroups", hostCg, "put each sandbox's VMM or sentry and its shim in a host cgroup with memory and pids limits from its size: auto (when the host's cgroups are writable), on (refuse to start without), off (env AIRLOCK_HOST_CGROUPS)")
	// auto: a microVM where KVM runs one, else gVisor, which does what
	// a microVM does here (pause, snapshots, forks, moves) and starts in
	// a fraction of a TCG guest's time.
	rtName := cmp.Or(os.Getenv("AIRLOCK_RUNTIME"), "auto")
	root.PersistentFlags().StringVar(&g.runtime, "runtime", rtName, "sandbox runtime for new sandboxes: auto (qemu with KVM, else gvisor when runsc works, else qemu on TCG; 'airlock doctor' says which), qemu (microVMs) or gvisor (runsc, no KVM needed) (env AIRLOCK_RUNTIME)")

	root.AddCommand(
		runCmd(g), createCmd(g), execCmd(g), attachCmd(g), psCmd(g), shellCmd(g), cpCmd(g), lsCmd(g), inspectCmd(g), logsCmd(g), rmCmd(g),
		pauseCmd(g), resumeCmd(g), touchCmd(g), snapshotCmd(g), forkCmd(g), volumeCmd(g), templateCmd(g), networkCmd(g), secretCmd(g),
		imageCmd(g), setupCmd(g), doctorCmd(g), shimCmd(g), holderCmd(g), serveCmd(g), nodeCmd(g), keysCmd(g), eventsCmd(g),
		mcpCmd(g), codeCmd(g), contextsCmd(g), browserCmd(g), versionCmd(),
	)
	addExamples(root)
	return root
}

// setup checks the global flags and makes the logger; serve calls it
// again once its config file has set some of them.
func (g *globals) setup() error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level %q", errdefs.ErrInvalid, g.logLevel)
	}
	g.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	if abs, err := filepath.Abs(g.stateDir); err == nil {
		g.stateDir = abs
	}
	switch g.accel {
	case "auto", "kvm", "tcg":
	default:
		return fmt.Errorf("%w: --accel must be auto, kvm or tcg", errdefs.ErrInvalid)
	}
	switch g.runtime {
	case "qemu", "gvisor", "auto":
	default:
		return fmt.Errorf("%w: --runtime must be qemu, gvisor or auto", errdefs.ErrInvalid)
	}
	switch g.hostCgroups {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("%w: --host-cgroups must be auto, on or off", errdefs.ErrInvalid)
	}
	return nil
}

// manager opens the catalog for one command.
func (g *globals) manager(ctx context.Context) (*sandbox.Manager, func(), error) {
	if err := os.MkdirAll(g.stateDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("state dir: %w", err)
	}
	l := statedir.Layout{Root: g.stateDir}
	st, err := store.Open(ctx, l.Catalog())
	if err != nil {
		return nil, nil, err
	}
	reserve, err := parseReserve(g.diskReserve)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	// What every shim this process starts gets in its configuration
	// document: the flags, and the environment knobs read here (the shim
	// reads no environment knob itself).
	shimOpts := shimconf.Options{
		Accel: g.accel, LogLevel: "info", HostCgroups: g.hostCgroups,
		DNS: envknob.DNS.Get(), UpstreamCAFile: envknob.UpstreamCAFile.Get(), TestDialMap: envknob.TestDialMap.Get(),
		ProcAudit: envknob.ProcAudit.Get(),
	}
	m := &sandbox.Manager{L: l, Store: st, Log: g.log, Shim: shimOpts, DiskReserve: reserve, StartShim: g.startShim,
		Runtime: func(ctx context.Context) (string, error) {
			c := g.pickRuntime(ctx)
			return c.name, c.err
		},
		RuntimeWhy: func(ctx context.Context) string { return g.pickRuntime(ctx).why }}
	return m, func() { st.Close() }, nil
}

// withManager adapts a command body that needs the sandbox manager.
func (g *globals) withManager(run func(cmd *cobra.Command, m *sandbox.Manager, args []string) error) func(*cobra.Command, []string) error {
	return withOpen(g.manager, run)
}

// withOpen adapts a command body that needs what open makes for the one
// command (the manager, an API client), released when the body returns.
func withOpen[T any](open func(context.Context) (T, func(), error), run func(*cobra.Command, T, []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		v, done, err := open(cmd.Context())
		if err != nil {
			return err
		}
		defer done()
		return run(cmd, v, args)
	}
}

// parseReserve reads --disk-reserve: "" is 0 (the manager's default), "0"
// is -1 (no reserve), a size is its bytes.
func parseReserve(s string) (int64, error) {
	switch s {
	case "":
		return 0, nil
	case "0":
		return -1, nil
	}
	mib, err := parseMiB(s)
	if err != nil {
		return 0, fmt.Errorf("--disk-reserve: %w", err)
	}
	return int64(mib) << 20, nil
}
