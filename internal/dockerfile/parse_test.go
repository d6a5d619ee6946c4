package dockerfile

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func mustParse(t *testing.T, src string, args map[string]string) *Plan {
	t.Helper()
	p, err := Parse(strings.NewReader(src), args)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

// TestParseEveryInstruction parses a Dockerfile that uses every supported
// instruction and checks each step.
func TestParseEveryInstruction(t *testing.T) {
	t.Parallel()
	src := `# syntax=docker/dockerfile:1
ARG BASE=base
FROM ${BASE}
LABEL org.example.name="my app" version=1
MAINTAINER someone@example.com
ENV APP_HOME=/srv/app PORT=8000
ENV GREETING hello world
ARG MODE=dev
WORKDIR $APP_HOME
RUN apt-get update && \
    apt-get install -y curl
RUN ["python3", "-c", "print(1)"]
COPY --chown=app:app --chmod=0644 requirements.txt ./
ADD vendor.tar.gz /opt/vendor
USER app
EXPOSE $PORT 53/udp 8000
CMD python3 -m http.server $PORT
ENTRYPOINT ["/usr/bin/tini", "--"]
`
	p := mustParse(t, src, nil)
	if p.From != "base" || p.FromLine != 3 {
		t.Errorf("From = %q line %d, want base line 3", p.From, p.FromLine)
	}
	type want struct {
		line    int
		kind    string
		changes bool
	}
	wants := []want{
		{4, "LABEL", false}, {5, "LABEL", false}, {6, "ENV", false}, {7, "ENV", false},
		{8, "ARG", false}, {9, "WORKDIR", true}, {10, "RUN", true}, {12, "RUN", true},
		{13, "COPY", true}, {14, "ADD", true}, {15, "USER", false}, {16, "EXPOSE", false},
		{17, "CMD", false}, {18, "ENTRYPOINT", false},
	}
	if len(p.Steps) != len(wants) {
		t.Fatalf("%d steps, want %d: %+v", len(p.Steps), len(wants), p.Steps)
	}
	for i, w := range wants {
		s := p.Steps[i]
		if s.Line != w.line || s.Kind != w.kind || s.Changes != w.changes {
			t.Errorf("step %d = line %d %s changes=%v, want line %d %s changes=%v", i, s.Line, s.Kind, s.Changes, w.line, w.kind, w.changes)
		}
		if s.Key != "" {
			t.Errorf("step %d has a key before Keys", i)
		}
	}
	run := p.Steps[6]
	if want := []string{"/bin/sh", "-c", "apt-get update &&     apt-get install -y curl"}; !reflect.DeepEqual(run.Argv, want) {
		t.Errorf("RUN argv = %q, want %q", run.Argv, want)
	}
	if want := "RUN apt-get update && apt-get install -y curl"; run.Text != want {
		t.Errorf("RUN text = %q, want %q", run.Text, want)
	}
	wantEnv := []string{"APP_HOME=/srv/app", "GREETING=hello world", "MODE=dev", "PORT=8000"}
	if !reflect.DeepEqual(run.Env, wantEnv) {
		t.Errorf("RUN env = %q, want %q", run.Env, wantEnv)
	}
	if run.Config.WorkDir != "/srv/app" {
		t.Errorf("RUN workdir = %q", run.Config.WorkDir)
	}
	if want := []string{"python3", "-c", "print(1)"}; !reflect.DeepEqual(p.Steps[7].Argv, want) {
		t.Errorf("exec RUN argv = %q", p.Steps[7].Argv)
	}
	cp := p.Steps[8]
	if !reflect.DeepEqual(cp.Sources, []string{"requirements.txt"}) || cp.Dest != "/srv/app/" || cp.Chown != "app:app" || cp.Chmod != "0644" {
		t.Errorf("COPY = %q -> %q chown %q chmod %q", cp.Sources, cp.Dest, cp.Chown, cp.Chmod)
	}
	add := p.Steps[9]
	if !reflect.DeepEqual(add.Sources, []string{"vendor.tar.gz"}) || add.Dest != "/opt/vendor" {
		t.Errorf("ADD = %q -> %q", add.Sources, add.Dest)
	}
	wantCfg := Config{
		Env:          []string{"APP_HOME=/srv/app", "PORT=8000", "GREETING=hello world"},
		WorkDir:      "/srv/app",
		User:         "app",
		Cmd:          []string{"/bin/sh", "-c", "python3 -m http.server $PORT"},
		Entrypoint:   []string{"/usr/bin/tini", "--"},
		ExposedPorts: []string{"53/udp", "8000/tcp"},
		Labels:       map[string]string{"org.example.name": "my app", "version": "1", "maintainer": "someone@example.com"},
	}
	if !reflect.DeepEqual(p.Config, wantCfg) {
		t.Errorf("Config =\n%+v\nwant\n%+v", p.Config, wantCfg)
	}
	if !reflect.DeepEqual(p.Steps[len(p.Steps)-1].Config, p.Config) {
		t.Errorf("Plan.Config differs from the last step's")
	}
	// Steps share nothing: the first step's config is as it was then.
	if first := p.Steps[0].Config; first.User != "" || len(first.Env) != 0 || len(first.Labels) != 2 {
		t.Errorf("first step's config = %+v", first)
	}
}

func TestParseExpansion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		src       string
		args      map[string]string
		from      string
		env       []string // the last step's Config.Env
		runEnv    []string // the last RUN's Env, if any
		workdir   string
		user      string
		unused    []string
		lastLabel map[string]string
	}{
		{
			name: "default when unset",
			src:  "FROM base\nENV A=${UNSET:-fallback} B=${UNSET:+alt} C=x${UNSET}y\n",
			from: "base", env: []string{"A=fallback", "B=", "C=xy"},
		},
		{
			name: "alternative when set",
			src:  "FROM base\nENV X=1\nENV A=${X:-fallback} B=${X:+alt}\n",
			from: "base", env: []string{"X=1", "A=1", "B=alt"},
		},
		{
			name: "old ENV form keeps spaces",
			src:  "FROM base\nENV MSG hello   big world\n",
			from: "base", env: []string{"MSG=hello   big world"},
		},
		{
			name: "ENV pairs see the values before the instruction",
			src:  "FROM base\nENV A=old\nENV A=new B=$A\n",
			from: "base", env: []string{"A=new", "B=old"},
		},
		{
			name: "redefinition replaces in place",
			src:  "FROM base\nENV A=1 B=2\nENV A=3\n",
			from: "base", env: []string{"A=3", "B=2"},
		},
		{
			name: "quotes are removed, escapes kept literal",
			src:  "FROM base\nENV A=\"a b\" B='$HOME' C=\\$D\n",
			from: "base", env: []string{"A=a b", "B=$HOME", "C=$D"},
		},
		{
			name: "build arg overrides ARG default; ENV overrides ARG",
			src:  "FROM base\nARG V=1\nARG W=2\nENV W=env\nRUN echo $V $W\n",
			args: map[string]string{"V": "cli", "EXTRA": "x", "ALSO": "y"},
			from: "base", env: []string{"W=env"}, runEnv: []string{"V=cli", "W=env"},
			unused: []string{"ALSO", "EXTRA"},
		},
		{
			name: "meta ARG only in FROM unless redeclared",
			src:  "ARG TAG=3.12\nARG IMG=python\nFROM $IMG:${TAG}\nENV T=x$TAG\nARG TAG\nENV U=$TAG\nRUN true\n",
			from: "python:3.12", env: []string{"T=x", "U=3.12"}, runEnv: []string{"T=x", "TAG=3.12", "U=3.12"},
		},
		{
			name: "meta ARG takes the build arg",
			src:  "ARG TAG=old\nFROM img:$TAG\n",
			args: map[string]string{"TAG": "new"},
			from: "img:new",
		},
		{
			name: "ARG without value is unset",
			src:  "FROM base\nARG NOVAL\nENV A=${NOVAL:-none}\nRUN true\n",
			from: "base", env: []string{"A=none"}, runEnv: []string{"A=none"},
		},
		{
			name: "WORKDIR relative to the last one; USER expanded",
			src:  "FROM base\nARG U=app\nWORKDIR /srv\nWORKDIR app/../data\nUSER ${U}:1000\n",
			from: "base", workdir: "/srv/data", user: "app:1000",
		},
		{
			name: "LABEL expanded",
			src:  "FROM base\nENV V=2\nLABEL version=$V \"with space\"=yes\n",
			from: "base", env: []string{"V=2"}, lastLabel: map[string]string{"version": "2", "with space": "yes"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := mustParse(t, tc.src, tc.args)
			if p.From != tc.from {
				t.Errorf("From = %q, want %q", p.From, tc.from)
			}
			if !reflect.DeepEqual(p.Config.Env, tc.env) {
				t.Errorf("Env = %q, want %q", p.Config.Env, tc.env)
			}
			if tc.runEnv != nil {
				var last *Step
				for i := range p.Steps {
					if p.Steps[i].Kind == "RUN" {
						last = &p.Steps[i]
					}
				}
				if last == nil || !reflect.DeepEqual(last.Env, tc.runEnv) {
					t.Errorf("RUN env = %+v, want %q", last, tc.runEnv)
				}
			}
			if p.Config.WorkDir != tc.workdir || p.Config.User != tc.user {
				t.Errorf("workdir %q user %q, want %q %q", p.Config.WorkDir, p.Config.User, tc.workdir, tc.user)
			}
			if !reflect.DeepEqual(p.UnusedArgs, tc.unused) {
				t.Errorf("UnusedArgs = %q, want %q", p.UnusedArgs, tc.unused)
			}
			if !reflect.DeepEqual(p.Config.Labels, tc.lastLabel) {
				t.Errorf("Labels = %q, want %q", p.Config.Labels, tc.lastLabel)
			}
		})
	}
}

func TestParseCommandsAndPorts(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `FROM base
ENV P=9000
EXPOSE 80 $P/UDP 8000-8002/tcp 80/tcp
CMD ["a", "$P"]
ENTRYPOINT exec server --port $P
`, nil)
	c := p.Config
	if want := []string{"80/tcp", "8000/tcp", "8001/tcp", "8002/tcp", "9000/udp"}; !reflect.DeepEqual(c.ExposedPorts, want) {
		t.Errorf("ports = %q, want %q", c.ExposedPorts, want)
	}
	if want := []string{"a", "$P"}; !reflect.DeepEqual(c.Cmd, want) {
		t.Errorf("Cmd = %q, want %q (not expanded)", c.Cmd, want)
	}
	if want := []string{"/bin/sh", "-c", "exec server --port $P"}; !reflect.DeepEqual(c.Entrypoint, want) {
		t.Errorf("Entrypoint = %q, want %q", c.Entrypoint, want)
	}
}

func TestParseDest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		workdir, dest, want string
	}{
		{"", "/app", "/app"},
		{"", "/app/", "/app/"},
		{"", "app", "/app"},
		{"", ".", "/"},
		{"/srv", ".", "/srv/"},
		{"/srv", "./", "/srv/"},
		{"/srv", "sub/", "/srv/sub/"},
		{"/srv", "sub/x", "/srv/sub/x"},
		{"/srv", "/abs/../y", "/y"},
		{"/srv", "/", "/"},
	} {
		src := "FROM base\n"
		if tc.workdir != "" {
			src += "WORKDIR " + tc.workdir + "\n"
		}
		src += "COPY f " + tc.dest + "\n"
		p := mustParse(t, src, nil)
		if got := p.Steps[len(p.Steps)-1].Dest; got != tc.want {
			t.Errorf("WORKDIR %q COPY f %q: Dest = %q, want %q", tc.workdir, tc.dest, got, tc.want)
		}
	}
	p := mustParse(t, "FROM base\nCOPY /abs/x ./y/../z a/ dir /d/\n", nil)
	if want := []string{"abs/x", "z", "a", "dir"}; !reflect.DeepEqual(p.Steps[0].Sources, want) {
		t.Errorf("Sources = %q, want %q", p.Steps[0].Sources, want)
	}
}

func TestParseText(t *testing.T) {
	t.Parallel()
	long := "RUN echo " + strings.Repeat("é", 200)
	p := mustParse(t, "FROM base\n"+long+"\n", nil)
	txt := p.Steps[0].Text
	if len(txt) > 200 || !strings.HasPrefix(txt, "RUN echo é") || !strings.HasSuffix(txt, "...") {
		t.Errorf("Text = %q (%d bytes)", txt, len(txt))
	}
	if !strings.HasPrefix(long, strings.TrimSuffix(txt, "...")) {
		t.Errorf("Text is not a prefix cut on a rune boundary: %q", txt)
	}
}

// TestParseRefused checks that every refusal wraps ErrInvalid and names its
// line.
func TestParseRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		src  string
		line int
		msg  string
	}{
		{"empty", "", 0, "empty Dockerfile"},
		{"only comments", "# nothing\n\n", 0, "empty Dockerfile"},
		{"no FROM", "ARG X=1\n", 0, "no FROM"},
		{"RUN before FROM", "RUN true\nFROM base\n", 1, "before FROM"},
		{"second FROM", "FROM base AS a\nRUN true\nFROM base\n", 3, "multi-stage builds are not supported"},
		{"FROM platform", "FROM --platform=linux/amd64 base\n", 1, "--platform"},
		{"FROM empty", "ARG IMG\nFROM $IMG\n", 2, "names no image"},
		{"COPY --from", "FROM base\n\nCOPY --from=build /x /y\n", 3, "COPY --from is not supported"},
		{"COPY --parents", "FROM base\nCOPY --parents a /y\n", 2, "--parents"},
		{"COPY --exclude", "FROM base\nCOPY --exclude=*.md . /y\n", 2, "--exclude"},
		{"RUN --mount", "FROM base\nRUN --mount=type=cache,target=/c true\n", 2, "RUN --mount is not supported"},
		{"RUN --network", "FROM base\nRUN --network=none true\n", 2, "RUN --network is not supported"},
		{"RUN --security", "FROM base\nRUN --security=insecure true\n", 2, "RUN --security is not supported"},
		{"RUN heredoc", "FROM base\nRUN <<EOF\necho hi\nEOF\n", 2, "heredoc"},
		{"COPY heredoc", "FROM base\nCOPY <<EOF /x\nhi\nEOF\n", 2, "heredoc"},
		{"ADD URL", "FROM base\nADD https://example.com/x.tgz /x\n", 2, "ADD of a URL is not supported: use RUN curl or COPY"},
		{"ADD git", "FROM base\nADD git@github.com:moby/moby.git /src\n", 2, "ADD of a URL is not supported"},
		{"ADD checksum", "FROM base\nADD --checksum=sha256:00 a /x\n", 2, "--checksum"},
		{"ONBUILD", "FROM base\nONBUILD RUN true\n", 2, "ONBUILD is not supported (supported: FROM, RUN"},
		{"HEALTHCHECK", "FROM base\nRUN true\n\n\n\n\nHEALTHCHECK CMD true\n", 7, "HEALTHCHECK is not supported (supported: "},
		{"SHELL", "FROM base\nSHELL [\"/bin/bash\", \"-c\"]\n", 2, "SHELL is not supported"},
		{"STOPSIGNAL", "FROM base\nSTOPSIGNAL SIGTERM\n", 2, "STOPSIGNAL is not supported"},
		{"VOLUME", "FROM base\nVOLUME /data\n", 2, "VOLUME is not supported"},
		{"unknown", "FROM base\nRUNN true\n", 2, "unknown instruction RUNN"},
		{"source outside", "FROM base\nCOPY ../secret /x\n", 2, "outside the build context"},
		{"absolute source outside", "FROM base\nCOPY /../secret /x\n", 2, "outside the build context"},
		{"expanded source outside", "FROM base\nARG D=..\nCOPY $D/x /x\n", 3, "outside the build context"},
		{"symbolic chmod", "FROM base\nCOPY --chmod=u+x a /x\n", 2, "only octal"},
		{"bad port", "FROM base\nEXPOSE 70000\n", 2, "bad port"},
		{"bad protocol", "FROM base\nEXPOSE 80/icmp\n", 2, "protocol"},
		{"empty RUN exec", "FROM base\nRUN []\n", 2, "no command"},
		{"buildkit parse error", "FROM base\nCOPY onlyone\n", 2, "COPY"},
		{"unknown flag", "FROM base\nRUN --bogus=1 true\n", 2, "bogus"},
		{"unterminated heredoc", "FROM base\nRUN <<EOF\necho\n", 2, "heredoc"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(strings.NewReader(tc.src), nil)
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			le, ok := errors.AsType[*LineError](err)
			if !ok {
				t.Fatalf("error %v is not a *LineError", err)
			}
			if le.Line != tc.line {
				t.Errorf("line = %d, want %d (%v)", le.Line, tc.line, err)
			}
			prefix := "Dockerfile: "
			if tc.line > 0 {
				prefix = "Dockerfile:" + strconv.Itoa(tc.line) + ": "
			}
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error = %q, want prefix %q and %q", err, prefix, tc.msg)
			}
		})
	}
}

func TestParseTooLarge(t *testing.T) {
	t.Parallel()
	src := "FROM base\n" + strings.Repeat("# padding\n", MaxDockerfileBytes/10+1)
	_, err := Parse(strings.NewReader(src), nil)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Parse = %v, want a too-large refusal", err)
	}
}

// TestParseLimits checks that small hostile files cannot make Parse build
// much: doubling a variable per line, huge port ranges, many steps.
func TestParseLimits(t *testing.T) {
	t.Parallel()
	doubling := "FROM base\nENV A=0123456789abcdef\n" + strings.Repeat("ENV A=$A$A\n", 40)
	metaDoubling := "ARG A=0123456789abcdef\n" + strings.Repeat("ARG A=$A$A\n", 40) + "FROM base\n"
	wide := "FROM base\nENV A=" + strings.Repeat("x", 1000) + "\nENV B=" + strings.Repeat("$A", 20000) + "\n"
	for _, tc := range []struct {
		name string
		src  string
		kind error
	}{
		{"ENV doubling", doubling, nil},
		{"ARG doubling before FROM", metaDoubling, nil},
		{"many references", wide, nil},
		{"port range", "FROM base\nEXPOSE 1-65535\n", errdefs.ErrInvalid},
		{"ports", "FROM base\n" + strings.Repeat("EXPOSE 1-1000\n", 1) + "EXPOSE 2000-2999 4000-4999\n", errdefs.ErrResourceExhausted},
		{"steps", "FROM base\n" + strings.Repeat("RUN true\n", MaxSteps+1), errdefs.ErrResourceExhausted},
		{"variables", "FROM base\n" + strings.Repeat("ENV A=1\n", 10) + envMany(maxConfigEntries+1), errdefs.ErrResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(strings.NewReader(tc.src), nil)
			kindOK := errors.Is(err, tc.kind)
			if tc.kind == nil { // either: a word or the configuration is too large
				kindOK = errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrResourceExhausted)
			}
			if _, ok := errors.AsType[*LineError](err); !ok || !kindOK {
				t.Fatalf("Parse = %v, want a %v *LineError", err, tc.kind)
			}
		})
	}
	p := mustParse(t, "FROM base\n"+strings.Repeat("RUN true\n", MaxSteps), nil)
	if len(p.Steps) != MaxSteps {
		t.Errorf("%d steps", len(p.Steps))
	}
}

// envMany is one ENV line defining n variables.
func envMany(n int) string {
	var b strings.Builder
	b.WriteString("ENV")
	for i := range n {
		b.WriteString(" V" + strconv.Itoa(i) + "=1")
	}
	return b.String() + "\n"
}
