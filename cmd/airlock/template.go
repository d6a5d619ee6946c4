package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/archive"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

const templateLong = `Templates: sandboxes built from a Dockerfile, started with the app already running.

` + "`airlock template build`" + ` runs the Dockerfile's steps in a sandbox (RUN executes in the guest,
isolated like everything else; COPY and ADD read the build context), saves each step's
result (a rebuild starts after the last unchanged step), then starts the start command
(--start, or the Dockerfile's ENTRYPOINT and CMD) in the background, waits until the ready
check (--ready) passes, and saves the running sandbox. ` + "`airlock create --image NAME`" + ` starts
a clone of that state: the app is already serving. A template belongs to the tenant that
built it; its sandboxes have its size (--cpus, --memory, --disk at build). Secrets are never
part of a template.

On the gvisor runtime (whose sandboxes cannot be saved with their memory) a template is an
image: each step runs in a sandbox of its own over the earlier steps' layers, the result is
one image, and the start command and ready check run when each sandbox is created (the
create returns once the check passes). A template serves the runtime it was built on.

Supported: FROM (an image, another template of the tenant, or an OCI reference such as
python:3.12-slim, pulled from registries the server allows: serve --template-registry), RUN, COPY, ADD (local files and tar archives), ENV, ARG, WORKDIR, USER,
EXPOSE, CMD, ENTRYPOINT, LABEL. Other instructions, multi-stage builds and ADD of URLs are
refused with their line number.`

func templateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Build sandbox templates from a Dockerfile (app started, ready check passed); list and remove them",
		Long:  templateLong,
		Args:  cobra.NoArgs,
		Example: `  airlock template build -t myapp .
  airlock template build -t web --start 'python3 -m http.server 8000' --ready 'curl -sf localhost:8000' .
  airlock create --image web
  airlock template ls`,
	}
	cmd.AddCommand(templateBuildCmd(g), templateLsCmd(g), templateInspectCmd(g), templateLogsCmd(g), templateRmCmd(g), templatePruneCmd(g))
	return cmd
}

type templateBuildFlags struct {
	name, file, start, ready, readyTimeout string
	memory, disk                           string
	cpus                                   int
	buildArgs                              []string
	noCache, quiet                         bool
}

func (f *templateBuildFlags) options() (airlock.BuildOptions, error) {
	o := airlock.BuildOptions{Start: f.start, Ready: f.ready, CPUs: f.cpus, NoCache: f.noCache}
	if err := sandbox.ValidTemplateName(f.name); err != nil {
		return o, fmt.Errorf("-t: %w", err)
	}
	var err error
	if f.memory != "" {
		if o.MemoryMB, err = parseMiB(f.memory); err != nil {
			return o, fmt.Errorf("--memory: %w", err)
		}
	}
	if f.disk != "" {
		if o.DiskMB, err = parseMiB(f.disk); err != nil {
			return o, fmt.Errorf("--disk: %w", err)
		}
	}
	if f.readyTimeout != "" {
		if o.ReadyTimeout, err = parseDuration(f.readyTimeout); err != nil {
			return o, fmt.Errorf("--ready-timeout: %w", err)
		}
	}
	for _, a := range f.buildArgs {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			// As docker: a bare NAME takes the value from the environment.
			v, ok = os.LookupEnv(k)
			if !ok {
				continue
			}
		}
		if k == "" {
			return o, fmt.Errorf("%w: --build-arg %q: use NAME=VALUE", errdefs.ErrInvalid, a)
		}
		if o.BuildArgs == nil {
			o.BuildArgs = map[string]string{}
		}
		o.BuildArgs[k] = v
	}
	return o, nil
}

func templateBuildCmd(g *globals) *cobra.Command {
	var f templateBuildFlags
	cmd := &cobra.Command{
		Use:   "build -t NAME [flags] CONTEXT",
		Short: "Build a template from a Dockerfile and its context directory; progress on stderr, the name on stdout",
		Example: `  airlock template build -t myapp .
  airlock template build -t web -f docker/Dockerfile --build-arg VERSION=2 --memory 1G .
  airlock template build -t web --start 'python3 -m http.server 8000' --ready 'curl -sf localhost:8000' .`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(*cobra.Command, []string) error {
			_, err := f.options()
			return err
		},
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			o, _ := f.options()
			dir := args[0]
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return fmt.Errorf("%w: build context %q is not a directory", errdefs.ErrInvalid, dir)
			}
			df := f.file
			if df == "" {
				df = filepath.Join(dir, "Dockerfile")
			}
			inner, outside, err := dockerfileIn(dir, df)
			if err != nil {
				return err
			}
			o.Dockerfile = inner
			p := &buildPrinter{w: cmd.ErrOrStderr(), quiet: f.quiet, start: time.Now()}
			o.Progress = p.event
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(writeBuildContext(cmd.Context(), pw, dir, outside)) }()
			t, err := c.BuildTemplate(cmd.Context(), f.name, pr, o)
			pr.Close()
			if err != nil {
				if be, ok := errors.AsType[*airlock.BuildError](err); ok {
					return &exitError{code: 1, msg: be.Event.Message}
				}
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "built template %s (%d steps) in %s\n", t.Name, t.Steps, time.Since(p.start).Round(100*time.Millisecond))
			fmt.Fprintln(cmd.OutOrStdout(), t.Name)
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.name, "tag", "t", "", "the template's name (required): 1-64 characters a-z 0-9 . _ -")
	fl.StringVarP(&f.file, "file", "f", "", "the Dockerfile (default: CONTEXT/Dockerfile)")
	fl.StringVar(&f.start, "start", "", "shell command started in the background after the last step (default: the Dockerfile's ENTRYPOINT and CMD)")
	fl.StringVar(&f.ready, "ready", "", "shell command retried until it exits 0 before the template is saved (e.g. 'curl -sf localhost:8000')")
	fl.StringVar(&f.readyTimeout, "ready-timeout", "", "how long the ready check may take (default 2m)")
	fl.StringArrayVar(&f.buildArgs, "build-arg", nil, "NAME=VALUE for an ARG (repeatable; NAME alone takes it from the environment)")
	fl.IntVar(&f.cpus, "cpus", 0, "vCPUs of the template's sandboxes (default 1)")
	fl.StringVar(&f.memory, "memory", "", "memory of the template's sandboxes (default 512M)")
	fl.StringVar(&f.disk, "disk", "", "root disk of the template's sandboxes (default: image size + 512M, at least 2G)")
	fl.BoolVar(&f.noCache, "no-cache", false, "run every step again")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print the steps only, not their output")
	_ = cmd.MarkFlagRequired("tag")
	return cmd
}

// dockerfileIn says where the Dockerfile df is for the server: its path in
// the context dir, or (outside it) the file to send as
// sandbox.DockerfileEntry.
func dockerfileIn(dir, df string) (inner, outside string, err error) {
	if _, err := os.Stat(df); err != nil {
		return "", "", fmt.Errorf("%w: Dockerfile: %v", errdefs.ErrInvalid, err)
	}
	ad, err1 := filepath.Abs(dir)
	af, err2 := filepath.Abs(df)
	if err := errors.Join(err1, err2); err != nil {
		return "", "", err
	}
	rel, err := filepath.Rel(ad, af)
	if err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return filepath.ToSlash(rel), "", nil
	}
	return "", af, nil
}

// writeBuildContext writes dir's tar to w, preceded by the Dockerfile
// outside (if set) as sandbox.DockerfileEntry.
func writeBuildContext(ctx context.Context, w io.Writer, dir, outside string) error {
	if outside != "" {
		b, err := os.ReadFile(outside)
		if err != nil {
			return err
		}
		tw := tar.NewWriter(w)
		if err := tw.WriteHeader(&tar.Header{Name: sandbox.DockerfileEntry, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg, ModTime: time.Now()}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
		// No trailer: the context's entries follow in the same stream.
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := archive.Write(ctx, w, dir, archive.WriteOptions{Limits: archive.Limits{MaxBytes: sandbox.MaxBuildContextBytes, MaxEntries: sandbox.MaxBuildContextEntries}})
	return err
}

// buildPrinter prints a build's progress: a line per step, its output
// indented (unless quiet), and how long it took.
type buildPrinter struct {
	w     io.Writer
	quiet bool
	start time.Time
	mid   bool // the last output did not end its line
}

func (p *buildPrinter) event(ev airlock.BuildEvent) {
	if p.mid && ev.Kind != "output" {
		fmt.Fprintln(p.w)
		p.mid = false
	}
	switch ev.Kind {
	case "cached":
		fmt.Fprintf(p.w, "step %d/%d: %s (cached)\n", ev.Step, ev.Steps, ev.Text)
	case "config":
		fmt.Fprintf(p.w, "step %d/%d: %s (config)\n", ev.Step, ev.Steps, ev.Text)
	case "step":
		fmt.Fprintf(p.w, "step %d/%d: %s\n", ev.Step, ev.Steps, ev.Text)
	case "output":
		if p.quiet || ev.Output == "" {
			return
		}
		for i, line := range strings.SplitAfter(ev.Output, "\n") {
			if line == "" {
				continue
			}
			if i > 0 || !p.mid {
				fmt.Fprint(p.w, "  | ")
			}
			fmt.Fprint(p.w, line)
			p.mid = !strings.HasSuffix(line, "\n")
		}
	case "done":
		fmt.Fprintf(p.w, "  done in %s (%s total)\n", (time.Duration(ev.ElapsedMS) * time.Millisecond).Round(10*time.Millisecond), time.Since(p.start).Round(100*time.Millisecond))
	case "status":
		fmt.Fprintf(p.w, "%s\n", ev.Message)
	case "error":
		if ev.ExitCode != nil {
			fmt.Fprintf(p.w, "step %d/%d failed (exit code %d)\n", ev.Step, ev.Steps, *ev.ExitCode)
		}
	}
}

func templateLsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls [--json]",
		Short:   "List templates: name, base, steps, start command, build time, age",
		Example: "  airlock template ls\n  airlock template ls --json",
		Args:    cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			ts, err := c.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if ts == nil {
				ts = []airlock.Template{}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), ts)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tRUNTIME\tFROM\tSTEPS\tSTART\tBUILT IN\tCREATED")
			for _, t := range ts {
				start := t.Start
				if start == "" {
					start = "-"
				}
				if len(start) > 40 {
					start = start[:37] + "..."
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s ago\n", t.Name, t.Runtime, t.From, t.Steps, start,
					(time.Duration(t.BuildMS) * time.Millisecond).Round(100*time.Millisecond), time.Since(t.CreatedAt).Round(time.Second))
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func templateInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "inspect NAME",
		Short:   "Show a template as JSON: its configuration (env, workdir, user, cmd, ports, labels), start command and ready check",
		Example: "  airlock template inspect web",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			t, err := c.GetTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), t)
		}),
	}
}

func templateRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Short:   "Remove templates (sandboxes running from them go on); their build cache stays until prune",
		Example: "  airlock template rm web\n  airlock template rm web && airlock template prune",
		Args:    cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			return forEachID(cmd, "template rm", args, func(name string) error {
				if err := c.DeleteTemplate(cmd.Context(), name); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
				return nil
			})
		}),
	}
}

func templatePruneCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "prune",
		Short:   "Remove the build cache (saved steps) and unused states of replaced templates",
		Example: "  airlock template prune",
		Args:    cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, _ []string) error {
			n, err := c.PruneTemplates(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d saved states\n", n)
			return nil
		}),
	}
}

func templateLogsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "logs NAME",
		Short:   "Print the log of the last build of a template name (failed builds too)",
		Example: "  airlock template logs web",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			log, err := c.TemplateLog(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), log)
			return err
		}),
	}
}
