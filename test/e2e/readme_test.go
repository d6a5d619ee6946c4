package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The README's examples are run by TestReadmeExamples, straight from
// README.md, so that an edit to the README cannot drift from what runs.
//
// Every fenced block in README.md except ```text ones (diagrams) carries a
// marker on the line right above its opening fence:
//
//	<!-- example -->                    run on every runtime
//	<!-- example OPTS: REASON -->       run, with options (REASON says why)
//	<!-- not-run: REASON -->            never run; REASON says why (and what tests it instead)
//
// OPTS, space-separated:
//
//	qemu               run on the qemu runtime only (skipped on gvisor, with REASON)
//	gvisor             run on the gvisor runtime only (skipped on qemu, with REASON)
//	gvisor-drop="TEXT" on gvisor, lines containing TEXT are left out
//	go-module          a sh block run in the Go example's module, before go run
//
// TestReadmeMarkers (unit tier) fails on a block with no marker, or a
// malformed one. How each example runs:
//
//   - sh blocks run in bash, in one working directory shared by all blocks,
//     holding bin/airlock (a link to AIRLOCK_BIN, also on PATH as airlock),
//     the fixtures the examples name (local.txt, project/ with a file and a
//     symlink, plot.py that draws a figure, data.bin) and a copy of
//     sdk/python. Environment: AIRLOCK_STATE_DIR is the test state dir,
//     AIRLOCK_RUNTIME as given to the test, no AIRLOCK_HOST or
//     AIRLOCK_API_KEY, stdin empty, PATH bin/, go's directory, then the
//     system's (so python3 is /usr/bin's). Each block has 10 minutes.
//     Every command must exit 0, except where the line's comment says
//     "exit N" or "exits N": there it must exit N.
//   - python blocks run with /usr/bin/python3 in that directory, with
//     sdk/python on PYTHONPATH; go blocks are main.go of a fresh module (go
//     mod init) that the go-module blocks set up, then go run. Both reach an
//     `airlock serve` the test starts, through AIRLOCK_HOST and
//     AIRLOCK_API_KEY (a key of tenant e2e-readme), and must exit 0.
//
// Substitutions, the only changes made to a block's text:
//
//   - $id, where a block uses it without assigning it, is a running
//     sandbox the test created for that block (and removes after it).
//   - 127.0.0.1:7070 becomes a free loopback port, and a line that starts a
//     server in the background (ends in "&" before its comment) waits, on
//     the same line, until /healthz answers there: as a reader would.
//   - /path/to/airlock is this checkout.
//   - On gvisor, gvisor-drop lines become ":" (so line numbers stay).
//
// Sandboxes a block leaves behind (ids in its shell variables when it
// exits, or printed alone on a line, that were not there before it) are
// removed after it.

// readmeBlock is one fenced block of README.md.
type readmeBlock struct {
	line    int    // of the opening fence, 1-based
	section string // the heading above it
	lang    string
	body    string
	run     bool // an example; false: not-run
	qemu    bool
	gvisor  bool
	drop    string // gvisor-drop
	goMod   bool   // go-module
	reason  string
}

var (
	readmeFence  = regexp.MustCompile("^```([a-z]*)\\s*$")
	readmeMarker = regexp.MustCompile(`^<!-- (example|not-run)(.*) -->$`)
	readmeOpt    = regexp.MustCompile(`^(?:qemu|gvisor(?:-drop="([^"]+)")?|go-module)`)
)

// readmeBlocks parses README text into its fenced blocks, checking every
// block's marker (see above).
func readmeBlocks(text string) ([]readmeBlock, error) {
	lines := strings.Split(text, "\n")
	var blocks []readmeBlock
	var errs []error
	section := ""
	for i := 0; i < len(lines); i++ {
		if h, ok := strings.CutPrefix(lines[i], "#"); ok && strings.HasPrefix(strings.TrimLeft(h, "#"), " ") {
			section = strings.TrimSpace(strings.TrimLeft(h, "#"))
		}
		m := readmeFence.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		b := readmeBlock{line: i + 1, section: section, lang: m[1]}
		end := i + 1
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("README.md:%d: unterminated fence", b.line)
		}
		b.body = strings.Join(lines[i+1:end], "\n") + "\n"
		marker := ""
		if i > 0 {
			marker = lines[i-1]
		}
		i = end
		if b.lang == "text" {
			continue
		}
		if err := b.parseMarker(marker); err != nil {
			errs = append(errs, fmt.Errorf("README.md:%d: ```%s block: %w", b.line, b.lang, err))
			continue
		}
		if b.run && !slices.Contains([]string{"sh", "python", "go"}, b.lang) {
			errs = append(errs, fmt.Errorf("README.md:%d: an example must be sh, python or go, not %q", b.line, b.lang))
		}
		if b.goMod && b.lang != "sh" {
			errs = append(errs, fmt.Errorf("README.md:%d: go-module is for sh blocks", b.line))
		}
		blocks = append(blocks, b)
	}
	var goProgs, goMods int
	for _, b := range blocks {
		if b.run && b.lang == "go" {
			goProgs++
		}
		if b.run && b.goMod {
			goMods++
		}
	}
	if goProgs > 1 || (goProgs == 1) != (goMods > 0) {
		errs = append(errs, fmt.Errorf("README.md: %d go examples and %d go-module blocks; want one go example set up by at least one go-module block, or neither", goProgs, goMods))
	}
	return blocks, errors.Join(errs...)
}

func (b *readmeBlock) parseMarker(marker string) error {
	m := readmeMarker.FindStringSubmatch(marker)
	if m == nil {
		return errors.New(`no marker on the line above: "<!-- example -->", "<!-- example OPTS: REASON -->" or "<!-- not-run: REASON -->"`)
	}
	b.run = m[1] == "example"
	rest := m[2]
	opts, reason, hasReason := strings.Cut(rest, ":")
	b.reason = strings.TrimSpace(reason)
	opts = strings.TrimSpace(opts)
	if !b.run {
		if opts != "" || b.reason == "" {
			return fmt.Errorf("marker %q: not-run takes no options and needs a reason", marker)
		}
		return nil
	}
	for opts != "" {
		o := readmeOpt.FindStringSubmatch(opts)
		if o == nil {
			return fmt.Errorf("marker %q: unknown option at %q", marker, opts)
		}
		switch o[0] {
		case "qemu":
			b.qemu = true
		case "gvisor":
			b.gvisor = true
		case "go-module":
			b.goMod = true
		default:
			b.drop = o[1]
		}
		opts = strings.TrimSpace(opts[len(o[0]):])
	}
	if b.qemu && b.gvisor {
		return fmt.Errorf("marker %q: qemu and gvisor exclude each other", marker)
	}
	if (b.qemu || b.gvisor || b.drop != "" || b.goMod) != (hasReason && b.reason != "") {
		return fmt.Errorf("marker %q: options need a reason after a colon, and a plain example has neither", marker)
	}
	return nil
}

func readmeText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeMarkers (unit tier) checks that every block of README.md says
// whether it runs, and that the parser behind TestReadmeExamples refuses
// what it should.
func TestReadmeMarkers(t *testing.T) {
	blocks, err := readmeBlocks(readmeText(t))
	if err != nil {
		t.Fatal(err)
	}
	var run int
	for _, b := range blocks {
		if b.run {
			run++
		}
	}
	if run < 8 {
		t.Errorf("only %d README examples run; the quick start, SDKs, pause, snapshots and code contexts should", run)
	}
	for _, c := range []struct{ text, want string }{
		{"```sh\ntrue\n```\n", "no marker"},
		{"<!-- example -->\n```console\n$ true\n```\n", "must be sh, python or go"},
		{"<!-- not-run -->\n```sh\ntrue\n```\n", "needs a reason"},
		{"<!-- example qemu -->\n```sh\ntrue\n```\n", "need a reason"},
		{"<!-- example: why -->\n```sh\ntrue\n```\n", "need a reason"},
		{"<!-- example kvm: why -->\n```sh\ntrue\n```\n", "unknown option"},
		{"<!-- example -->\n```go\npackage main\n```\n", "go-module"},
		{"<!-- example -->\n```sh\ntrue\n", "unterminated"},
	} {
		if _, err := readmeBlocks(c.text); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("readmeBlocks(%q) = %v; want an error with %q", c.text, err, c.want)
		}
	}
	bs, err := readmeBlocks("## A heading\n```text\na diagram\n```\n<!-- example qemu gvisor-drop=\"x y\": why -->\n```sh\ntrue\n```\n")
	if err != nil || len(bs) != 1 || !bs[0].qemu || bs[0].drop != "x y" || bs[0].reason != "why" || bs[0].line != 6 || bs[0].section != "A heading" {
		t.Errorf("readmeBlocks: %+v, %v", bs, err)
	}
	lines, want := readmeExpectations("a  # exits 3\nb \\\n  c   # interrupted (exit 124)\nd 'exit 5'\n")
	if !slices.Equal(lines, []int{1, 2, 2, 4}) || want[1] != 3 || want[2] != 124 || len(want) != 2 {
		t.Errorf("readmeExpectations: %v %v", lines, want)
	}
}

var readmeExitComment = regexp.MustCompile(`\bexits? (\d+)\b`)

// readmeExpectations maps each physical line (1-based, index i-1) of a
// shell block to its logical line (the first of a run of backslash
// continuations) and gives the exit status each logical line's comment
// expects.
func readmeExpectations(body string) (logical []int, want map[int]int) {
	want = map[int]int{}
	start := 0
	for i, l := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if start == 0 {
			start = i + 1
		}
		logical = append(logical, start)
		if _, comment, ok := strings.Cut(l, "  # "); ok {
			if m := readmeExitComment.FindStringSubmatch(comment); m != nil {
				want[start], _ = strconv.Atoi(m[1])
			}
		}
		if !strings.HasSuffix(strings.SplitN(l, "  # ", 2)[0], "\\") {
			start = 0
		}
	}
	return logical, want
}

// readmePreamble is sourced by bash (BASH_ENV) before a block: it reports
// each failing command's line and status on fd 3 and, when the block
// exits, its variables (for the sandbox ids they hold); then it ends the
// block's background jobs.
const readmePreamble = `readme_wait() {
  for _ in $(seq 600); do curl -so /dev/null "http://$1/healthz" && return 0; sleep 0.05; done
  echo "readme test: nothing answers on $1" >&2; return 1
}
trap 'readme_st=$?; echo "status $LINENO $readme_st" >&3' ERR
trap 'trap - ERR; echo vars >&3; set >&3; for j in $(jobs -p); do kill "$j"; done; wait' EXIT
`

type readmeEnv struct {
	e             env
	root, work    string
	preamble      string
	parent        *testing.T // TestReadmeExamples itself, which owns the server
	host, key     string     // the test's airlock serve, started on first use
	startedServer bool
}

var (
	readmeID    = regexp.MustCompile(`(?m)^([a-z2-7]{20})$`)
	readmeVarID = regexp.MustCompile(`\b[a-z2-7]{20}\b`)
)

// TestReadmeExamples runs README.md's examples as written (see the rules
// at the top of this file), on the runtime AIRLOCK_RUNTIME names.
func TestReadmeExamples(t *testing.T) {
	e := setup(t)
	blocks, err := readmeBlocks(readmeText(t))
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	r := &readmeEnv{e: e, root: root, work: t.TempDir(), parent: t}
	r.fixtures(t)
	var goModule []readmeBlock
	for _, b := range blocks {
		if b.run && b.goMod {
			goModule = append(goModule, b)
		}
	}
	for _, b := range blocks {
		if !b.run || b.goMod {
			continue
		}
		t.Run(b.section, func(t *testing.T) { // "Install and quick start", then #01, ... for more blocks under one heading
			if b.qemu && onGVisor() {
				t.Skipf("README.md:%d runs on qemu only: %s", b.line, b.reason)
			}
			if b.gvisor && !onGVisor() {
				t.Skipf("README.md:%d runs on gvisor only: %s", b.line, b.reason)
			}
			switch b.lang {
			case "sh":
				r.shell(t, b, r.work, nil)
			case "python":
				r.python(t, b)
			case "go":
				r.goProgram(t, b, goModule)
			}
		})
	}
}

func (r *readmeEnv) fixtures(t *testing.T) {
	t.Helper()
	bin, err := filepath.Abs(r.e.bin)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	w := r.work
	must(os.MkdirAll(filepath.Join(w, "bin"), 0o755))
	must(os.Symlink(bin, filepath.Join(w, "bin", "airlock")))
	must(os.WriteFile(filepath.Join(w, "local.txt"), []byte("local file\n"), 0o644))
	must(os.MkdirAll(filepath.Join(w, "project", "src"), 0o755))
	must(os.WriteFile(filepath.Join(w, "project", "src", "main.py"), []byte("print('hi')\n"), 0o755))
	must(os.Symlink("src/main.py", filepath.Join(w, "project", "main.py")))
	must(os.WriteFile(filepath.Join(w, "plot.py"), []byte("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\n"), 0o644))
	must(os.WriteFile(filepath.Join(w, "data.bin"), bytes.Repeat([]byte{0, 1, 2, 3}, 1<<16), 0o644))
	must(os.CopyFS(filepath.Join(w, "sdk", "python"), os.DirFS(filepath.Join(r.root, "sdk", "python"))))
	r.preamble = filepath.Join(t.TempDir(), "preamble.sh")
	must(os.WriteFile(r.preamble, []byte(readmePreamble), 0o644))
}

// environ is the environment of every example: the test's own, less the
// variables that would point the CLI elsewhere, with PATH the system's.
func (r *readmeEnv) environ(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "AIRLOCK_HOST", "AIRLOCK_API_KEY", "AIRLOCK_STATE_DIR", "BASH_ENV", "PATH", "PYTHONPATH", "id":
			continue
		}
		env = append(env, kv)
	}
	path := filepath.Join(r.work, "bin")
	if gobin, err := exec.LookPath("go"); err == nil {
		path += ":" + filepath.Dir(gobin)
	}
	return append(env, append([]string{
		"AIRLOCK_STATE_DIR=" + r.e.state,
		"PATH=" + path + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	}, extra...)...)
}

// server starts the airlock serve that SDK examples reach, once.
func (r *readmeEnv) server(t *testing.T) []string {
	t.Helper()
	if !r.startedServer {
		s := startServe(r.parent, r.e) // lives until TestReadmeExamples ends
		r.host = s.base
		r.key = strings.TrimSpace(r.e.must(t, "keys", "create", "--tenant", "e2e-readme"))
		r.startedServer = true
	}
	return []string{"AIRLOCK_HOST=" + r.host, "AIRLOCK_API_KEY=" + r.key}
}

var (
	readmeAssignsID = regexp.MustCompile(`(?m)(^|[;\s])id=`)
	readmeUsesID    = regexp.MustCompile(`\$\{?id\b`)
	readmeBackgnd   = regexp.MustCompile(`&(\s*)(#.*)?$`)
)

// shell runs one sh block with bash in dir and checks every command's exit
// status against the block's comments.
func (r *readmeEnv) shell(t *testing.T, b readmeBlock, dir string, extraEnv []string) string {
	t.Helper()
	body := b.body
	env := r.environ(extraEnv...)
	if readmeUsesID.MatchString(body) && !readmeAssignsID.MatchString(body) {
		env = append(env, "id="+r.e.create(t))
	}
	if strings.Contains(body, "127.0.0.1:7070") {
		addr := freeLoopback(t)
		body = strings.ReplaceAll(body, "127.0.0.1:7070", addr)
		lines := strings.Split(body, "\n")
		for i, l := range lines {
			if loc := readmeBackgnd.FindStringSubmatchIndex(l); loc != nil && !strings.Contains(l[:loc[0]], "#") {
				lines[i] = l[:loc[0]+1] + " readme_wait " + addr + l[loc[0]+1:]
			}
		}
		body = strings.Join(lines, "\n")
	}
	body = strings.ReplaceAll(body, "/path/to/airlock", r.root)
	if b.drop != "" && onGVisor() {
		lines := strings.Split(body, "\n")
		for i, l := range lines {
			if strings.Contains(l, b.drop) {
				t.Logf("README.md:%d: left out on gvisor (%s): %s", b.line+1+i, b.reason, l)
				lines[i] = ":"
			}
		}
		body = strings.Join(lines, "\n")
	}
	before := r.sandboxes(t)

	report, err := os.CreateTemp(t.TempDir(), "report")
	if err != nil {
		t.Fatal(err)
	}
	defer report.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "/bin/bash", "-c", body, "readme")
	c.Dir = dir
	c.Env = append(env, "BASH_ENV="+r.preamble)
	c.ExtraFiles = []*os.File{report}
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	start := time.Now()
	err = c.Run()
	t.Logf("README.md:%d: ran in %s", b.line, time.Since(start).Round(time.Millisecond))
	rep, rerr := os.ReadFile(report.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	r.cleanup(t, before, out.String(), string(rep))
	if ctx.Err() != nil {
		t.Fatalf("README.md:%d: still running after 10 minutes\n%s", b.line, out.String())
	}
	if _, ok := errors.AsType[*exec.ExitError](err); err != nil && !ok {
		t.Fatalf("README.md:%d: bash: %v", b.line, err)
	}

	logical, want := readmeExpectations(b.body)
	got := map[int][]int{}
	for l := range strings.SplitSeq(string(rep), "\n") {
		var line, st int
		if _, err := fmt.Sscanf(l, "status %d %d", &line, &st); err != nil {
			continue
		}
		if line >= 1 && line <= len(logical) {
			line = logical[line-1]
		}
		got[line] = append(got[line], st)
	}
	src := strings.Split(b.body, "\n")
	for line := range len(logical) {
		line++
		if logical[line-1] != line {
			continue
		}
		w, expect := want[line]
		g := got[line]
		if (expect && !slices.Equal(g, []int{w})) || (!expect && len(g) > 0) {
			exp := "every command exits 0"
			if expect {
				exp = fmt.Sprintf("exit %d, as its comment says", w)
			}
			t.Errorf("README.md:%d: %s\n  exit statuses %v; want %s", b.line+line, src[line-1], g, exp)
		}
	}
	for line := range got {
		if line < 1 || line > len(logical) {
			t.Errorf("README.md:%d: a command outside the block's lines (line %d of the script) failed: %v", b.line, line, got[line])
		}
	}
	if t.Failed() {
		t.Logf("output of README.md:%d:\n%s", b.line, out.String())
	}
	return out.String()
}

// sandboxes lists the ids in the state dir.
func (r *readmeEnv) sandboxes(t *testing.T) map[string]bool {
	t.Helper()
	var list []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(r.e.must(t, "ls", "--json")), &list); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, s := range list {
		ids[s.ID] = true
	}
	return ids
}

// cleanup removes what a block left: the sandbox in its $id, and sandboxes
// it printed alone on a line (create, fork) that were not there before it.
func (r *readmeEnv) cleanup(t *testing.T, before map[string]bool, out, report string) {
	t.Helper()
	var ids []string
	for _, m := range readmeID.FindAllStringSubmatch(out, -1) {
		ids = append(ids, m[1])
	}
	_, vars, _ := strings.Cut(report, "vars\n")
	ids = append(ids, readmeVarID.FindAllString(vars, -1)...)
	now := r.sandboxes(t)
	for _, id := range ids {
		if now[id] && !before[id] {
			r.e.run(t, nil, "rm", id)
			delete(now, id)
		}
	}
	if r.e.run(t, nil, "snapshot", "rm", "after-setup").code == 0 {
		t.Errorf("the README's snapshot after-setup outlived its block")
	}
}

// freeLoopback returns a loopback address nothing listens on.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// python runs a python block with /usr/bin/python3 against the test's
// server.
func (r *readmeEnv) python(t *testing.T, b readmeBlock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "/usr/bin/python3", "-c", b.body)
	c.Dir = r.work
	c.Env = r.environ(append(r.server(t), "PYTHONPATH="+filepath.Join(r.root, "sdk", "python"))...)
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("README.md:%d: python3: %v\n%s", b.line, err, out)
	}
	t.Logf("README.md:%d: %s", b.line, out)
	if !bytes.Contains(out, []byte(`b'42\n' 0`)) {
		t.Errorf("README.md:%d printed %q; its comment says b'42\\n' 0", b.line, out)
	}
}

// goProgram builds the go block as main.go of a new module that the
// go-module blocks set up, and runs it against the test's server.
func (r *readmeEnv) goProgram(t *testing.T, b readmeBlock, setupBlocks []readmeBlock) {
	t.Helper()
	dir := t.TempDir()
	goEnv := []string{"GOPROXY=off", "GOSUMDB=off", "GOFLAGS=-mod=mod"} // never the network: the module cache has the SDK's one dependency, checked when it was fetched; the checksum database is not reachable offline either
	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		c := exec.CommandContext(ctx, args[0], args[1:]...)
		c.Dir = dir
		c.Env = r.environ(append(r.server(t), goEnv...)...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("README.md:%d: %v: %v\n%s", b.line, args, err, out)
		}
		return out
	}
	run("go", "mod", "init", "example.com/readme")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(b.body), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range setupBlocks {
		r.shell(t, s, dir, goEnv)
	}
	out := run("go", "run", ".")
	t.Logf("README.md:%d: %s", b.line, out)
	if !bytes.Contains(out, []byte("exit 0: 42\n")) {
		t.Errorf("README.md:%d printed %q; its comment says exit 0: 42", b.line, out)
	}
}
