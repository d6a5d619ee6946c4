package dockerfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// MaxDockerfileBytes caps the Dockerfile Parse reads.
const MaxDockerfileBytes = 1 << 20

// Limits on what a Dockerfile may make Parse build, so that a small hostile
// file cannot make it use much memory or time: every step keeps a copy of
// the configuration, and $VAR expansion could double a value per line.
const (
	// MaxSteps caps the instructions after FROM.
	MaxSteps = 1000
	// maxConfigEntries caps ENV variables, labels, ARGs in scope and
	// exposed ports together.
	maxConfigEntries = 2048
	// maxConfigBytes caps the bytes of ENV, labels and ARGs in scope.
	maxConfigBytes = 256 << 10
	// maxExpandBytes caps the worst case of one word's expansion (its
	// length plus, per "$", the longest value in scope), checked before
	// expanding it.
	maxExpandBytes = 16 << 20
	// maxTextBytes caps Step.Text.
	maxTextBytes = 200
)

// supportedList names the instructions Parse accepts, for its refusals.
const supportedList = "FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, EXPOSE, CMD, ENTRYPOINT, LABEL, MAINTAINER"

// shellPrefix runs the shell form of RUN, CMD and ENTRYPOINT.
var shellPrefix = []string{"/bin/sh", "-c"}

// Config is the image configuration the Dockerfile leaves, step by step.
type Config struct {
	Env          []string          // "K=V", in order of definition; a redefinition replaces in place
	WorkDir      string            // absolute; "" means /
	User         string            // as written after expansion ("app", "1000:1000"); "" means root
	Cmd          []string          // exec form; shell form is ["/bin/sh", "-c", s]
	Entrypoint   []string          // same
	ExposedPorts []string          // "8000/tcp", "53/udp", sorted by port then protocol, unique
	Labels       map[string]string // nil when there are none
}

// clone returns a deep copy of c, so that steps share nothing.
func (c Config) clone() Config {
	c.Env = slices.Clone(c.Env)
	c.Cmd = slices.Clone(c.Cmd)
	c.Entrypoint = slices.Clone(c.Entrypoint)
	c.ExposedPorts = slices.Clone(c.ExposedPorts)
	c.Labels = maps.Clone(c.Labels)
	return c
}

// setEnv defines k=v, replacing an earlier definition of k in place.
func (c *Config) setEnv(k, v string) {
	for i, kv := range c.Env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			c.Env[i] = k + "=" + v
			return
		}
	}
	c.Env = append(c.Env, k+"="+v)
}

// Step is one instruction after FROM, expanded.
type Step struct {
	Line int    // 1-based line of the instruction in the Dockerfile
	Text string // the instruction as written, on one line (for progress output), at most 200 bytes
	Kind string // "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "LABEL"
	// Changes says the step changes the filesystem (RUN, COPY, ADD, WORKDIR): the builder
	// runs it in a sandbox and saves the result; other steps only change Config.
	Changes bool
	// RUN: the argv to exec (shell form: ["/bin/sh", "-c", cmd]) and its environment: Config.Env
	// (as of this step) plus the ARGs in scope that ENV does not override, "K=V", sorted by K.
	Argv []string
	Env  []string
	// COPY and ADD: the sources as context-relative slash paths after expansion (wildcards
	// kept, matched by CopyTar; "." is the context itself), the destination as an absolute
	// guest path (a relative dest is resolved against WorkDir; a trailing "/" is kept: it
	// means a directory), --chown and --chmod as written (expanded), "" when absent.
	Sources []string
	Dest    string
	Chown   string
	Chmod   string
	// Config is the configuration after this step (for RUN/COPY/ADD/WORKDIR: the one they ran under).
	Config Config
	// Key is the step's cache key, "sha256:<hex>", set by Plan.Keys: a hash of the previous
	// step's Key (the first step: the base Keys is given), the Kind, the expanded instruction
	// (argv, env, sources, dest, the Config it leaves, the ARGs in scope) and, for COPY/ADD,
	// the digest of the content CopyTar would send (names, modes, sizes, file bytes and link
	// targets; not mtimes). Two builds of unchanged inputs give equal keys; any change to a
	// step's inputs changes its key and every later key.
	Key string

	// args are the ARGs in scope after the step, "K=V" sorted (part of Key).
	args []string
}

// Plan is a parsed Dockerfile.
type Plan struct {
	From     string // the FROM image as written after ARG expansion (an airlock image name, a template name or an OCI reference)
	FromLine int
	Steps    []Step
	Config   Config // the final configuration (Steps[len-1].Config, or the zero Config)
	// UnusedArgs are the build args that no ARG declares, sorted: they
	// are ignored (docker warns about them).
	UnusedArgs []string
}

// arg is a declared ARG; a nil value means declared without one (unset).
type arg struct {
	key   string
	value *string
}

// planner carries the state of one Parse.
type planner struct {
	lex       *shell.Lex
	buildArgs map[string]string
	declared  map[string]bool // build args some ARG declares
	meta      []arg           // ARGs before FROM
	args      []arg           // ARGs in scope after FROM
	fromSeen  bool
	cfg       Config
	plan      Plan
}

// Parse reads a Dockerfile (at most MaxDockerfileBytes) with build args
// (from --build-arg): they override ARG defaults; those that no ARG
// declares are ignored and listed in Plan.UnusedArgs. Errors wrap
// errdefs.ErrInvalid (errdefs.ErrResourceExhausted beyond MaxSteps
// instructions, 2048 variables, labels and ports, or 256 KiB of them) and
// name the line: "Dockerfile:7: HEALTHCHECK is not
// supported (supported: ...)". Refused: an empty Dockerfile or one whose
// first instruction is not FROM (ARGs may precede it, usable only in FROM
// unless redeclared after it), a second FROM, FROM --platform, COPY --from
// (and --parents, --exclude), RUN --mount/--network/--security/--device,
// ADD of a URL or git source (and --checksum, --keep-git-dir, --unpack,
// --exclude), heredocs, ONBUILD, HEALTHCHECK, SHELL, STOPSIGNAL, VOLUME, a
// non-octal --chmod, a COPY/ADD source outside the context, and whatever
// buildkit's parser refuses. MAINTAINER is accepted as LABEL maintainer,
// as docker does. Keys are left empty: Plan.Keys fills them in.
func Parse(r io.Reader, buildArgs map[string]string) (*Plan, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxDockerfileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read Dockerfile: %w", err)
	}
	if len(data) > MaxDockerfileBytes {
		return nil, invalid(0, "larger than %d bytes", MaxDockerfileBytes)
	}
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		if len(bytes.TrimSpace(data)) == 0 || strings.Contains(err.Error(), "no instructions") {
			return nil, invalid(0, "empty Dockerfile (no instructions)")
		}
		return nil, invalid(errLine(err), "%v", err)
	}
	p := &planner{
		lex:       shell.NewLex(res.EscapeToken),
		buildArgs: buildArgs,
		declared:  map[string]bool{},
	}
	for _, n := range res.AST.Children {
		if err := p.node(n); err != nil {
			return nil, err
		}
	}
	if !p.fromSeen {
		return nil, invalid(0, "no FROM instruction")
	}
	for k := range buildArgs {
		if !p.declared[k] {
			p.plan.UnusedArgs = append(p.plan.UnusedArgs, k)
		}
	}
	slices.Sort(p.plan.UnusedArgs)
	if n := len(p.plan.Steps); n > 0 {
		p.plan.Config = p.plan.Steps[n-1].Config.clone()
	}
	return &p.plan, nil
}

// errLine is the first line buildkit's error names, or 0.
func errLine(err error) int {
	var le *parser.LocationError
	if errors.As(err, &le) {
		for _, rs := range le.Locations {
			for _, r := range rs {
				if r.Start.Line > 0 {
					return r.Start.Line
				}
			}
		}
	}
	return 0
}

// node handles one instruction.
func (p *planner) node(n *parser.Node) error {
	line := n.StartLine
	name := strings.ToUpper(n.Value)
	switch name {
	case "FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "LABEL", "MAINTAINER":
	case "ONBUILD", "HEALTHCHECK", "SHELL", "STOPSIGNAL", "VOLUME":
		return invalid(line, "%s is not supported (supported: %s)", name, supportedList)
	default:
		return invalid(line, "unknown instruction %s (supported: %s)", name, supportedList)
	}
	parsed, err := instructions.ParseInstruction(n)
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(strings.ToUpper(msg), name+" ") {
			msg = name + ": " + msg
		}
		return invalid(line, "%s", msg)
	}
	if stage, ok := parsed.(*instructions.Stage); ok {
		return p.from(line, stage)
	}
	if !p.fromSeen {
		if a, ok := parsed.(*instructions.ArgCommand); ok {
			return p.metaArg(line, a)
		}
		return invalid(line, "%s before FROM: a Dockerfile starts with FROM (only ARG may precede it)", name)
	}
	if len(p.plan.Steps) >= MaxSteps {
		return exhausted(line, "more than %d instructions after FROM", MaxSteps)
	}
	s := Step{Line: line, Text: oneLine(n.Original), Kind: name}
	if err := p.command(&s, parsed); err != nil {
		return err
	}
	if err := p.checkSize(line); err != nil {
		return err
	}
	s.Config = p.cfg.clone()
	s.args = p.argsInScope()
	p.plan.Steps = append(p.plan.Steps, s)
	return nil
}

// from handles FROM.
func (p *planner) from(line int, stage *instructions.Stage) error {
	if p.fromSeen {
		return invalid(line, "a second FROM: multi-stage builds are not supported yet")
	}
	if stage.Platform != "" {
		return invalid(line, "FROM --platform is not supported")
	}
	meta := vars{}
	for _, a := range p.meta {
		if a.value != nil {
			meta[a.key] = *a.value
		}
	}
	from, err := p.expander(meta)(stage.BaseName)
	if err != nil {
		return invalid(line, "FROM: %v", err)
	}
	if from == "" {
		return invalid(line, "FROM names no image (%q expands to nothing)", stage.BaseName)
	}
	p.fromSeen = true
	p.plan.From, p.plan.FromLine = from, line
	return nil
}

// metaArg handles an ARG before FROM: its values are usable in FROM.
func (p *planner) metaArg(line int, c *instructions.ArgCommand) error {
	scope := vars{}
	for _, a := range p.meta {
		if a.value != nil {
			scope[a.key] = *a.value
		}
	}
	if err := c.Expand(p.expander(scope)); err != nil {
		return invalid(line, "ARG: %v", err)
	}
	for _, kv := range c.Args {
		p.meta = setArg(p.meta, p.resolveArg(kv, nil))
	}
	size := 0
	for _, a := range p.meta {
		if a.value != nil {
			size += len(*a.value)
		}
	}
	if len(p.meta) > maxConfigEntries || size > maxConfigBytes {
		return exhausted(line, "the ARGs before FROM grow beyond %d variables or %d bytes", maxConfigEntries, maxConfigBytes)
	}
	return nil
}

// resolveArg gives a declared ARG its value: the build arg, else its
// default, else (after FROM) the value of the ARG of that name before FROM.
func (p *planner) resolveArg(kv instructions.KeyValuePairOptional, meta []arg) arg {
	p.declared[kv.Key] = true
	if v, ok := p.buildArgs[kv.Key]; ok {
		return arg{key: kv.Key, value: &v}
	}
	if kv.Value != nil {
		v := *kv.Value
		return arg{key: kv.Key, value: &v}
	}
	for _, m := range meta {
		if m.key == kv.Key {
			return m
		}
	}
	return arg{key: kv.Key}
}

// setArg declares a in args, replacing an earlier declaration in place.
func setArg(args []arg, a arg) []arg {
	for i := range args {
		if args[i].key == a.key {
			args[i] = a
			return args
		}
	}
	return append(args, a)
}

// scope is what $VAR expands to after FROM: the ARGs in scope with a
// value, overridden by ENV.
func (p *planner) scope() vars {
	v := vars{}
	for _, a := range p.args {
		if a.value != nil {
			v[a.key] = *a.value
		}
	}
	for _, kv := range p.cfg.Env {
		k, val, _ := strings.Cut(kv, "=")
		v[k] = val
	}
	return v
}

// argsInScope lists the ARGs in scope with a value, "K=V" sorted.
func (p *planner) argsInScope() []string {
	var out []string
	for _, a := range p.args {
		if a.value != nil {
			out = append(out, a.key+"="+*a.value)
		}
	}
	slices.Sort(out)
	return out
}

// runEnv is RUN's environment: Config.Env plus the ARGs in scope that ENV
// does not override, sorted by name.
func (p *planner) runEnv() []string {
	v := p.scope()
	out := make([]string, 0, len(v))
	for _, k := range slices.Sorted(maps.Keys(v)) {
		out = append(out, k+"="+v[k])
	}
	return out
}

// expander expands words against scope, refusing a word whose expansion
// could be too large before it is expanded.
func (p *planner) expander(scope vars) instructions.SingleWordExpander {
	return func(word string) (string, error) {
		if err := checkExpansion(word, scope); err != nil {
			return "", err
		}
		s, _, err := p.lex.ProcessWord(word, scope)
		if err == nil && len(s) > maxConfigBytes {
			err = fmt.Errorf("a word expands to more than %d bytes", maxConfigBytes)
		}
		return s, err
	}
}

// checkExpansion refuses a word whose expansion could exceed
// maxExpandBytes.
func checkExpansion(word string, scope vars) error {
	longest := 0
	for _, v := range scope {
		longest = max(longest, len(v))
	}
	if int64(len(word))+int64(strings.Count(word, "$"))*int64(longest) > maxExpandBytes {
		return fmt.Errorf("a word could expand to more than %d bytes", maxExpandBytes)
	}
	return nil
}

// checkSize refuses a configuration (with the ARGs in scope) beyond
// maxConfigEntries or maxConfigBytes.
func (p *planner) checkSize(line int) error {
	entries := len(p.cfg.Env) + len(p.cfg.Labels) + len(p.args) + len(p.cfg.ExposedPorts)
	size := 0
	for _, kv := range p.cfg.Env {
		size += len(kv)
	}
	for k, v := range p.cfg.Labels {
		size += len(k) + len(v)
	}
	for _, a := range p.args {
		size += len(a.key)
		if a.value != nil {
			size += len(*a.value)
		}
	}
	if entries > maxConfigEntries || size > maxConfigBytes {
		return exhausted(line, "the configuration grows beyond %d variables, labels and ports or %d bytes", maxConfigEntries, maxConfigBytes)
	}
	return nil
}

// command fills in s from one instruction after FROM and applies it to
// the configuration.
func (p *planner) command(s *Step, parsed any) error {
	line := s.Line
	expand := p.expander(p.scope())
	switch c := parsed.(type) {
	case *instructions.ArgCommand:
		if err := c.Expand(expand); err != nil {
			return invalid(line, "ARG: %v", err)
		}
		for _, kv := range c.Args {
			p.args = setArg(p.args, p.resolveArg(kv, p.meta))
		}
	case *instructions.EnvCommand:
		if err := c.Expand(expand); err != nil {
			return invalid(line, "ENV: %v", err)
		}
		for _, kv := range c.Env {
			if kv.Key == "" || strings.ContainsAny(kv.Key, "=\x00") {
				return invalid(line, "ENV: bad variable name %q", kv.Key)
			}
			p.cfg.setEnv(kv.Key, kv.Value)
		}
	case *instructions.LabelCommand:
		if err := c.Expand(expand); err != nil {
			return invalid(line, "LABEL: %v", err)
		}
		for _, kv := range c.Labels {
			p.setLabel(kv.Key, kv.Value)
		}
	case *instructions.MaintainerCommand:
		s.Kind = "LABEL"
		p.setLabel("maintainer", c.Maintainer)
	case *instructions.WorkdirCommand:
		if err := c.Expand(expand); err != nil {
			return invalid(line, "WORKDIR: %v", err)
		}
		if c.Path == "" {
			return invalid(line, "WORKDIR expands to an empty path")
		}
		if path.IsAbs(c.Path) {
			p.cfg.WorkDir = path.Clean(c.Path)
		} else {
			p.cfg.WorkDir = path.Join(orRoot(p.cfg.WorkDir), c.Path)
		}
		s.Changes = true
	case *instructions.UserCommand:
		if err := c.Expand(expand); err != nil {
			return invalid(line, "USER: %v", err)
		}
		p.cfg.User = c.User
	case *instructions.ExposeCommand:
		ports, err := p.expose(c.Ports)
		if err != nil {
			return invalid(line, "EXPOSE: %v", err)
		}
		p.cfg.ExposedPorts = ports
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			return invalid(line, "RUN --%s is not supported", c.FlagsUsed[0])
		}
		argv, err := commandLine("RUN", c.ShellDependantCmdLine)
		if err != nil {
			return invalid(line, "%v", err)
		}
		if len(argv) == 0 {
			return invalid(line, "RUN names no command")
		}
		s.Argv, s.Env, s.Changes = argv, p.runEnv(), true
	case *instructions.CmdCommand:
		argv, err := commandLine("CMD", c.ShellDependantCmdLine)
		if err != nil {
			return invalid(line, "%v", err)
		}
		p.cfg.Cmd = argv
	case *instructions.EntrypointCommand:
		argv, err := commandLine("ENTRYPOINT", c.ShellDependantCmdLine)
		if err != nil {
			return invalid(line, "%v", err)
		}
		p.cfg.Entrypoint = argv
	case *instructions.CopyCommand:
		switch {
		case c.From != "":
			return invalid(line, "COPY --from is not supported (multi-stage builds are not supported yet)")
		case c.Parents:
			return invalid(line, "COPY --parents is not supported")
		case len(c.ExcludePatterns) > 0:
			return invalid(line, "COPY --exclude is not supported: use .dockerignore")
		}
		if err := c.Expand(expand); err != nil {
			return invalid(line, "COPY: %v", err)
		}
		return p.copyStep(s, c.SourcesAndDest, c.Chown, c.Chmod)
	case *instructions.AddCommand:
		switch {
		case c.Checksum != "":
			return invalid(line, "ADD --checksum is not supported")
		case c.KeepGitDir != nil:
			return invalid(line, "ADD --keep-git-dir is not supported")
		case c.Unpack != nil:
			return invalid(line, "ADD --unpack is not supported")
		case len(c.ExcludePatterns) > 0:
			return invalid(line, "ADD --exclude is not supported: use .dockerignore")
		}
		if err := c.Expand(expand); err != nil {
			return invalid(line, "ADD: %v", err)
		}
		for _, src := range c.SourcePaths {
			if remoteSource(src) {
				return invalid(line, "ADD of a URL is not supported: use RUN curl or COPY (source %q)", src)
			}
		}
		return p.copyStep(s, c.SourcesAndDest, c.Chown, c.Chmod)
	default:
		return invalid(line, "%s is not supported (supported: %s)", s.Kind, supportedList)
	}
	return nil
}

// setLabel sets one label.
func (p *planner) setLabel(k, v string) {
	if p.cfg.Labels == nil {
		p.cfg.Labels = map[string]string{}
	}
	p.cfg.Labels[k] = v
}

// commandLine is the argv of RUN, CMD or ENTRYPOINT: the exec form as
// written, the shell form under /bin/sh -c. Heredocs are refused.
func commandLine(kind string, c instructions.ShellDependantCmdLine) ([]string, error) {
	if len(c.Files) > 0 {
		return nil, fmt.Errorf("%s with a heredoc is not supported", kind)
	}
	if len(c.CmdLine) == 0 {
		return nil, nil
	}
	if c.PrependShell {
		return append(slices.Clone(shellPrefix), strings.Join(c.CmdLine, " ")), nil
	}
	return slices.Clone(c.CmdLine), nil
}

// copyStep fills in a COPY or ADD step.
func (p *planner) copyStep(s *Step, sd instructions.SourcesAndDest, chown, chmod string) error {
	if len(sd.SourceContents) > 0 {
		return invalid(s.Line, "%s with a heredoc is not supported", s.Kind)
	}
	if len(sd.SourcePaths) == 0 {
		return invalid(s.Line, "%s names no source", s.Kind)
	}
	for _, src := range sd.SourcePaths {
		clean, err := cleanSource(src)
		if err != nil {
			return invalid(s.Line, "%s: %v", s.Kind, err)
		}
		s.Sources = append(s.Sources, clean)
	}
	if chmod != "" {
		if _, err := parseChmod(chmod); err != nil {
			return invalid(s.Line, "%s: %v", s.Kind, err)
		}
	}
	s.Dest = resolveDest(p.cfg.WorkDir, sd.DestPath)
	s.Chown, s.Chmod, s.Changes = chown, chmod, true
	return nil
}

// cleanSource turns a COPY/ADD source into a clean context-relative slash
// path ("." for the context itself). An absolute source is relative to the
// context, as in docker; one that leaves the context is refused.
func cleanSource(src string) (string, error) {
	if src == "" {
		return "", errors.New("empty source")
	}
	rel := path.Clean(strings.TrimLeft(src, "/"))
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("source %q is outside the build context", src)
	}
	return rel, nil
}

// parseChmod parses an octal --chmod.
func parseChmod(s string) (int64, error) {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, fmt.Errorf("--chmod=%s: only octal modes up to 7777 are supported", s)
	}
	return int64(v), nil
}

// resolveDest makes a COPY/ADD destination absolute against workDir,
// keeping (or adding, for "." and "") the trailing "/" that makes it a
// directory.
func resolveDest(workDir, dest string) string {
	dir := dest == "" || dest == "." || strings.HasSuffix(dest, "/") || strings.HasSuffix(dest, "/.")
	if !path.IsAbs(dest) {
		dest = path.Join(orRoot(workDir), dest)
	} else {
		dest = path.Clean(dest)
	}
	if dir && dest != "/" {
		dest += "/"
	}
	return dest
}

// orRoot is dir, or "/" for "".
func orRoot(dir string) string {
	if dir == "" {
		return "/"
	}
	return dir
}

// remoteSource says src is a URL or a git source, which ADD would fetch.
func remoteSource(src string) bool {
	return strings.Contains(src, "://") || strings.HasPrefix(src, "git@") || strings.HasPrefix(src, "github.com/")
}

// portKey is one exposed port.
type portKey struct {
	port  int
	proto string
}

// expose adds specs ("8000", "53/udp", "8000-8010/tcp", after expansion)
// to the configuration's exposed ports and returns them sorted.
func (p *planner) expose(specs []string) ([]string, error) {
	set := map[portKey]bool{}
	for _, s := range p.cfg.ExposedPorts {
		num, proto, _ := strings.Cut(s, "/")
		n, _ := strconv.Atoi(num)
		set[portKey{n, proto}] = true
	}
	scope := p.scope()
	for _, spec := range specs {
		if err := checkExpansion(spec, scope); err != nil {
			return nil, err
		}
		words, err := p.lex.ProcessWords(spec, scope)
		if err != nil {
			return nil, err
		}
		for _, w := range words {
			if err := addPorts(set, w); err != nil {
				return nil, err
			}
		}
	}
	keys := slices.SortedFunc(maps.Keys(set), func(a, b portKey) int {
		if a.port != b.port {
			return a.port - b.port
		}
		return strings.Compare(a.proto, b.proto)
	})
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = strconv.Itoa(k.port) + "/" + k.proto
	}
	return out, nil
}

// addPorts adds one "PORT[-PORT][/PROTO]" to set.
func addPorts(set map[portKey]bool, spec string) error {
	num, proto, _ := strings.Cut(spec, "/")
	proto = strings.ToLower(proto)
	switch proto {
	case "":
		proto = "tcp"
	case "tcp", "udp", "sctp":
	default:
		return fmt.Errorf("port %q: protocol must be tcp, udp or sctp", spec)
	}
	lo, hi, isRange := strings.Cut(num, "-")
	if !isRange {
		hi = lo
	}
	first, err1 := strconv.Atoi(lo)
	last, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || first < 1 || last > 65535 || first > last {
		return fmt.Errorf("bad port %q", spec)
	}
	if last-first >= maxConfigEntries {
		return fmt.Errorf("port range %q is larger than %d ports", spec, maxConfigEntries)
	}
	for n := first; n <= last; n++ {
		set[portKey{n, proto}] = true
	}
	return nil
}

// oneLine folds an instruction onto one line of at most maxTextBytes.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= maxTextBytes {
		return s
	}
	const ellipsis = "..."
	cut := maxTextBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// vars is a set of variables for shell.Lex.
type vars map[string]string

// Get returns the value of k.
func (v vars) Get(k string) (string, bool) {
	s, ok := v[k]
	return s, ok
}

// Keys returns the names, sorted.
func (v vars) Keys() []string { return slices.Sorted(maps.Keys(v)) }
