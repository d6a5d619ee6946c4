package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/archive"
	"github.com/airlock-sandbox/airlock/internal/dockerfile"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Templates are built from a Dockerfile in a sandbox (the builder), like
// everything else guest code runs in: the builder is one of the tenant's
// sandboxes, under its quota and network policy. The result of every step
// that changes the filesystem is saved as an unlisted snapshot named by
// the step's cache key (buildPrefix): a rebuild starts from the last step
// whose key it finds, and an unchanged Dockerfile builds nothing. After
// the last step the start command runs in the background and the ready
// check is retried until it passes; the builder is then saved once more
// (tplPrefix), with the server running, and every sandbox of the template
// is a clone of that snapshot: it answers at clone speed with the
// process already serving. Builder sandboxes get no secrets, so a
// template never holds one.
const (
	buildPrefix = "_build-"
	tplPrefix   = "_tpl-"
)

// TemplateConfig is what a template keeps of its Dockerfile: the image
// configuration, and the start command and ready check it was built with.
type TemplateConfig struct {
	dockerfile.Config
	Start string `json:"start,omitempty"`
	Ready string `json:"ready,omitempty"`
}

// Template is a built template as callers see it.
type Template struct {
	store.Template
	TemplateConfig
}

// BuildOptions say what to build.
type BuildOptions struct {
	// Name is the template's name (ValidTemplateName).
	Name string
	// Dockerfile is its text; Context the host directory of the build
	// context (COPY and ADD read only inside it).
	Dockerfile []byte
	Context    string
	// BuildArgs override the Dockerfile's ARG defaults.
	BuildArgs map[string]string
	// Start is the command started in the background after the last step
	// (a shell command line; "" means the Dockerfile's ENTRYPOINT and
	// CMD, if any). Ready is a shell command retried until it exits 0
	// before the template is saved ("": none), for at most ReadyTimeout
	// (0: DefaultReadyTimeout).
	Start        string
	Ready        string
	ReadyTimeout time.Duration
	// CPUs, MemoryMiB and DiskMiB size the builder and so every sandbox
	// of the template (0: the create defaults).
	CPUs, MemoryMiB, DiskMiB int
	// NoCache runs every step, replacing the cached results.
	NoCache bool
	// Progress gets the build's events, from this goroutine; nil: none.
	Progress func(BuildEvent)
}

// DefaultReadyTimeout bounds the ready check of a build that gives none.
const DefaultReadyTimeout = 2 * time.Minute

// BuildEvent is one line of a build's progress.
type BuildEvent struct {
	// Step is the step's number (1-based; 0 for events of the build as a
	// whole) of Steps; Line its line in the Dockerfile, Text the
	// instruction.
	Step  int    `json:"step,omitempty"`
	Steps int    `json:"steps,omitempty"`
	Line  int    `json:"line,omitempty"`
	Text  string `json:"text,omitempty"`
	// Kind: "step" (a step starts), "cached" (its result was found),
	// "config" (a step that only sets configuration was applied),
	// "output" (a chunk of its output in Output), "done" (it ended:
	// ElapsedMS), "status" (Message says what the build does now),
	// "error" (it failed: Message, ExitCode for a RUN) and "built" (the
	// template is ready).
	Kind      string `json:"kind"`
	Output    string `json:"output,omitempty"`
	Message   string `json:"message,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	ElapsedMS int64  `json:"elapsed_ms,omitempty"`
}

var templateNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

// ValidTemplateName refuses a name that could not name an image: 1-64
// characters a-z 0-9 . _ -, starting with a letter or digit.
func ValidTemplateName(name string) error {
	if !templateNameRE().MatchString(name) {
		return fmt.Errorf("%w: template name %q: use 1-64 characters a-z 0-9 . _ - starting with a letter or digit", errdefs.ErrInvalid, name)
	}
	return nil
}

// BuildTemplate builds template o.Name of c's tenant from o.Dockerfile (see
// the package's template notes above), replacing one of that name. It is
// audited as template.build. Errors: ErrInvalid for a bad Dockerfile, name
// or context path (naming the line), ErrNotFound for an unknown FROM,
// ErrFailedPrecondition when a RUN or the ready check fails or this
// server's sandboxes cannot be saved (gvisor), the create's quota errors.
func (m *Manager) BuildTemplate(ctx context.Context, c Caller, o BuildOptions) (t Template, err error) {
	if err := ValidTemplateName(o.Name); err != nil {
		return Template{}, err
	}
	// The build's log: what its progress says, kept after it ends
	// (TemplateLog), the last build of each name.
	blog := m.openBuildLog(c.Tenant, o.Name)
	defer func() { blog.finish(err) }()
	progress := func(ev BuildEvent) {
		blog.event(ev)
		if o.Progress != nil {
			o.Progress(ev)
		}
	}
	return m.buildTemplate(ctx, c, o, progress)
}

func (m *Manager) buildTemplate(ctx context.Context, c Caller, o BuildOptions, progress func(BuildEvent)) (Template, error) {
	start := time.Now()
	plan, err := dockerfile.Parse(bytes.NewReader(o.Dockerfile), o.BuildArgs)
	if err != nil {
		return Template{}, err
	}
	rt, err := m.runtimeName(ctx)
	if err != nil {
		return Template{}, err
	}
	if rt != "qemu" && rt != "gvisor" {
		return Template{}, &BuildError{err: fmt.Errorf("%w: templates are built on the qemu and gvisor runtimes, not %s", errdefs.ErrFailedPrecondition, rt)}
	}
	bctx, err := dockerfile.OpenContext(o.Context)
	if err != nil {
		return Template{}, err
	}
	defer bctx.Close()
	base, baseKey, parent, err := m.templateBase(ctx, c, plan.From, rt, progress)
	if err != nil {
		return Template{}, &BuildError{Line: plan.FromLine, err: atLine(plan.FromLine, err)}
	}
	if parent != nil {
		inherit(plan, parent.Config)
	}
	if err := plan.Keys(bctx, baseKey); err != nil {
		return Template{}, err
	}
	cfg := TemplateConfig{Config: plan.Config, Start: o.Start, Ready: o.Ready}
	if cfg.Start == "" {
		cfg.Start = shellJoin(append(append([]string(nil), plan.Config.Entrypoint...), plan.Config.Cmd...))
	}
	lastKey := baseKey
	if n := len(plan.Steps); n > 0 {
		lastKey = plan.Steps[n-1].Key
	}
	if rt == "gvisor" {
		digest, cached, err := m.buildGVisor(ctx, c, o, plan, bctx, base, cfg, lastKey, progress)
		if err != nil {
			return Template{}, err
		}
		return m.recordTemplate(ctx, c, o, plan, cfg, store.Template{Runtime: rt, ImageDigest: digest}, cached, start, progress)
	}
	tplSnap := tplPrefix + keyName(lastKey, "start", cfg.Start, "ready", cfg.Ready, "env", strings.Join(plan.Config.Env, "\x00"),
		"size", fmt.Sprint(o.CPUs, o.MemoryMiB, o.DiskMiB))

	// Resume after the last step whose result is saved.
	from := -1
	if !o.NoCache {
		for i := len(plan.Steps) - 1; i >= 0; i-- {
			if s := plan.Steps[i]; s.Changes && m.hasSnapshot(ctx, c.Tenant, buildPrefix+keyName(s.Key)) {
				from = i
				break
			}
		}
	}
	for i, s := range plan.Steps[:from+1] {
		progress(BuildEvent{Kind: "cached", Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text})
	}
	if o.NoCache || !m.hasSnapshot(ctx, c.Tenant, tplSnap) {
		builder, err := m.startBuilder(ctx, c, o, plan, from, base)
		if err != nil {
			return Template{}, err
		}
		defer func() {
			if err := m.Remove(context.WithoutCancel(ctx), c, builder.ID); err != nil {
				m.log().Warn("remove template builder", "sandbox", builder.ID, "err", err)
			}
		}()
		if from < 0 && parent != nil && parent.Start != "" {
			// The FROM template's app runs in its saved state: it stops
			// before the steps, and the start command starts after them.
			progress(BuildEvent{Kind: "status", Message: "stopping the FROM template's start command"})
			if err := m.buildExec(ctx, c, builder.ID, []string{"/bin/sh", "-c", stopStartScript}, nil, "/", "", nil); err != nil {
				return Template{}, &BuildError{err: fmt.Errorf("%w: stop the FROM template's start command: %v", errdefs.ErrFailedPrecondition, err)}
			}
		}
		for i := from + 1; i < len(plan.Steps); i++ {
			if err := m.buildStep(ctx, c, builder.ID, bctx, plan, i, o.NoCache, progress); err != nil {
				return Template{}, err
			}
		}
		if err := m.startApp(ctx, c, builder.ID, cfg, o.ReadyTimeout, progress); err != nil {
			return Template{}, &BuildError{err: err}
		}
		progress(BuildEvent{Kind: "status", Message: "saving the template (memory and disk)"})
		if err := m.snapshotCount(ctx, c, c.Tenant); err != nil {
			return Template{}, err
		}
		if o.NoCache {
			_ = m.removeSnapshot(ctx, c.Tenant, tplSnap)
		}
		if _, err := m.snapshot(ctx, builder.ID, tplSnap, false); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return Template{}, fmt.Errorf("save the template: %w", err)
		}
	}
	return m.recordTemplate(ctx, c, o, plan, cfg, store.Template{Runtime: rt, Snapshot: tplSnap}, from+1, start, progress)
}

// recordTemplate records the template built from plan (t has its runtime
// and its snapshot or image), drops the snapshot of the one it replaces,
// and audits template.build.
func (m *Manager) recordTemplate(ctx context.Context, c Caller, o BuildOptions, plan *dockerfile.Plan, cfg TemplateConfig, t store.Template, cached int, start time.Time, progress func(BuildEvent)) (Template, error) {
	cj, err := json.Marshal(cfg)
	if err != nil {
		return Template{}, err
	}
	t.Tenant, t.Name, t.Base, t.Config = c.Tenant, o.Name, plan.From, cj
	t.Steps, t.BuildMS, t.Created = len(plan.Steps), time.Since(start).Milliseconds(), time.Now().UTC()
	old, err := m.Store.PutTemplate(ctx, t)
	if err != nil {
		return Template{}, err
	}
	if old != "" && old != t.Snapshot {
		m.dropTemplateSnapshot(ctx, c.Tenant, old)
	}
	m.audit(ctx, c, "", "template.build", map[string]any{"name": o.Name, "from": plan.From, "steps": len(plan.Steps),
		"cached_steps": cached, "duration_ms": t.BuildMS, "runtime": t.Runtime})
	out := Template{Template: t, TemplateConfig: cfg}
	progress(BuildEvent{Kind: "built", ElapsedMS: t.BuildMS})
	return out, nil
}

// templateBase resolves FROM: a template of c's tenant (its snapshot), or
// an image. It returns the sandbox to start a first builder from
// (snapshot name or image name) and the base's cache key.
//
// A template's configuration is inherited (parent): its steps run under
// it, and the key covers it.
func (m *Manager) templateBase(ctx context.Context, c Caller, from, rt string, progress func(BuildEvent)) (base, key string, parent *TemplateConfig, err error) {
	if t, err := m.Store.GetTemplate(ctx, c.Tenant, from); err == nil {
		if tr := cmp.Or(t.Runtime, "qemu"); tr != rt {
			return "", "", nil, fmt.Errorf("FROM %s: that template was built on %s and this build runs on %s: rebuild it here first: %w", from, tr, rt, errdefs.ErrFailedPrecondition)
		}
		cfg := viewTemplate(t).TemplateConfig
		if rt == "gvisor" {
			return "digest:" + t.ImageDigest, "digest:" + t.ImageDigest + ":" + keyName(string(t.Config)), &cfg, nil
		}
		sn, err := m.Store.GetSnapshot(ctx, c.Tenant, t.Snapshot)
		if err != nil {
			return "", "", nil, err
		}
		return "snapshot:" + t.Snapshot, "snapshot:" + sn.ID + ":" + keyName(string(t.Config)), &cfg, nil
	}
	img, err := m.Store.GetImage(ctx, from)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			return "", "", nil, err
		}
		ref, registry, allowed := m.registryRef(c, from)
		if allowed {
			base, key, err := m.pullBase(ctx, c, ref, progress)
			return base, key, nil, err
		}
		if registry != "" {
			return "", "", nil, fmt.Errorf("FROM %s: no template or image of that name here, and this server does not pull from %s during builds (an admin allows a registry with `airlock serve --template-registry %s`; or pull it first: `airlock image pull %s --name NAME`, then FROM NAME): %w", from, registry, registry, from, errdefs.ErrNotFound)
		}
		return "", "", nil, fmt.Errorf("FROM %s: no template or image of that name here (pull an OCI image first: `airlock image pull REF --name NAME`, then FROM NAME): %w", from, errdefs.ErrNotFound)
	}
	return "image:" + img.Name, "image:" + img.Digest, nil, nil
}

// inherit lays the FROM template's configuration under every step's, as
// docker does with a base image's: ENV entries the Dockerfile does not set
// again, WORKDIR and USER until it sets its own, labels and ports merged,
// ENTRYPOINT and CMD unless it sets them (an ENTRYPOINT of its own drops
// the parent's CMD).
func inherit(plan *dockerfile.Plan, parent dockerfile.Config) {
	merge := func(c dockerfile.Config) dockerfile.Config {
		out := c
		out.Env = underlay(parent.Env, c.Env)
		out.WorkDir = cmp.Or(c.WorkDir, parent.WorkDir)
		out.User = cmp.Or(c.User, parent.User)
		if c.Entrypoint == nil {
			out.Entrypoint = parent.Entrypoint
			if c.Cmd == nil {
				out.Cmd = parent.Cmd
			}
		}
		out.Labels = maps.Clone(parent.Labels)
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		maps.Copy(out.Labels, c.Labels)
		out.ExposedPorts = nil
		for _, p := range append(slices.Clone(parent.ExposedPorts), c.ExposedPorts...) {
			if !slices.Contains(out.ExposedPorts, p) {
				out.ExposedPorts = append(out.ExposedPorts, p)
			}
		}
		return out
	}
	for i := range plan.Steps {
		s := &plan.Steps[i]
		s.Config = merge(s.Config)
		if s.Kind == "RUN" {
			// Its environment: the parent's, under the step's own.
			s.Env = underlay(parent.Env, s.Env)
			slices.Sort(s.Env)
		}
	}
	plan.Config = merge(plan.Config)
}

// underlay is own's "K=V" entries after those of parent whose K own does
// not set.
func underlay(parent, own []string) []string {
	set := map[string]bool{}
	for _, kv := range own {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	var out []string
	for _, kv := range parent {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, own...)
}

// keyName is the cache name of a key and what follows it: 32 hex digits.
func keyName(key string, more ...string) string {
	h := sha256.New()
	h.Write([]byte(key))
	for _, s := range more {
		h.Write([]byte{0})
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func (m *Manager) hasSnapshot(ctx context.Context, tenant, name string) bool {
	_, err := m.Store.GetSnapshot(ctx, tenant, name)
	return err == nil
}

// startBuilder starts the sandbox the steps after step from run in: from
// that step's saved result, or from the base.
func (m *Manager) startBuilder(ctx context.Context, c Caller, o BuildOptions, plan *dockerfile.Plan, from int, base string) (store.Sandbox, error) {
	opts := CreateOptions{CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskMiB: o.DiskMiB, Timeout: time.Hour,
		Metadata: map[string]string{"airlock.template-build": o.Name}}
	snap := ""
	if from >= 0 {
		snap = buildPrefix + keyName(plan.Steps[from].Key)
	} else if s, ok := strings.CutPrefix(base, "snapshot:"); ok {
		snap = s
	}
	if snap == "" && strings.HasPrefix(base, "digest:") {
		// A pulled image: a blob that no image name refers to.
		img, err := m.gvisorBase(ctx, base)
		if err != nil {
			return store.Sandbox{}, err
		}
		opts.Image, opts.imageDigest, opts.imageSize = img.Name, img.Digest, img.Size
		return m.Create(ctx, c, opts)
	}
	if snap == "" {
		opts.Image = strings.TrimPrefix(base, "image:")
		return m.Create(ctx, c, opts)
	}
	sn, err := m.Store.GetSnapshot(ctx, c.Tenant, snap)
	if err != nil {
		return store.Sandbox{}, err
	}
	if sizeDiffers(opts, sn) {
		return store.Sandbox{}, fmt.Errorf("%w: the build's size differs from its base's (%d cpus, %d MiB memory, %d MiB disk): build with the same size or --no-cache", errdefs.ErrInvalid, sn.CPUs, sn.MemoryMiB, sn.DiskMiB)
	}
	return m.createFromSnapshot(ctx, c, sn, "build:"+o.Name, opts)
}

// buildStep runs step i in the builder and saves its result when it
// changes the filesystem.
func (m *Manager) buildStep(ctx context.Context, c Caller, id string, bctx *dockerfile.Context, plan *dockerfile.Plan, i int, noCache bool, progress func(BuildEvent)) error {
	s := plan.Steps[i]
	ev := BuildEvent{Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text}
	if !s.Changes {
		// Configuration only: in s.Config and the later keys.
		ev.Kind = "config"
		progress(ev)
		return nil
	}
	t0 := time.Now()
	ev.Kind = "step"
	progress(ev)
	if err := m.runStep(ctx, c, id, bctx, plan, i, ev, progress); err != nil {
		return err
	}
	name := buildPrefix + keyName(s.Key)
	if noCache {
		_ = m.removeSnapshot(ctx, c.Tenant, name)
	}
	// Saved steps count as the tenant's snapshots: past its quota the
	// build goes on without saving more.
	if err := m.snapshotCount(ctx, c, c.Tenant); err != nil {
		progress(BuildEvent{Kind: "status", Message: fmt.Sprintf("step %d not saved for later builds: %v (airlock template prune frees saved steps)", i+1, err)})
	} else if _, err := m.snapshot(ctx, id, name, false); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		return fmt.Errorf("save step %d: %w", i+1, err)
	}
	ev.Kind, ev.ElapsedMS = "done", time.Since(t0).Milliseconds()
	progress(ev)
	return nil
}

// runStep runs step i of plan in builder id; a failure is a *BuildError.
func (m *Manager) runStep(ctx context.Context, c Caller, id string, bctx *dockerfile.Context, plan *dockerfile.Plan, i int, ev BuildEvent, progress func(BuildEvent)) error {
	s := plan.Steps[i]
	var err error
	switch s.Kind {
	case "RUN":
		err = m.buildRun(ctx, c, id, s, ev, progress)
	case "COPY", "ADD":
		err = m.buildCopy(ctx, c, id, bctx, s)
	case "WORKDIR":
		err = m.buildExec(ctx, c, id, []string{"mkdir", "-p", "--", s.Config.WorkDir}, nil, "/", "", nil)
	}
	if err != nil {
		be := &BuildError{Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text, err: atLine(s.Line, stepErr(s.Kind, err))}
		if xe, ok := errors.AsType[*exitError](err); ok {
			be.ExitCode = &xe.code
		}
		return be
	}
	return nil
}

// BuildError is a build that failed in what the tenant gave: a step (Step
// > 0: which, and for a RUN its exit code), its FROM, its start command or
// ready check, or a runtime that cannot save templates. Its text names
// only the tenant's own Dockerfile, context paths and build output, so
// the API shows it. It is an ErrFailedPrecondition unless its error is
// categorized otherwise (a COPY source that vanished: ErrInvalid).
type BuildError struct {
	Step, Steps, Line int
	Text              string
	ExitCode          *int
	err               error
}

func (e *BuildError) Error() string { return e.err.Error() }

func (e *BuildError) Unwrap() []error {
	if errdefs.Category(e.err) != "internal" {
		return []error{e.err}
	}
	return []error{e.err, errdefs.ErrFailedPrecondition}
}

// atLine prefixes err with the Dockerfile line it is about, unless it
// names its line already.
func atLine(line int, err error) error {
	if _, ok := errors.AsType[*dockerfile.LineError](err); ok {
		return err
	}
	return &dockerfile.LineError{Line: line, Msg: err.Error(), Kind: err}
}

// stepErr says which instruction failed, unless err names its line (the
// context's errors do, and say what they are about).
func stepErr(kind string, err error) error {
	if _, ok := errors.AsType[*dockerfile.LineError](err); ok {
		return err
	}
	return fmt.Errorf("%s: %w", kind, err)
}

// exitError is a RUN (or ready check) that exited non-zero.
type exitError struct {
	code int
	tail string
}

func (e *exitError) Error() string {
	s := fmt.Sprintf("exit code %d", e.code)
	if e.tail != "" {
		s += "; its last output:\n" + e.tail
	}
	return s
}

// outputTail keeps the last bytes of a step's output.
const outputTail = 4 << 10

// tailWriter keeps the last outputTail bytes written to it and hands each
// write to out (if set).
type tailWriter struct {
	tail []byte
	out  func([]byte)
}

func (w *tailWriter) Write(b []byte) (int, error) {
	w.tail = append(w.tail, b...)
	if len(w.tail) > outputTail {
		w.tail = w.tail[len(w.tail)-outputTail:]
	}
	if w.out != nil {
		w.out(b)
	}
	return len(b), nil
}

// buildExec runs argv in the builder and waits for it; a non-zero exit is
// an *exitError with the output's tail. out, if set, gets the output.
func (m *Manager) buildExec(ctx context.Context, c Caller, id string, argv []string, env map[string]string, cwd, user string, out func([]byte)) error {
	st, err := m.Exec(ctx, c, id, guest.ExecSpec{Argv: argv, Env: env, Cwd: cwd, User: user}, true)
	if err != nil {
		return err
	}
	defer st.Close()
	w := &tailWriter{out: out}
	x, err := guest.Drain(st, w, w)
	if errors.Is(err, io.EOF) {
		return errors.New("the command's stream ended without an exit")
	}
	if err != nil {
		return err
	}
	if x.Code != 0 {
		code := x.Code
		if x.Signal != 0 {
			code = 128 + x.Signal
		}
		return &exitError{code: code, tail: string(w.tail)}
	}
	return nil
}

func envMap(kv []string) map[string]string {
	m := make(map[string]string, len(kv))
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return m
}

func (m *Manager) buildRun(ctx context.Context, c Caller, id string, s dockerfile.Step, ev BuildEvent, progress func(BuildEvent)) error {
	ev.Kind = "output"
	err := m.buildExec(ctx, c, id, s.Argv, envMap(s.Env), cmp.Or(s.Config.WorkDir, "/"), s.Config.User, func(b []byte) {
		ev.Output = string(b)
		progress(ev)
	})
	return err
}

func (m *Manager) buildCopy(ctx context.Context, c Caller, id string, bctx *dockerfile.Context, s dockerfile.Step) error {
	// The tar goes through a file: its directory is known once it is
	// written, and a context read error never leaves half an archive in
	// the guest.
	f, err := os.CreateTemp(m.L.Root, ".build-copy-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		f.Close()
		_ = os.Remove(f.Name())
	}()
	dir, top, err := bctx.CopyTar(s, f)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := m.buildExec(ctx, c, id, []string{"mkdir", "-p", "--", dir}, nil, "/", "", nil); err != nil {
		return err
	}
	if _, err := m.WriteArchive(ctx, c, id, dir, f); err != nil {
		return err
	}
	if s.Chown != "" && len(top) > 0 {
		if err := m.buildExec(ctx, c, id, append([]string{"chown", "-R", "--", s.Chown}, top...), nil, "/", "", nil); err != nil {
			return fmt.Errorf("--chown=%s: %w", s.Chown, err)
		}
	}
	return nil
}

// The start command runs in a session of its own (setsid, started in the
// background, is not a group leader, so it keeps the pid $! names), its
// session id kept in startPID for a template built FROM this one to stop
// it; stopStartScript ends that session, TERM then, after 5 s, KILL.
const (
	startPID        = "/tmp/airlock-start.pid"
	startScript     = `setsid /bin/sh -c "$0" >>/tmp/airlock-start.log 2>&1 </dev/null & echo $! >` + startPID
	stopStartScript = `p=$(cat ` + startPID + ` 2>/dev/null) || exit 0
kill -TERM -"$p" 2>/dev/null
i=0
while kill -0 -"$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
kill -KILL -"$p" 2>/dev/null
rm -f ` + startPID + `
exit 0`
)

// startApp starts the template's command in the background and waits for
// its ready check.
func (m *Manager) startApp(ctx context.Context, c Caller, id string, cfg TemplateConfig, timeout time.Duration, progress func(BuildEvent)) error {
	if cfg.Start == "" {
		return nil
	}
	env := envMap(cfg.Env)
	cwd := cmp.Or(cfg.WorkDir, "/")
	progress(BuildEvent{Kind: "status", Message: "starting: " + cfg.Start})
	// Its own session, detached from the exec, output to a log file: the
	// exec returns at once and the process lives on in the guest (and in
	// the snapshot's memory).
	if err := m.buildExec(ctx, c, id, []string{"/bin/sh", "-c", startScript, cfg.Start}, env, cwd, cfg.User, nil); err != nil {
		return fmt.Errorf("%w: start command: %v", errdefs.ErrFailedPrecondition, err)
	}
	if cfg.Ready == "" {
		return nil
	}
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	progress(BuildEvent{Kind: "status", Message: "waiting for the ready check: " + cfg.Ready})
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		err := m.buildExec(ctx, c, id, []string{"/bin/sh", "-c", cfg.Ready}, env, cwd, cfg.User, nil)
		if err == nil {
			return nil
		}
		if _, ok := errors.AsType[*exitError](err); !ok {
			return err
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	var log []byte
	_ = m.buildExec(ctx, c, id, []string{"tail", "-c", "2048", "/tmp/airlock-start.log"}, nil, "/", "", func(b []byte) { log = append(log, b...) })
	return fmt.Errorf("%w: the ready check did not pass within %s (last: %v); the start command's output (/tmp/airlock-start.log) ends:\n%s",
		errdefs.ErrFailedPrecondition, timeout, last, log)
}

// shellJoin quotes argv as one shell command line.
func shellJoin(argv []string) string {
	if len(argv) == 3 && argv[0] == "/bin/sh" && argv[1] == "-c" {
		return argv[2]
	}
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// dropTemplateSnapshot removes a template's old snapshot once no template
// uses it; sandboxes still running from it keep it (removeSnapshot
// refuses), and PruneTemplates takes it later.
func (m *Manager) dropTemplateSnapshot(ctx context.Context, tenant, name string) {
	if used, err := m.Store.TemplateUsesSnapshot(ctx, tenant, name); err != nil || used {
		return
	}
	if err := m.removeSnapshot(ctx, tenant, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log().Info("old template snapshot kept", "snapshot", name, "why", err)
	}
}

func viewTemplate(t store.Template) Template {
	out := Template{Template: t}
	_ = json.Unmarshal(t.Config, &out.TemplateConfig)
	return out
}

// ListTemplates returns the templates of c's tenant, or with all (admins
// only) every tenant's.
func (m *Manager) ListTemplates(ctx context.Context, c Caller, all bool) ([]Template, error) {
	ts, err := m.Store.ListTemplates(ctx, c.Tenant, all && c.Admin)
	if err != nil {
		return nil, err
	}
	out := make([]Template, 0, len(ts))
	for _, t := range ts {
		out = append(out, viewTemplate(t))
	}
	return out, nil
}

// GetTemplate returns c's tenant's template name (ErrNotFound if none).
func (m *Manager) GetTemplate(ctx context.Context, c Caller, name string) (Template, error) {
	t, err := m.Store.GetTemplate(ctx, c.Tenant, name)
	if err != nil {
		return Template{}, err
	}
	return viewTemplate(t), nil
}

// RemoveTemplate removes c's tenant's template name and, unless sandboxes
// still run from it, its snapshot; audited as template.delete. Its build
// cache stays (PruneTemplates).
func (m *Manager) RemoveTemplate(ctx context.Context, c Caller, name string) error {
	t, err := m.Store.DeleteTemplate(ctx, c.Tenant, name)
	if err != nil {
		return err
	}
	if t.Snapshot != "" {
		m.dropTemplateSnapshot(ctx, c.Tenant, t.Snapshot)
	}
	_ = os.Remove(m.buildLogPath(c.Tenant, name))
	m.audit(ctx, c, "", "template.delete", map[string]any{"name": name})
	return nil
}

// PruneTemplateCache removes the saved build steps of c's tenant and the
// snapshots of replaced templates that nothing uses any more; it returns
// how many it removed.
func (m *Manager) PruneTemplateCache(ctx context.Context, c Caller) (int, error) {
	n := 0
	// A saved step backs the disks of the steps after it: each pass
	// removes what nothing holds any more, until a pass removes nothing.
	for removed := true; removed; {
		removed = false
		sns, err := m.Store.ListSnapshots(ctx, c.Tenant, false)
		if err != nil {
			return n, err
		}
		for _, sn := range sns {
			switch {
			case strings.HasPrefix(sn.Name, buildPrefix):
			case strings.HasPrefix(sn.Name, tplPrefix):
				if used, err := m.Store.TemplateUsesSnapshot(ctx, c.Tenant, sn.Name); err != nil || used {
					continue
				}
			default:
				continue
			}
			if err := m.removeSnapshot(ctx, c.Tenant, sn.Name); err == nil {
				n++
				removed = true
			}
		}
	}
	layers, err := m.pruneLayers(c.Tenant)
	n += layers
	if err != nil {
		return n, err
	}
	m.audit(ctx, c, "", "template.prune", map[string]any{"removed": n})
	return n, nil
}

// createFromTemplate starts a sandbox of template t: a clone of its
// snapshot, with its ENV as the default environment (under o.Env), its
// WORKDIR and USER as exec defaults, and o's network policy if o names
// one (set live once it runs).
func (m *Manager) createFromTemplate(ctx context.Context, c Caller, t store.Template, o CreateOptions) (store.Sandbox, error) {
	if t.Runtime == "gvisor" {
		return m.createFromImageTemplate(ctx, c, t, o)
	}
	sn, err := m.Store.GetSnapshot(ctx, c.Tenant, t.Snapshot)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("template %q: %w", t.Name, err)
	}
	if sizeDiffers(o, sn) {
		return store.Sandbox{}, fmt.Errorf("%w: a sandbox of template %q has its size (%d cpus, %d MiB memory, %d MiB disk); rebuild it with another size", errdefs.ErrInvalid, t.Name, sn.CPUs, sn.MemoryMiB, sn.DiskMiB)
	}
	if len(o.Secrets) > 0 || len(o.Network.Secrets) > 0 || len(o.Volumes) > 0 || len(o.HostMounts) > 0 || len(o.Network.Ports) > 0 {
		return store.Sandbox{}, fmt.Errorf("%w: a sandbox of a template cannot have secrets, volumes, host mounts or published ports yet (it is a clone of the template's saved state)", errdefs.ErrInvalid)
	}
	cfg := viewTemplate(t).TemplateConfig
	env := envMap(cfg.Env)
	for k, v := range o.Env {
		env[k] = v
	}
	sn.Env = env
	sn.ExecDefaults = store.ExecDefaults{Cwd: cfg.WorkDir, User: cfg.User}
	sn.Image = t.Name
	sb, err := m.createFromSnapshot(ctx, c, sn, "template:"+t.Name, CreateOptions{Timeout: o.Timeout, Metadata: o.Metadata, IdlePause: o.IdlePause})
	if err != nil {
		return sb, err
	}
	if o.Network.Mode != "" || len(o.Network.Allow) > 0 {
		if _, err := m.SetNetwork(ctx, c, sb.ID, EgressPolicy{Mode: o.Network.Mode, Allow: o.Network.Allow}); err != nil {
			_ = m.Remove(context.WithoutCancel(ctx), c, sb.ID)
			return store.Sandbox{}, err
		}
		return m.get(ctx, sb.ID)
	}
	return sb, nil
}

// Limits of an uploaded build context.
const (
	MaxBuildContextBytes   = 2 << 30
	MaxBuildContextEntries = 200_000
	// DockerfileEntry is where a client puts a Dockerfile that is not in
	// its context: BuildTemplateFromTar reads it and takes it out.
	DockerfileEntry = ".airlock-dockerfile"
)

// BuildTemplateFromTar is BuildTemplate of a context uploaded as a tar
// stream (at most MaxBuildContextBytes of files, MaxBuildContextEntries
// entries), extracted into a private directory of the state dir and
// removed after the build. The Dockerfile is at dockerfile in it
// (default "Dockerfile"), or at DockerfileEntry if that is there.
func (m *Manager) BuildTemplateFromTar(ctx context.Context, c Caller, o BuildOptions, r io.Reader, dockerfile string) (Template, error) {
	dir, err := os.MkdirTemp(m.L.Root, ".build-ctx-")
	if err != nil {
		return Template{}, err
	}
	defer os.RemoveAll(dir)
	if _, err := archive.Extract(ctx, r, dir, archive.ExtractOptions{Limits: archive.Limits{MaxBytes: MaxBuildContextBytes, MaxEntries: MaxBuildContextEntries}}); err != nil {
		switch {
		case errors.Is(err, archive.ErrInvalid) || errors.Is(err, io.ErrUnexpectedEOF):
			return Template{}, fmt.Errorf("%w: the build context is not a whole, valid tar stream (%v)", errdefs.ErrInvalid, err)
		case errors.Is(err, archive.ErrLimit):
			return Template{}, fmt.Errorf("%w: build context: %v (at most %d MiB of files, %d entries)", errdefs.ErrResourceExhausted, err, MaxBuildContextBytes>>20, MaxBuildContextEntries)
		}
		return Template{}, fmt.Errorf("build context: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Template{}, err
	}
	defer root.Close()
	name := cmp.Or(dockerfile, "Dockerfile")
	if _, err := root.Lstat(DockerfileEntry); err == nil {
		name = DockerfileEntry
	}
	df, err := readSmall(root, name, 1<<20)
	if err != nil {
		return Template{}, fmt.Errorf("%w: the Dockerfile %q: %v", errdefs.ErrInvalid, name, err)
	}
	if name == DockerfileEntry {
		_ = root.Remove(DockerfileEntry)
	}
	o.Dockerfile, o.Context = df, dir
	return m.BuildTemplate(ctx, c, o)
}

// readSmall reads a regular file of root, at most max bytes.
func readSmall(root *os.Root, name string, max int64) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("larger than %d bytes", max)
	}
	return b, err
}

// MaxBuildLog caps a kept build log; output beyond it is left out, with
// a line saying so.
const MaxBuildLog = 4 << 20

// buildLog writes a build's progress as text to its log file. A log that
// cannot be written costs the build nothing.
type buildLog struct {
	f       *os.File
	n       int64
	cut     bool
	started time.Time
}

// buildLogPath is where tenant's last build of name keeps its log: a
// directory per tenant named by a digest of the tenant (tenant names are
// not path-safe by contract), the file by the template name (valid names
// are).
func (m *Manager) buildLogPath(tenant, name string) string {
	return filepath.Join(m.L.Root, "template-logs", tenantKey(tenant), name+".log")
}

func (m *Manager) openBuildLog(tenant, name string) *buildLog {
	p := m.buildLogPath(tenant, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return &buildLog{started: time.Now()}
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return &buildLog{started: time.Now()}
	}
	return &buildLog{f: f, started: time.Now()}
}

func (l *buildLog) write(s string) {
	if l.f == nil || l.cut {
		return
	}
	if l.n+int64(len(s)) > MaxBuildLog {
		l.cut = true
		s = "\n[airlock: the build log is cut here: more than 4 MiB]\n"
	}
	n, _ := l.f.WriteString(s)
	l.n += int64(n)
}

func (l *buildLog) event(ev BuildEvent) {
	switch ev.Kind {
	case "step", "cached", "config":
		suffix := ""
		if ev.Kind != "step" {
			suffix = " (" + ev.Kind + ")"
		}
		l.write(fmt.Sprintf("step %d/%d: %s%s\n", ev.Step, ev.Steps, ev.Text, suffix))
	case "output":
		l.write(ev.Output)
	case "done":
		l.write(fmt.Sprintf("  done in %s\n", time.Duration(ev.ElapsedMS)*time.Millisecond))
	case "status":
		l.write(ev.Message + "\n")
	case "built":
		l.write(fmt.Sprintf("built in %s\n", time.Duration(ev.ElapsedMS)*time.Millisecond))
	}
}

// finish writes how the build ended and closes the log.
func (l *buildLog) finish(err error) {
	if err != nil {
		l.cut = false
		l.write(fmt.Sprintf("failed after %s: %v\n", time.Since(l.started).Round(time.Millisecond), err))
	}
	if l.f != nil {
		_ = l.f.Close()
	}
}

// TemplateLog writes the log of c's tenant's last build of name (kept
// whether it succeeded or failed) to w; ErrNotFound if there is none.
func (m *Manager) TemplateLog(ctx context.Context, c Caller, name string, w io.Writer) error {
	if err := ValidTemplateName(name); err != nil {
		return err
	}
	f, err := os.Open(m.buildLogPath(c.Tenant, name))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: no build log of template %q", errdefs.ErrNotFound, name)
		}
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, io.LimitReader(f, MaxBuildLog+4096))
	return err
}
