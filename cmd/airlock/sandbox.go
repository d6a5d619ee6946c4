package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// parseMiB parses sizes like 512M, 2G, 2GiB, 1024 (MiB).
func parseMiB(s string) (int, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := 1
	switch {
	case strings.HasSuffix(t, "T"):
		mult, t = 1<<20, strings.TrimSuffix(t, "T")
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<10, strings.TrimSuffix(t, "G")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	}
	n, err := strconv.Atoi(t)
	if err != nil || n <= 0 || n > (1<<30)/mult {
		return 0, fmt.Errorf("%w: size %q (use e.g. 512M or 2G)", errdefs.ErrInvalid, s)
	}
	return n * mult, nil
}

// parseDuration accepts Go durations (5s, 15m) or plain seconds.
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%w: duration %q (use e.g. 5s or 15m)", errdefs.ErrInvalid, s)
	}
	return d, nil
}

type createFlags struct {
	image, memory, disk, timeout string
	idlePause                    string
	fromSnapshot                 string
	cpus                         int
	meta                         []string
	net                          netFlags
	// volumes (-v NAME:/path[:ro|rw]) and mounts (--mount HOST:GUEST[:ro|rw]).
	volumes, mounts []string
}

func (f *createFlags) register(cmd *cobra.Command, lifetimeName string) {
	cmd.Flags().StringVar(&f.image, "image", "base", "image or template to start from (see 'airlock image ls', 'airlock template ls')")
	cmd.Flags().IntVar(&f.cpus, "cpus", 1, "virtual CPUs")
	cmd.Flags().StringVar(&f.memory, "memory", "512M", "guest memory")
	cmd.Flags().StringVar(&f.disk, "disk", "", "root disk size (default: image size + 512M, at least 2G)")
	cmd.Flags().StringVar(&f.timeout, lifetimeName, "15m", "lifetime (running time; time paused does not count): the sandbox is stopped and removed after this")
	cmd.Flags().StringArrayVar(&f.meta, "meta", nil, "metadata KEY=VALUE (repeatable)")
	cmd.Flags().StringVar(&f.idlePause, "idle-pause", "0", "pause the sandbox after this long idle (no exec or code running, no call, no inbound connection); the next call resumes it. 0: never")
	cmd.Flags().StringArrayVarP(&f.volumes, "volume", "v", nil, "mount volume `NAME:/path[:ro|rw]` (repeatable; read-write by default; see 'airlock volume'); one sandbox may write a volume, or any number read it")
	cmd.Flags().StringArrayVar(&f.mounts, "mount", nil, "mount host directory `HOST:GUEST[:ro|rw]` (repeatable; read-only unless :rw; a relative HOST is from the current directory, locally only; gvisor runtime)")
	f.net.register(cmd)
	cmd.Flags().StringVar(&f.fromSnapshot, "from-snapshot", "", "start from this snapshot (see 'airlock snapshot ls'): processes, memory and disk as saved; its image, size, env and network are the snapshot's")
}

// serverSized leaves the CPUs and memory not given on the command line to
// the server (its defaults are the flags'), so that a template, whose
// sandboxes have its size, needs no size flags.
func (f *createFlags) serverSized(cmd *cobra.Command, o *sandbox.CreateOptions) {
	if !cmd.Flags().Changed("cpus") {
		o.CPUs = 0
	}
	if !cmd.Flags().Changed("memory") {
		o.MemoryMiB = 0
	}
}

// snapshotOptions fits o to --from-snapshot: the image and size are the
// snapshot's unless given (then they must match), and network flags are
// refused (the network is the snapshot's).
func (f *createFlags) snapshotOptions(cmd *cobra.Command, o sandbox.CreateOptions) (sandbox.CreateOptions, error) {
	fl := cmd.Flags()
	for _, name := range []string{"net", "allow", "secret", "publish", "net-rate", "max-conns"} {
		if fl.Lookup(name) != nil && fl.Changed(name) {
			return o, fmt.Errorf("%w: --%s: a sandbox from a snapshot has the snapshot's network", errdefs.ErrInvalid, name)
		}
	}
	if !fl.Changed("image") {
		o.Image = ""
	}
	if !fl.Changed("cpus") {
		o.CPUs = 0
	}
	if !fl.Changed("memory") {
		o.MemoryMiB = 0
	}
	return o, nil
}

// options parses the flags; secret values are read with lookupEnv.
func (f *createFlags) options(lifetimeFlag string, lookupEnv func(string) (string, bool)) (sandbox.CreateOptions, error) {
	o := sandbox.CreateOptions{Image: f.image, CPUs: f.cpus}
	if f.cpus < 1 {
		return o, fmt.Errorf("%w: --cpus must be at least 1", errdefs.ErrInvalid)
	}
	var err error
	if o.MemoryMiB, err = parseMiB(f.memory); err != nil {
		return o, fmt.Errorf("--memory: %w", err)
	}
	if f.disk != "" {
		if o.DiskMiB, err = parseMiB(f.disk); err != nil {
			return o, fmt.Errorf("--disk: %w", err)
		}
	}
	if o.Timeout, err = parseDuration(f.timeout); err != nil {
		return o, fmt.Errorf("--%s: %w", lifetimeFlag, err)
	}
	if f.idlePause != "" && f.idlePause != "0" {
		if o.IdlePause, err = parseDuration(f.idlePause); err != nil {
			return o, fmt.Errorf("--idle-pause: %w (0: never)", err)
		}
	}
	for _, kv := range f.meta {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return o, fmt.Errorf("%w: --meta %q is not KEY=VALUE", errdefs.ErrInvalid, kv)
		}
		if o.Metadata == nil {
			o.Metadata = map[string]string{}
		}
		o.Metadata[k] = v
	}
	if o.Network, o.Secrets, err = f.net.spec(lookupEnv); err != nil {
		return o, err
	}
	for _, v := range f.volumes {
		vm, err := parseVolumeFlag(v)
		if err != nil {
			return o, err
		}
		o.Volumes = append(o.Volumes, vm)
	}
	for _, m := range f.mounts {
		hm, err := parseMountFlag(m)
		if err != nil {
			return o, err
		}
		o.HostMounts = append(o.HostMounts, hm)
	}
	return o, nil
}

// mountMode splits a trailing ":ro" or ":rw" off s.
func mountMode(s string) (rest string, readOnly, given bool) {
	if r, ok := strings.CutSuffix(s, ":ro"); ok {
		return r, true, true
	}
	if r, ok := strings.CutSuffix(s, ":rw"); ok {
		return r, false, true
	}
	return s, false, false
}

// parseVolumeFlag reads -v NAME:/path[:ro|rw] (read-write by default).
func parseVolumeFlag(s string) (sandbox.VolumeMount, error) {
	rest, ro, _ := mountMode(s)
	name, p, ok := strings.Cut(rest, ":")
	if !ok || name == "" || p == "" || strings.Contains(p, ":") {
		return sandbox.VolumeMount{}, fmt.Errorf("%w: --volume %q: want NAME:/path, NAME:/path:ro or NAME:/path:rw", errdefs.ErrInvalid, s)
	}
	if err := sandbox.ValidateVolumeName(name); err != nil {
		return sandbox.VolumeMount{}, fmt.Errorf("--volume %q: %w", s, err)
	}
	if err := sandbox.ValidateGuestPath(p); err != nil {
		return sandbox.VolumeMount{}, fmt.Errorf("--volume %q: %w", s, err)
	}
	return sandbox.VolumeMount{Name: name, Path: p, ReadOnly: ro}, nil
}

// parseMountFlag reads --mount HOST:GUEST[:ro|rw] (read-only by default).
// The guest path has no ':', so HOST is everything before the last one.
// A relative HOST is left relative: hostMountPaths resolves it.
func parseMountFlag(s string) (sandbox.HostMount, error) {
	rest, ro, given := mountMode(s)
	i := strings.LastIndex(rest, ":")
	if i <= 0 || i == len(rest)-1 {
		return sandbox.HostMount{}, fmt.Errorf("%w: --mount %q: want HOST:GUEST, HOST:GUEST:ro or HOST:GUEST:rw (a host directory and an absolute guest path)", errdefs.ErrInvalid, s)
	}
	host, p := rest[:i], rest[i+1:]
	if err := sandbox.ValidateGuestPath(p); err != nil {
		return sandbox.HostMount{}, fmt.Errorf("--mount %q: %w", s, err)
	}
	return sandbox.HostMount{HostPath: host, Path: p, ReadWrite: given && !ro}, nil
}

// hostMountPaths makes o's relative host mount paths absolute against cwd
// for the local CLI; through an API server (remote) a relative path is
// refused: it would name a directory on the server's host, not here.
func hostMountPaths(o *sandbox.CreateOptions, remote bool, cwd func() (string, error)) error {
	for i, hm := range o.HostMounts {
		if filepath.IsAbs(hm.HostPath) {
			o.HostMounts[i].HostPath = filepath.Clean(hm.HostPath)
			continue
		}
		if remote {
			return fmt.Errorf("%w: --mount %s:%s: the host path must be absolute with AIRLOCK_HOST set (it names a directory on the server's host)", errdefs.ErrInvalid, hm.HostPath, hm.Path)
		}
		dir, err := cwd()
		if err != nil {
			return fmt.Errorf("--mount %s: %w", hm.HostPath, err)
		}
		o.HostMounts[i].HostPath = filepath.Join(dir, hm.HostPath)
	}
	return nil
}

type execFlags struct {
	interactive bool
	tty         bool
	env         []string
	workdir     string
	user        string
	timeout     string
	pids        uint32
}

func (f *execFlags) register(cmd *cobra.Command, timeoutName string) {
	cmd.Flags().BoolVarP(&f.interactive, "interactive", "i", false, "pass stdin to the command")
	cmd.Flags().BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal in the guest (of this terminal's size, following its resizes; with -i this terminal is raw and typed keys reach it: Ctrl-C interrupts the command, not airlock)")
	cmd.Flags().StringArrayVarP(&f.env, "env", "e", nil, "environment KEY=VALUE (repeatable)")
	cmd.Flags().StringVarP(&f.workdir, "workdir", "w", "", "working directory in the guest")
	cmd.Flags().StringVarP(&f.user, "user", "u", "", "user (name, uid, name:group) in the guest; default root")
	cmd.Flags().StringVar(&f.timeout, timeoutName, "", "kill the command after this long (e.g. 5s)")
	cmd.Flags().Uint32Var(&f.pids, "pids-limit", 0, "max processes for the command (default 1024)")
}

func (f *execFlags) start(argv []string) (guest.ExecSpec, error) {
	s := guest.ExecSpec{Argv: argv, Cwd: f.workdir, User: f.user, PidsLimit: f.pids, Stdin: f.interactive}
	if f.tty {
		s.TTY = &guest.TermSize{Rows: 24, Cols: 80} // the local terminal's size, if any, when it starts
	}
	for _, kv := range f.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return s, fmt.Errorf("%w: --env %q is not KEY=VALUE", errdefs.ErrInvalid, kv)
		}
		if s.Env == nil {
			s.Env = map[string]string{}
		}
		s.Env[k] = v
	}
	if f.timeout != "" {
		d, err := parseDuration(f.timeout)
		if err != nil {
			return s, err
		}
		if d > 24*time.Hour {
			return s, fmt.Errorf("%w: exec timeout above 24h", errdefs.ErrInvalid)
		}
		s.Timeout = d
	}
	return s, nil
}

// exitFor turns an exec's end into airlock's exit: the command's own code,
// 124 for a timeout, 128+N for signal N; the truncation marker goes to stderr.
func exitFor(stderr io.Writer, ex *guest.ExitStatus, spec guest.ExecSpec) error {
	if ex.Truncated {
		fmt.Fprintf(stderr, "\n[airlock: output truncated: more than the output limit was produced]\n")
	}
	switch {
	case ex.OOMKilled && (ex.Signal > 0 || ex.Code != 0):
		return &exitError{code: 137, msg: "out of memory (the guest's OOM killer killed a process of the command; see the sandbox's --memory)"}
	case ex.TimedOut:
		return &exitError{code: 124, msg: fmt.Sprintf("command timed out after %s and was killed", spec.Timeout)}
	case ex.Signal > 0:
		return &exitError{code: 128 + ex.Signal, msg: fmt.Sprintf("command killed by signal %d", ex.Signal)}
	case ex.Code != 0:
		return &exitError{code: ex.Code}
	}
	return nil
}

func runCmd(g *globals) *cobra.Command {
	var cf createFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARG...]",
		Short: "Create a sandbox, run one command in it, remove it",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := cf.options("lifetime", g.lookupEnv)
			if err != nil {
				return err
			}
			cf.serverSized(cmd, &o)
			if cf.fromSnapshot != "" {
				if o, err = cf.snapshotOptions(cmd, o); err != nil {
					return err
				}
			}
			if err := hostMountPaths(&o, g.host != "", os.Getwd); err != nil {
				return err
			}
			start, err := ef.start(args)
			if err != nil {
				return err
			}
			c, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			return runSandbox(cmd, c, o, cf.fromSnapshot, start, ef.interactive)
		},
	}
	cf.register(cmd, "lifetime")
	ef.register(cmd, "timeout")
	return cmd
}

func createCmd(g *globals) *cobra.Command {
	var cf createFlags
	cmd := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := cf.options("lifetime", g.lookupEnv)
			if err != nil {
				return err
			}
			cf.serverSized(cmd, &o)
			if cf.fromSnapshot != "" {
				if o, err = cf.snapshotOptions(cmd, o); err != nil {
					return err
				}
			}
			if err := hostMountPaths(&o, g.host != "", os.Getwd); err != nil {
				return err
			}
			c, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			return createSandbox(cmd, c, o, cf.fromSnapshot)
		},
	}
	cf.register(cmd, "lifetime")
	// --timeout was create's name for the lifetime; on run and exec it is
	// a command's timeout. Still accepted, with a warning.
	cmd.Flags().StringVar(&cf.timeout, "timeout", "15m", "the sandbox's lifetime (old name of --lifetime)")
	_ = cmd.Flags().MarkDeprecated("timeout", "use --lifetime (the sandbox's lifetime; --timeout is a command's timeout on run and exec)")
	return cmd
}

func execCmd(g *globals) *cobra.Command {
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox; its exit code becomes airlock's",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv := args[1:]
			if len(argv) > 0 && argv[0] == "--" {
				argv = argv[1:] // flags stop at the id; a "--" after it is only a separator
			}
			if len(argv) == 0 {
				return fmt.Errorf("%w: no command given after the sandbox id", errdefs.ErrInvalid)
			}
			start, err := ef.start(argv)
			if err != nil {
				return err
			}
			c, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if start.TTY != nil {
				return runTerminal(args[0], start, ef.interactive, openTerminal(cmd.Context(), c, args[0]))
			}
			return runExec(cmd, c, args[0], start, "")
		},
	}
	cmd.Flags().SetInterspersed(false)
	ef.register(cmd, "timeout")
	return cmd
}

func attachCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "attach ID EXEC_ID",
		Short: "Follow a command running in a sandbox (its retained output first); its exit code becomes airlock's",
		Long: `Follow a command running in a sandbox: its retained output (the last 4 MiB) first, then
its live output until it exits; airlock exits as ` + "`exec`" + ` would. A paused sandbox is resumed
(a command that ran when the sandbox was paused goes on under the same id). Ctrl-C is
forwarded to the command, as with exec. ` + "`airlock ps ID`" + ` lists the ids.`,
		Example: `  airlock ps $id
  airlock attach $id 3kq7v2mwx4hz5ab6cdef`,
		Args: cobra.ExactArgs(2),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			if !guest.ValidExecID(args[1]) {
				return fmt.Errorf("%w: %q is not an exec id (see airlock ps %s)", errdefs.ErrInvalid, args[1], args[0])
			}
			return runExec(cmd, c, args[0], guest.ExecSpec{}, args[1])
		}),
	}
	return cmd
}

func psCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ps ID",
		Short:   "List a sandbox's commands: running ones and the most recent finished ones",
		Example: "  airlock ps $id\n  airlock ps --json $id",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			execs, err := c.ListExecs(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), execs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EXEC ID\tPID\tSTATE\tSTARTED\tCOMMAND")
			for _, e := range execs {
				state := e.State
				if e.Exit != nil {
					state = fmt.Sprintf("exited (%d)", e.Exit.Code)
					if e.Exit.Signal > 0 {
						state = fmt.Sprintf("killed (signal %d)", e.Exit.Signal)
					}
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", e.ID, e.PID, state, e.StartedAt.Local().Format(time.DateTime), guest.Text(strings.Join(e.Cmd, " "), 80))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func lsCmd(g *globals) *cobra.Command {
	var asJSON, size bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			return listSandboxes(cmd, c, asJSON, size)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&size, "size", false, "add a DISK USED column: what each sandbox's files take on the host (disk overlay, paused state, logs)")
	return cmd
}

// printSandboxes writes sbs as a table or, with asJSON, as a JSON array;
// with size the table has a DISK USED column.
func printSandboxes(w io.Writer, sbs []sandboxView, asJSON, size bool) error {
	if asJSON {
		return writeJSON(w, sbs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "ID\tSTATE\tIMAGE\tCPUS\tMEMORY\tDISK\tAGE\tEXPIRES IN"
	if size {
		head += "\tDISK USED"
	}
	fmt.Fprintln(tw, head)
	for _, sb := range sbs {
		expires := time.Until(sb.ExpiresAt).Round(time.Second).String()
		if sb.LifetimeLeftS != nil {
			// The lifetime counts running time only: it stands still while paused.
			expires = (time.Duration(*sb.LifetimeLeftS) * time.Second).String() + " of running time"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dM\t%dM\t%s\t%s", sb.ID, sb.State, sb.Image, sb.CPUs, sb.MemoryMiB, sb.DiskMiB,
			time.Since(sb.CreatedAt).Round(time.Second), expires)
		if size {
			var used int64
			if sb.DiskUsageBytes != nil {
				used = *sb.DiskUsageBytes
			}
			fmt.Fprintf(tw, "\t%s", humanBytes(used))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

type sandboxView struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	Image     string            `json:"image"`
	Digest    string            `json:"image_digest"`
	CPUs      int               `json:"cpus"`
	MemoryMiB int               `json:"memory_mb"`
	DiskMiB   int               `json:"disk_mb"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Accel     string            `json:"accel,omitempty"`
	Kernel    string            `json:"guest_kernel,omitempty"`
	StartMode string            `json:"start_mode,omitempty"`
	Runtime   string            `json:"runtime"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Tenant    string            `json:"tenant,omitempty"`
	Network   *networkView      `json:"network,omitempty"`
	// IdlePauseS: idle seconds before the sandbox pauses itself (0: never).
	IdlePauseS int64 `json:"idle_pause_s"`
	// PausedAt: when it was last paused (absent if never).
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// LifetimeLeftS: only while paused, the running time it has left.
	LifetimeLeftS *int64 `json:"lifetime_left_s,omitempty"`
	// Source: "snapshot:<name>" or "fork:<id>" ("" for an image).
	Source string `json:"source"`
	// DiskUsageBytes: what its files take on the host; set by inspect and
	// ls --size only.
	DiskUsageBytes *int64 `json:"disk_usage_bytes,omitempty"`
	// Mounts: its volumes and host directories.
	Mounts []airlock.Mount `json:"mounts,omitempty"`
}

// setPause fills the pause fields: pausedAt if not zero, the lifetime left
// only while paused.
func (v *sandboxView) setPause(pausedAt time.Time, paused bool, leftS int64) {
	if !pausedAt.IsZero() {
		t := pausedAt.UTC()
		v.PausedAt = &t
	}
	if paused {
		v.LifetimeLeftS = &leftS
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func inspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect ID",
		Short: "Show a sandbox as JSON",
		Args:  cobra.ExactArgs(1),
		RunE:  g.withClient(inspectSandbox),
	}
}

func logsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "logs ID",
		Short: "Print a sandbox's supervisor log and guest console",
		Args:  cobra.ExactArgs(1),
		RunE: g.withManager(func(cmd *cobra.Command, m *sandbox.Manager, args []string) error {
			if _, err := m.Get(cmd.Context(), sandbox.Local(), args[0]); err != nil {
				return err
			}
			for _, f := range []struct{ title, path string }{{"supervisor", m.L.ShimLog(args[0])}, {"guest console", m.L.Console(args[0])}} {
				fmt.Printf("==> %s <==\n", f.title)
				b, err := os.ReadFile(f.path)
				if err != nil {
					fmt.Printf("(none: %v)\n", err)
					continue
				}
				os.Stdout.Write(b)
			}
			return nil
		}),
	}
}

func rmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID [ID...]",
		Short: "Stop and remove sandboxes",
		Args:  cobra.MinimumNArgs(1),
		RunE:  g.withClient(removeSandboxes),
	}
}

// warnTCG says, in one line on stderr, that a sandbox runs under software
// emulation.
func warnTCG(accel string) {
	if accel == "tcg" {
		fmt.Fprintln(os.Stderr, "airlock: warning: no usable KVM; this sandbox runs under TCG software emulation (slow). See `airlock doctor`.")
	}
}

// humanBytes writes n in binary units: 512B, 1.5K, 20.0M, 3.2G.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%c", float64(n)/float64(div), "KMGTP"[exp])
}
