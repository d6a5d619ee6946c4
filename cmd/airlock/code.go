package main

// airlock code and airlock contexts: code contexts (long-lived interpreters
// that keep state between calls), locally through the manager or remotely
// (AIRLOCK_HOST) through the Go SDK.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// codePrinter turns a run's events into the CLI's output: stdout/stderr
// streamed, the main result's text/plain on stdout, images saved to out
// (or noted), errors on stderr, and airlock's status lines (a context
// still starting) on stderr if progress.
type codePrinter struct {
	stdout, stderr io.Writer
	out            string // directory for images; "" to only note them
	progress       bool   // print status events
	n              int    // images saved
	failed         bool
	timedOut       bool
	truncated      bool
}

// status prints one status event (the server's text) to stderr.
func (p *codePrinter) status(s string) {
	if p.progress {
		fmt.Fprintf(p.stderr, "airlock: %s\n", guest.Text(s, 512))
	}
}

var imageExt = map[string]string{"image/png": ".png", "image/svg+xml": ".svg", "image/jpeg": ".jpg", "image/gif": ".gif"}

// result prints or saves a result; file is the guest path of a file that
// --return-files brought back ("" for the code's own results).
func (p *codePrinter) result(main bool, data map[string][]byte, file string) error {
	from := ""
	if file != "" {
		from = " " + guest.Text(file, 256)
	}
	hasImage := false
	for _, mime := range slices.Sorted(func(yield func(string) bool) {
		for k := range data {
			if !yield(k) {
				return
			}
		}
	}) {
		ext, ok := imageExt[mime]
		if !ok {
			continue
		}
		hasImage = true
		v := data[mime]
		if p.out == "" {
			fmt.Fprintf(p.stderr, "[%s%s %d bytes; use --out DIR to save]\n", mime, from, len(v))
			continue
		}
		// Never overwrite: the next free result-N name in the directory.
		var path string
		var f *os.File
		for {
			p.n++
			path = filepath.Join(p.out, fmt.Sprintf("result-%d%s", p.n, ext))
			var err error
			f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err == nil {
				break
			}
			if !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("save %s: %w", mime, err)
			}
		}
		_, werr := f.Write(v)
		if err := errors.Join(werr, f.Close()); err != nil {
			return fmt.Errorf("save %s: %w", mime, err)
		}
		fmt.Fprintf(p.stderr, "[%s%s saved to %s]\n", mime, from, path)
	}
	if t, ok := data["text/plain"]; ok && (main || !hasImage) {
		s := string(t)
		if !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		_, _ = io.WriteString(p.stdout, s)
	}
	return nil
}

func (p *codePrinter) codeError(name, value string, tb []string) {
	p.failed = true
	for _, l := range tb {
		fmt.Fprintln(p.stderr, l)
	}
	if value != "" {
		fmt.Fprintf(p.stderr, "%s: %s\n", name, value)
	} else {
		fmt.Fprintln(p.stderr, name)
	}
}

// exit returns the command's outcome: 124 timed out, 1 the code raised.
func (p *codePrinter) exit() error {
	if p.truncated {
		fmt.Fprintln(p.stderr, "[output truncated]")
	}
	switch {
	case p.timedOut:
		return &exitError{code: 124, msg: "code timed out"}
	case p.failed:
		return &exitError{code: 1}
	}
	return nil
}

// event handles one local event.
func (p *codePrinter) event(ev guest.CodeEvent) error {
	switch ev.Kind {
	case guest.EventStdout:
		_, err := p.stdout.Write(ev.Data)
		return err
	case guest.EventStderr:
		_, err := p.stderr.Write(ev.Data)
		return err
	case guest.EventResult:
		return p.result(ev.Result.Main, ev.Result.Data, ev.Result.File)
	case guest.EventStatus:
		p.status(ev.Status)
	case guest.EventError:
		p.codeError(ev.Error.Name, ev.Error.Value, ev.Error.Traceback)
	case guest.EventEnd:
		p.timedOut, p.truncated = ev.End.TimedOut, ev.End.Truncated
	}
	return nil
}

// stderrIsTerminal reports whether cmd's stderr is a terminal.
func stderrIsTerminal(cmd *cobra.Command) bool {
	f, ok := cmd.ErrOrStderr().(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// starting prints progress while a context the CLI creates starts (the
// first python run of a sandbox takes seconds, tens of seconds without
// KVM) and returns a func that ends it.
func starting(p *codePrinter, what string) func() {
	if !p.progress {
		return func() {}
	}
	p.status("starting " + what)
	quit, done := make(chan struct{}), make(chan struct{})
	t0 := time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				p.status(fmt.Sprintf("still starting %s (%ds)", what, int(time.Since(t0).Round(time.Second)/time.Second)))
			}
		}
	}()
	return func() { close(quit); <-done }
}

func codeCmd(g *globals) *cobra.Command {
	var lang, ctxID, file, out, timeout string
	var progress bool
	var returnFiles []string
	cmd := &cobra.Command{
		Use:   "code [flags] ID [CODE]",
		Short: "Run code in a sandbox's code context (state is kept between calls)",
		Long: `Run code in a long-lived interpreter of the sandbox: python (default), javascript or
bash. Without --context, the language's default context runs it; --context NAME runs it
in that context, created on first use (in --lang). stdout/stderr stream,
the value of the last expression is printed, images are saved to --out (or noted), and an
exception is printed to stderr with exit code 1; a timeout exits 124. CODE, -f FILE, or
stdin when neither is given.

Matplotlib figures come back whatever backend the code picked: the figures a run leaves
open are sent as PNGs, then closed. --return-files GLOB also brings back the image files
(.png, .jpg, .gif, .svg) the run wrote that match GLOB (relative to the context's
directory, /root by default). While the context's interpreter starts (the first python run
of a sandbox), airlock says so on stderr when stderr is a terminal or with --progress. A
context whose interpreter died (out of memory, killed) is restarted by the next run, which
says so first on stderr; its state is lost.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := readCode(cmd, args, file)
			if err != nil {
				return err
			}
			var d time.Duration
			if timeout != "" {
				if d, err = parseDuration(timeout); err != nil {
					return err
				}
			}
			// --lang with --context is the language of a context created
			// on first use; the run itself goes to the context.
			newLang := lang
			if ctxID != "" || !cmd.Flags().Changed("lang") {
				lang = ""
			}
			if out != "" {
				if err := os.MkdirAll(out, 0o755); err != nil {
					return err
				}
			}
			if !cmd.Flags().Changed("progress") {
				progress = stderrIsTerminal(cmd)
			}
			p := &codePrinter{stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr(), out: out, progress: progress}
			id := args[0]
			c, done, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			if ctxID != "" {
				cxs, err := c.ListContexts(cmd.Context(), id)
				if err != nil {
					return fmt.Errorf("code: %s", apiMsg(err))
				}
				if !slices.ContainsFunc(cxs, func(cx airlock.Context) bool { return cx.ID == ctxID }) {
					stop := starting(p, newLang+" context "+ctxID)
					_, err := c.CreateContext(cmd.Context(), id, airlock.ContextOptions{ID: ctxID, Language: newLang})
					stop()
					if err != nil && !errors.Is(err, airlock.ErrConflict) {
						return fmt.Errorf("code: create context %s: %s", ctxID, apiMsg(err))
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "airlock: created context %s (%s)\n", ctxID, newLang)
				}
			}
			ex, err := c.RunCode(cmd.Context(), id, airlock.CodeRequest{Code: code, Language: lang, Context: ctxID, Timeout: d, ReturnFiles: returnFiles}, airlock.CodeHandlers{
				OnStdout: func(b []byte) { _, _ = p.stdout.Write(b) },
				OnStderr: func(b []byte) { _, _ = p.stderr.Write(b) },
				OnResult: func(r airlock.Result) {
					if err := p.result(r.Main, r.Data, r.File); err != nil {
						fmt.Fprintln(p.stderr, err)
					}
				},
				OnError:  func(e *airlock.CodeError) { p.codeError(e.Name, e.Value, e.Traceback) },
				OnStatus: p.status,
			})
			if err != nil {
				return fmt.Errorf("code: %s", apiMsg(err))
			}
			p.timedOut, p.truncated = ex.TimedOut, ex.Truncated
			return p.exit()
		},
	}
	cmd.Flags().StringVar(&lang, "lang", "python", "language: python, javascript or bash (of the default context, or of a --context created on first use)")
	cmd.Flags().StringVar(&ctxID, "context", "", "context id ([a-z0-9][a-z0-9-]{0,62}); created on first use")
	cmd.Flags().StringVarP(&file, "file", "f", "", "read the code from FILE (- for stdin)")
	cmd.Flags().StringVar(&out, "out", "", "save images (PNG, SVG, JPEG) to this directory")
	cmd.Flags().StringVar(&timeout, "timeout", "", "interrupt the code after this long (e.g. 30s); the context survives")
	cmd.Flags().StringArrayVar(&returnFiles, "return-files", nil, "also return the image files the run writes that match this glob (relative to the context's directory; repeatable), saved like figures")
	cmd.Flags().BoolVar(&progress, "progress", false, "say on stderr what the run waits for (a context that starts); default: when stderr is a terminal")
	return cmd
}

// readCode returns the code from the argument, -f FILE or stdin.
func readCode(cmd *cobra.Command, args []string, file string) (string, error) {
	switch {
	case len(args) == 2 && file != "":
		return "", fmt.Errorf("%w: give CODE or -f FILE, not both", errdefs.ErrInvalid)
	case len(args) == 2:
		return args[1], nil
	case file != "" && file != "-":
		b, err := os.ReadFile(file)
		return string(b), err
	}
	b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), guest.MaxCodeBytes+1))
	return string(b), err
}

// contextView is the CLI's JSON and table form of a context.
type contextView struct {
	ID        string       `json:"id"`
	Language  string       `json:"language"`
	State     string       `json:"state"`
	Default   bool         `json:"is_default"`
	Cwd       string       `json:"cwd"`
	CreatedAt time.Time    `json:"created_at"`
	Exit      *contextExit `json:"exit,omitempty"`
}

// contextExit is how a dead context's interpreter ended (the API's form).
type contextExit struct {
	Reason    string `json:"reason"`
	Code      int    `json:"code"`
	Signal    int    `json:"signal"`
	OOMKilled bool   `json:"oom_killed"`
}

func localContext(in guest.ContextInfo) contextView {
	v := contextView{in.ID, in.Language, in.State, in.IsDefault, in.Cwd, in.CreatedAt.UTC(), nil}
	if e := in.Exit; e != nil {
		v.Exit = &contextExit{e.Reason(), e.Code, e.Signal, e.OOMKilled}
	}
	return v
}

func viewContext(in *airlock.Context) contextView {
	v := contextView{in.ID, in.Language, in.State, in.IsDefault, in.Cwd, in.CreatedAt, nil}
	if e := in.Exit; e != nil {
		v.Exit = &contextExit{e.Reason, e.Code, e.Signal, e.OOMKilled}
	}
	return v
}

func printContexts(w io.Writer, cs []contextView, asJSON bool) error {
	if asJSON {
		if cs == nil {
			cs = []contextView{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(cs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tLANGUAGE\tSTATE\tDEFAULT\tCWD")
	for _, c := range cs {
		state := c.State
		if c.State == "dead" {
			why := "reason unknown"
			if c.Exit != nil {
				why = c.Exit.Reason
			}
			state += " (" + guest.Text(why, 64) + "; the next run restarts it)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", guest.Text(c.ID, 64), c.Language, state, c.Default, guest.Text(c.Cwd, 256))
	}
	return tw.Flush()
}

func contextsCmd(g *globals) *cobra.Command {
	root := &cobra.Command{Use: "contexts", Short: "Manage a sandbox's code contexts"}
	var asJSON bool
	ls := &cobra.Command{
		Use: "ls ID", Short: "List code contexts", Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			cs, err := c.ListContexts(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("contexts ls: %s", apiMsg(err))
			}
			var out []contextView
			for i := range cs {
				out = append(out, viewContext(&cs[i]))
			}
			return printContexts(cmd.OutOrStdout(), out, asJSON)
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var lang, id, cwd string
	var env []string
	create := &cobra.Command{
		Use: "create ID", Short: "Create a code context; prints its id", Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
			o := airlock.ContextOptions{ID: id, Language: lang, Cwd: cwd}
			for _, kv := range env {
				k, v, _ := strings.Cut(kv, "=")
				if o.Env == nil {
					o.Env = map[string]string{}
				}
				o.Env[k] = v
			}
			cx, err := c.CreateContext(cmd.Context(), args[0], o)
			if err != nil {
				return fmt.Errorf("contexts create: %s", apiMsg(err))
			}
			fmt.Fprintln(cmd.OutOrStdout(), cx.ID)
			return nil
		}),
	}
	create.Flags().StringVar(&lang, "lang", "python", "python, javascript or bash")
	create.Flags().StringVar(&id, "id", "", "context id ([a-z0-9][a-z0-9-]{0,62}; default: generated)")
	create.Flags().StringVar(&cwd, "cwd", "", "working directory (default /root)")
	create.Flags().StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE (repeatable)")

	// op makes rm, restart and interrupt: ID CONTEXT.
	op := func(use, short string, local func(m *sandbox.Manager, cmd *cobra.Command, id, cid string) error, remote func(c *airlock.Client, cmd *cobra.Command, id, cid string) error) *cobra.Command {
		return &cobra.Command{
			Use: use + " ID CONTEXT", Short: short, Args: cobra.ExactArgs(2),
			RunE: g.withClient(func(cmd *cobra.Command, c *airlock.Client, args []string) error {
				if err := remote(c, cmd, args[0], args[1]); err != nil {
					return fmt.Errorf("contexts %s: %s", use, apiMsg(err))
				}
				return nil
			}),
		}
	}
	rm := op("rm", "Delete a code context (its state is lost)",
		func(m *sandbox.Manager, cmd *cobra.Command, id, cid string) error {
			return m.DeleteContext(cmd.Context(), sandbox.Local(), id, cid)
		},
		func(c *airlock.Client, cmd *cobra.Command, id, cid string) error {
			return c.DeleteContext(cmd.Context(), id, cid)
		})
	restart := op("restart", "Restart a code context's interpreter (state is lost)",
		func(m *sandbox.Manager, cmd *cobra.Command, id, cid string) error {
			_, err := m.RestartContext(cmd.Context(), sandbox.Local(), id, cid)
			return err
		},
		func(c *airlock.Client, cmd *cobra.Command, id, cid string) error {
			_, err := c.RestartContext(cmd.Context(), id, cid)
			return err
		})
	interrupt := op("interrupt", "Interrupt the code running in a context",
		func(m *sandbox.Manager, cmd *cobra.Command, id, cid string) error {
			return m.InterruptContext(cmd.Context(), sandbox.Local(), id, cid)
		},
		func(c *airlock.Client, cmd *cobra.Command, id, cid string) error {
			return c.InterruptContext(cmd.Context(), id, cid)
		})
	root.AddCommand(ls, create, rm, restart, interrupt)
	return root
}
