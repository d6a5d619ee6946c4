package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bootfiles"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/hostcg"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// agentPath finds the guest agent binary: --agent, else next to airlock
// (bin/ of a build tree), else in ../lib/airlock beside it (`make install`
// and the `make dist` tarball).
func agentPath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return findAgent(filepath.Dir(exe))
}

// findAgent looks for airlock-agent in the places agentPath names, with
// binDir the directory of the airlock executable.
func findAgent(binDir string) (string, error) {
	places := []string{
		filepath.Join(binDir, "airlock-agent"),
		filepath.Join(binDir, "..", "lib", "airlock", "airlock-agent"),
	}
	for _, p := range places {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return filepath.Clean(p), nil
		}
	}
	return "", fmt.Errorf("%w: guest agent not found at %s (run `make build` or `make install`, or pass --agent)",
		errdefs.ErrFailedPrecondition, strings.Join(places, " or "))
}

// newRuntime builds the qemu runtime for this state dir.
func newRuntime(g *globals, bc statedir.BootConfig) (*qemu.Runtime, error) {
	return qemu.New(qemu.Config{
		StateDir:    g.stateDir,
		Accel:       g.accel,
		ProbeKernel: bc.Kernel,
		ProbeInitrd: bc.Initrd,
		Logger:      g.log,
	})
}

// sandboxRuntime is the runtime a shim runs its sandbox with (--runtime),
// and for gvisor the function giving the sandbox's read-only root
// directory (the image extracted once per digest).
func sandboxRuntime(g *globals, bc statedir.BootConfig) (runtime.Runtime, func(context.Context, store.Sandbox) (string, error), error) {
	switch g.runtime {
	case "qemu":
		rt, err := newRuntime(g, bc)
		return rt, nil, err
	case "gvisor":
	default:
		return nil, nil, fmt.Errorf("%w: a sandbox's runtime is qemu or gvisor, not %q", errdefs.ErrInvalid, g.runtime)
	}
	agent, err := agentPath("")
	if err != nil {
		return nil, nil, err
	}
	// AIRLOCK_RUNSC_DEBUG=1 keeps runsc's debug logs in the sandbox's
	// run/runsc-logs/ (large: for diagnosing gVisor itself).
	// Sandboxes bind a copy of the agent kept by its digest, so one saved
	// now restores with the same binary after airlock changes.
	l := statedir.Layout{Root: g.stateDir}
	rt, err := gvisor.New(gvisor.Config{AgentPath: agent, AgentDir: l.Agents(), VersionCache: l.RunscVersion(), Logger: g.log, Debug: os.Getenv("AIRLOCK_RUNSC_DEBUG") == "1"})
	if err != nil {
		return nil, nil, err
	}
	images := image.NewStore(g.stateDir, nil, g.log)
	return rt, func(ctx context.Context, sb store.Sandbox) (string, error) {
		return images.Dir(ctx, image.Image{Name: sb.Image, Digest: sb.ImageDigest}, gvisor.PrepareRoot)
	}, nil
}

func setupCmd(g *globals) *cobra.Command {
	var agent string
	var noImage, withBrowser bool
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Prepare this host: guest kernel, initramfs with the agent, default image",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			start := time.Now()
			l := statedir.Layout{Root: g.stateDir}
			if err := os.MkdirAll(g.stateDir, 0o755); err != nil {
				return err
			}
			_ = os.Chmod(g.stateDir, 0o755) // the unprivileged VMM reads kernel and images below it
			k, err := bootfiles.EnsureKernel(ctx, g.stateDir, "cloud", os.Stderr)
			if err != nil {
				return fmt.Errorf("guest kernel: %w", err)
			}
			ap, err := agentPath(agent)
			if err != nil {
				return err
			}
			initrd, err := bootfiles.BuildInitramfs(ctx, g.stateDir, k, ap)
			if err != nil {
				return fmt.Errorf("initramfs: %w", err)
			}
			bc := statedir.BootConfig{Kernel: k.Vmlinux, KernelRelease: k.Release, Initrd: initrd}
			if err := l.SaveBootConfig(bc); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "setup: guest kernel %s, initramfs %s\n", k.Release, filepath.Base(initrd))
			if n, err := pruneTemplates(ctx, g); err != nil {
				fmt.Fprintln(os.Stderr, "setup: prune templates:", err)
			} else if n > 0 {
				fmt.Fprintf(os.Stderr, "setup: removed %d template(s) of an older kernel or agent\n", n)
			}
			if !noImage {
				images, done, err := g.images(ctx)
				if err != nil {
					return err
				}
				defer done()
				if err := ensureImage(ctx, images, image.BaseRecipe, "Debian bookworm + python3 + pip + nodejs"); err != nil {
					return err
				}
				if withBrowser {
					if err := ensureImage(ctx, images, image.BrowserRecipe, "Debian's Chromium, Xvfb, noVNC, fonts; 1.4 GiB"); err != nil {
						return err
					}
				}
			}
			rt, err := newRuntime(g, bc)
			if err != nil {
				return err
			}
			caps, err := rt.Probe(ctx)
			if err != nil {
				return err
			}
			if caps.Accel != "kvm" {
				// Without KVM, auto gives new sandboxes gVisor: say which
				// runtime they get rather than warn of TCG for nothing.
				if c := g.pickRuntime(ctx); c.name == "gvisor" {
					fmt.Fprintf(os.Stderr, "setup: new sandboxes run on gVisor (%s)\n", c.why)
				} else {
					warnAccel(caps)
				}
			}
			fmt.Fprintf(os.Stderr, "setup: ready in %s (state dir %s)\n", time.Since(start).Round(100*time.Millisecond), g.stateDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&agent, "agent", "", "guest agent binary (default: airlock-agent next to airlock)")
	cmd.Flags().BoolVar(&noImage, "no-image", false, "do not build the default image")
	cmd.Flags().BoolVar(&withBrowser, "browser", false, "also build the browser image (for 'airlock browser'; about 2 minutes)")
	return cmd
}

// ensureImage builds r's image (named after it) if it is missing, or
// rebuilds it if an older revision of the recipe built it; an image of
// that name from elsewhere (imported or pulled) is the user's and is kept.
func ensureImage(ctx context.Context, images *image.Store, r image.Recipe, what string) error {
	name := r.Name
	switch im, err := images.Get(ctx, name); {
	case err == nil && im.Source == r.Source:
		return nil
	case err == nil && strings.HasPrefix(im.Source, "mmdebstrap:"):
		fmt.Fprintf(os.Stderr, "setup: rebuilding the image %q: its recipe changed (%s -> %s; about 2 minutes; sandboxes on the old one keep it)\n", name, im.Source, r.Source)
	case err == nil:
		return nil // the user's own image (imported or pulled)
	default:
		fmt.Fprintf(os.Stderr, "setup: building the image %q (%s; about 2 minutes)\n", name, what)
	}
	if _, err := images.Build(ctx, name, r, os.Stderr); err != nil {
		return fmt.Errorf("build image %s: %w", name, err)
	}
	return nil
}

func warnAccel(c runtime.Capabilities) {
	if c.Accel != "kvm" {
		fmt.Fprintf(os.Stderr, "airlock: warning: no usable KVM, guests run under TCG software emulation (slow): %s\n", c.AccelReason)
	}
}

func doctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Say what this host can do: KVM or TCG, QEMU, guest kernel, images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			defer tw.Flush()
			problems := 0
			row := func(ok bool, what, detail string) {
				mark := "ok"
				if !ok {
					mark = "MISSING"
					problems++
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", what, mark, detail)
			}
			row(true, "state dir", g.stateDir)
			if m, done, err := g.manager(ctx); err == nil {
				if d, err := m.Disk(); err == nil {
					var provisioned int64
					if sbs, err := m.Store.ListSandboxes(ctx); err == nil {
						for _, sb := range sbs {
							provisioned += int64(sb.DiskMiB) << 20
						}
					}
					ok := d.Free >= d.Reserve
					detail := fmt.Sprintf("%s free of %s, %s kept in reserve (--disk-reserve); sandboxes' disks can grow to %s",
						humanBytes(d.Free), humanBytes(d.Total), humanBytes(d.Reserve), humanBytes(provisioned))
					if !ok {
						detail += ": below the reserve, creates, forks, pauses and snapshots are refused"
					}
					row(ok, "disk", detail)
				}
				done()
			}
			switch err := hostcg.Check(); {
			case g.hostCgroups == "off":
				row(true, "host cgroups", "off (--host-cgroups off): sandboxes' VMMs and shims run without host memory and pids limits")
			case err != nil && g.hostCgroups == "on":
				row(false, "host cgroups", fmt.Sprintf("--host-cgroups on, but: %v", err))
			case err != nil:
				row(true, "host cgroups", fmt.Sprintf("NOT enforced (%v): sandboxes' VMMs and shims run without host memory and pids limits", err))
			default:
				l := hostcg.For(512)
				row(true, "host cgroups", fmt.Sprintf("cgroup %s: each sandbox in %s/<id> with memory and pids limits (a 512 MiB sandbox: %d MiB, %d tasks)",
					hostcg.Version(), hostcg.DefaultParent, l.MemoryBytes>>20, l.Pids))
			}
			if p, err := exec.LookPath("qemu-system-x86_64"); err != nil {
				row(false, "qemu", "qemu-system-x86_64 not found: run `make deps` (apt-get install qemu-system-x86 qemu-utils)")
			} else {
				out, _ := exec.Command(p, "--version").Output()
				row(true, "qemu", strings.SplitN(string(out), "\n", 2)[0])
			}
			if _, err := exec.LookPath("qemu-img"); err != nil {
				row(false, "qemu-img", "not found: apt-get install qemu-utils")
			} else {
				row(true, "qemu-img", "found")
			}
			if p, err := gvisor.FindRunsc(); err != nil {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", "runsc (gvisor)", "WARN", "not installed: `make deps` builds it; --runtime gvisor needs it")
			} else if agent, err := agentPath(""); err != nil {
				row(false, "runsc (gvisor)", p+": "+err.Error())
			} else if rt, err := gvisor.New(gvisor.Config{RunscPath: p, AgentPath: agent, Logger: g.log}); err == nil {
				if caps, err := rt.Probe(ctx); err == nil {
					row(true, "runsc (gvisor)", p+": "+caps.AccelReason+"; "+rt.Limits()+"; --runtime gvisor")
				} else {
					row(false, "runsc (gvisor)", err.Error())
				}
			} else {
				row(true, "runsc (gvisor)", p)
			}
			if fi, err := os.Stat("/dev/kvm"); err != nil {
				row(true, "/dev/kvm", "absent (guests will use TCG)")
			} else {
				row(true, "/dev/kvm", "present ("+fi.Mode().String()+"); a probe guest decides whether it is usable")
			}
			l := statedir.Layout{Root: g.stateDir}
			bc, err := l.LoadBootConfig()
			if err != nil {
				row(false, "guest kernel", err.Error())
			} else {
				row(true, "guest kernel", bc.KernelRelease+" ("+bc.Kernel+")")
				row(true, "initramfs", bc.Initrd)
				if rt, err := newRuntime(g, bc); err != nil {
					row(false, "runtime", err.Error())
				} else if caps, err := rt.Probe(ctx); err != nil {
					row(false, "acceleration", err.Error())
				} else if caps.Accel != "kvm" {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", "acceleration", "WARN", caps.Accel+": "+caps.AccelReason)
				} else {
					row(true, "acceleration", caps.Accel+": "+caps.AccelReason)
				}
			}
			if c := g.pickRuntime(ctx); c.err != nil {
				row(false, "runtime", c.err.Error())
			} else {
				why := c.why
				if g.runtime == "qemu" {
					if auto := (&globals{stateDir: g.stateDir, accel: g.accel, runtime: "auto", log: g.log}).pickRuntime(ctx); auto.name != c.name {
						why += "; --runtime auto would pick " + auto.name + " here (" + strings.TrimPrefix(auto.why, "auto: ") + ")"
					}
				}
				row(true, "runtime", c.name+" for new sandboxes: "+why)
			}
			if images, done, err := g.images(ctx); err == nil {
				list, _ := images.List(ctx)
				names := make([]string, 0, len(list))
				for _, im := range list {
					names = append(names, im.Name)
				}
				if len(names) == 0 {
					row(false, "images", "none: run `airlock image build base`")
				} else {
					row(true, "images", strings.Join(names, ", "))
				}
				done()
			}
			if problems > 0 {
				tw.Flush()
				return &exitError{code: 1, msg: fmt.Sprintf("%d problem(s); `make deps` and `airlock setup` fix most", problems)}
			}
			return nil
		},
	}
}

// hostCgroupParent is where a shim makes its sandbox's host cgroup
// (--host-cgroups): "" for none.
func hostCgroupParent(g *globals) string {
	if g.hostCgroups == "off" {
		return ""
	}
	return hostcg.DefaultParent
}

func shimCmd(g *globals) *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:    "shim --id ID",
		Short:  "Per-sandbox supervisor (started by airlock itself, its configuration on descriptor 4)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			setOOMScoreAdj(g.log, oomAdjSandbox) // before the VMM is started: it inherits it
			ready := os.NewFile(3, "ready")
			// The shim lock the control plane took for this shim (shim.Config.Lock):
			// close-on-exec at once, so nothing this process starts keeps it.
			lock := os.NewFile(statedir.ShimLockFD, "shim.lock")
			if lock != nil {
				syscall.CloseOnExec(statedir.ShimLockFD)
			}
			fail := func(err error) error {
				if ready != nil {
					fmt.Fprintf(ready, "error: %s\n", err)
				}
				return err
			}
			// Every setting comes from the configuration document
			// (shimconf), read and checked before anything else; --id only
			// names the sandbox for ps and must agree with it.
			doc, err := readShimConfig(id)
			if err != nil {
				return fail(err)
			}
			g.stateDir, g.runtime, g.accel, g.logLevel, g.hostCgroups = doc.StateDir, doc.Runtime, doc.Accel, doc.LogLevel, doc.HostCgroups
			if err := g.setup(); err != nil {
				return fail(err)
			}
			l := statedir.Layout{Root: g.stateDir}
			bc, err := l.LoadBootConfig()
			if err != nil {
				return fail(err)
			}
			rt, rootDir, err := sandboxRuntime(g, bc)
			if err != nil {
				return fail(err)
			}
			exe, _ := os.Executable()
			// The shim must outlive the CLI's signals; it stops on its own
			// terms (rm, lifetime, VMM exit, SIGTERM handled in shim.Run).
			return shim.Run(context.WithoutCancel(cmd.Context()), shim.Config{
				StateDir: g.stateDir, ID: doc.ID, Ready: ready, Runtime: rt, RootDir: rootDir, Exe: exe, Secrets: doc.Secrets, Lock: lock, Log: g.log.With("component", "shim"),
				DNS: doc.DNS, UpstreamCAFile: doc.UpstreamCAFile, TestDialMap: doc.TestDialMap, NoProcAudit: doc.ProcAudit == "off",
				HostCgroupParent: hostCgroupParent(g), HostCgroupRequired: g.hostCgroups == "on", DiskReserve: doc.DiskReserve, BuildRoot: doc.BuildRoot,
			})
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "sandbox id (must match the configuration's)")
	return cmd
}

// readShimConfig reads the shim's configuration document on descriptor
// shimconf.FD, a pipe from the control plane, and checks that it names
// sandbox id (--id).
func readShimConfig(id string) (shimconf.Doc, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(shimconf.FD, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		return shimconf.Doc{}, fmt.Errorf("%w: no configuration pipe on descriptor %d (airlock starts its shims itself)", errdefs.ErrInvalid, shimconf.FD)
	}
	f := os.NewFile(shimconf.FD, "shim-config")
	defer f.Close()
	doc, err := shimconf.Read(f)
	if err != nil {
		return shimconf.Doc{}, err
	}
	if err := statedir.ValidateID(doc.ID); err != nil {
		return shimconf.Doc{}, err
	}
	if id != doc.ID {
		return shimconf.Doc{}, fmt.Errorf("%w: shim --id %q does not match its configuration's sandbox %s", errdefs.ErrInvalid, id, doc.ID)
	}
	return doc, nil
}

func holderCmd(g *globals) *cobra.Command {
	var id string
	cmd := &cobra.Command{
		Use:    "template-holder --template ID",
		Short:  "Keep a template's RAM for its clones to share (started by airlock itself)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(id) != 32 || strings.Trim(id, "0123456789abcdef") != "" {
				return fmt.Errorf("%w: bad template id", errdefs.ErrInvalid)
			}
			l := statedir.Layout{Root: g.stateDir}
			t := template.Template{Dir: filepath.Join(l.Templates(), id), Snapshot: filepath.Join(l.Templates(), id, "snap")}
			setOOMScoreAdj(g.log, oomAdjSandbox)
			// Started by a shim, it outlives that sandbox: out of its envelope.
			if err := hostcg.Escape(hostcg.DefaultParent); err != nil {
				g.log.Warn("template holder stays in its shim's host cgroup", "err", err)
			}
			ctx, stop := signal.NotifyContext(context.WithoutCancel(cmd.Context()), syscall.SIGTERM)
			defer stop()
			return template.RunHolder(ctx, t, qemu.SealSnapshotRAM, g.log)
		},
	}
	cmd.Flags().StringVar(&id, "template", "", "template id")
	return cmd
}

// pruneTemplates removes the templates an upgrade left behind that no
// sandbox or snapshot holds (sandbox.Manager.PruneTemplates).
func pruneTemplates(ctx context.Context, g *globals) (int, error) {
	m, done, err := g.manager(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	return m.PruneTemplates(ctx)
}
