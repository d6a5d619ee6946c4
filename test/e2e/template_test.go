package e2e

import (
	"archive/tar"
	"compress/gzip"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// templateContext writes a build context whose Dockerfile uses every
// supported instruction; run is its last RUN's command.
func templateContext(t *testing.T, run string) string {
	t.Helper()
	dir := t.TempDir()
	df := `# every supported instruction
ARG BASE=base
FROM ${BASE}
MAINTAINER e2e
ARG GREETING=hello
ENV APP_HOME=/srv/app PORT=8000
LABEL org.example.team="agents" version="1"
WORKDIR $APP_HOME
COPY --chown=nobody app/ ./
ADD data.tar.gz /opt/data/
RUN echo "$GREETING from build" > built.txt && id -un > builder-user.txt
RUN useradd -m appuser && chown -R appuser /srv/app
USER appuser
EXPOSE 8000
ENTRYPOINT ["python3", "-m"]
CMD ["http.server", "8000"]
RUN ` + run + `
`
	files := map[string]string{
		"Dockerfile":     df,
		"app/main.py":    "print('hi')\n",
		"app/secret.txt": "not for the image\n",
		".dockerignore":  "app/secret.txt\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "data.tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	data := "data1\n"
	if err := tw.WriteHeader(&tar.Header{Name: "one.txt", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte(data))
	if err := errors.Join(tw.Close(), zw.Close(), f.Close()); err != nil {
		t.Fatal(err)
	}
	return dir
}

var stepLine = regexp.MustCompile(`(?m)^step (\d+)/(\d+): (.*)$`)

// builtSteps returns the steps a build's progress says it ran in the
// builder, and those it found cached (steps that only set configuration
// are neither once a later step ran).
func builtSteps(stderr string) (ran, cached []string) {
	for _, m := range stepLine.FindAllStringSubmatch(stderr, -1) {
		switch text, ok := strings.CutSuffix(m[3], " (cached)"); {
		case ok:
			cached = append(cached, text)
		case strings.HasSuffix(m[3], " (config)"):
			// Applied without running anything.
		default:
			ran = append(ran, m[3])
		}
	}
	return ran, cached
}

// TestTemplateBuildFromDockerfile builds a template through `airlock
// serve` (the remote CLI) from a Dockerfile with every supported
// instruction and checks each effect in a sandbox of it, the server
// already answering on its first exec; the rebuild is served from the
// cache and a late change reruns only that step; a failing RUN, an
// unsupported instruction and a COPY from outside the context fail with
// their line; another tenant neither sees nor starts the template. On
// both runtimes: on qemu a template is a saved running sandbox, on gvisor
// an image whose start command runs at each create.
func TestTemplateBuildFromDockerfile(t *testing.T) {
	e := setup(t)
	// Tenants of their own: a build cache of an earlier run is not found.
	run := strings.ToLower(rand.Text()[:8])
	alice := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-tpl-alice-"+run))
	bob := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-tpl-bob-"+run))
	s := startServe(t, e)
	dir := templateContext(t, "echo v1 > version.txt")
	build := []string{"template", "build", "-t", "web", "--ready", "curl -sf localhost:8000", dir}

	t.Cleanup(func() {
		remoteRun(t, e, s, alice, nil, "template", "rm", "web")
		if out := remoteMust(t, e, s, alice, "template", "prune"); !strings.HasPrefix(out, "removed ") || out == "removed 0 saved states\n" {
			t.Errorf("template prune: %q", out)
		}
		if onGVisor() {
			// The templates' images (blobs and extracted trees), now
			// that no template names them.
			e.must(t, "image", "prune")
		}
	})
	r := remoteRun(t, e, s, alice, nil, build...)
	if r.code != 0 || strings.TrimSpace(r.stdout) != "web" {
		t.Fatalf("build: code %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	if log := remoteMust(t, e, s, alice, "template", "logs", "web"); !strings.Contains(log, "step 14/14: RUN echo v1 > version.txt") || !strings.Contains(log, "built in") {
		t.Errorf("the build's log:\n%s", log)
	}
	ran, cached := builtSteps(r.stderr)
	if len(ran) != 6 || len(cached) != 0 || ran[0] != "WORKDIR $APP_HOME" {
		t.Fatalf("first build: ran %q, cached %q\n%s", ran, cached, r.stderr)
	}

	id := strings.TrimSpace(remoteMust(t, e, s, alice, "create", "--image", "web"))
	defer remoteRun(t, e, s, alice, nil, "rm", id)
	// The start command was saved running (qemu), or ran and passed its
	// ready check before the create returned (gvisor): the first exec
	// finds it serving.
	if got := remoteMust(t, e, s, alice, "exec", id, "--", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "localhost:8000"); got != "200" {
		t.Errorf("the template's server: %q", got)
	}
	checks := map[string]string{
		"pwd":                                    "/srv/app",
		"id -un":                                 "appuser",
		"echo $APP_HOME:$PORT:${GREETING-unset}": "/srv/app:8000:unset",
		"cat built.txt builder-user.txt version.txt":            "hello from build\nroot\nv1",
		"cat /opt/data/one.txt":                                 "data1",
		"stat -c %U main.py":                                    "appuser",
		"ls app/secret.txt secret.txt 2>&1 | grep -c 'No such'": "2",
		// The START command runs once (the base image's template also
		// carries a warm Python kernel, which the build inherited).
		"ps -o args= -C python3 | grep -v ipykernel": "python3 -m http.server 8000",
	}
	for cmd, want := range checks {
		if got := strings.TrimSpace(remoteMust(t, e, s, alice, "exec", id, "--", "sh", "-c", cmd)); got != want {
			t.Errorf("%s: %q, want %q", cmd, got, want)
		}
	}
	var tpl struct {
		Runtime      string            `json:"runtime"`
		Env          []string          `json:"env"`
		ExposedPorts []string          `json:"exposed_ports"`
		Labels       map[string]string `json:"labels"`
		Entrypoint   []string          `json:"entrypoint"`
		Cmd          []string          `json:"cmd"`
	}
	if err := json.Unmarshal([]byte(remoteMust(t, e, s, alice, "template", "inspect", "web")), &tpl); err != nil {
		t.Fatal(err)
	}
	if strings.Join(tpl.ExposedPorts, ",") != "8000/tcp" || tpl.Labels["org.example.team"] != "agents" || tpl.Labels["maintainer"] != "e2e" ||
		strings.Join(tpl.Entrypoint, " ") != "python3 -m" || strings.Join(tpl.Cmd, " ") != "http.server 8000" || tpl.Runtime != runtimeName() {
		t.Errorf("template config: %+v", tpl)
	}

	// E2B's create names the template as its templateID.
	req, err := http.NewRequest("POST", s.base+"/sandboxes", strings.NewReader(`{"templateID":"web","timeout":300}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", alice)
	req.Header.Set("Content-Type", "application/json")
	res, err := s.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e2bSandbox struct {
		SandboxID string `json:"sandboxID"`
	}
	err = json.NewDecoder(res.Body).Decode(&e2bSandbox)
	res.Body.Close()
	if err != nil || res.StatusCode != 201 || e2bSandbox.SandboxID == "" {
		t.Fatalf("E2B create with templateID web: %d %v %+v", res.StatusCode, err, e2bSandbox)
	}
	defer remoteRun(t, e, s, alice, nil, "rm", e2bSandbox.SandboxID)
	if got := remoteMust(t, e, s, alice, "exec", e2bSandbox.SandboxID, "--", "sh", "-c", "pwd; curl -sS -o /dev/null -w %{http_code} localhost:8000"); got != "/srv/app\n200" {
		t.Errorf("an E2B sandbox of the template: %q", got)
	}

	// Another tenant: no such template, and no sandbox of it.
	if out := remoteMust(t, e, s, bob, "template", "ls"); strings.Contains(out, "web") {
		t.Errorf("bob sees alice's template:\n%s", out)
	}
	if r := remoteRun(t, e, s, bob, nil, "create", "--image", "web"); r.code == 0 {
		remoteRun(t, e, s, bob, nil, "rm", strings.TrimSpace(r.stdout))
		t.Error("bob started a sandbox of alice's template")
	}

	// Unchanged: every step from the cache.
	r = remoteRun(t, e, s, alice, nil, build...)
	ran, cached = builtSteps(r.stderr)
	if r.code != 0 || len(ran) != 0 || len(cached) != 14 {
		t.Fatalf("rebuild: code %d, ran %q\n%s", r.code, ran, r.stderr)
	}
	// A late change reruns only that step.
	df := filepath.Join(dir, "Dockerfile")
	b, _ := os.ReadFile(df)
	if err := os.WriteFile(df, []byte(strings.Replace(string(b), "echo v1", "echo v2", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	r = remoteRun(t, e, s, alice, nil, build...)
	ran, cached = builtSteps(r.stderr)
	if r.code != 0 || len(ran) != 1 || ran[0] != "RUN echo v2 > version.txt" || len(cached) != 9 {
		t.Fatalf("late change: code %d, ran %q, cached %d\n%s", r.code, ran, len(cached), r.stderr)
	}
	id2 := strings.TrimSpace(remoteMust(t, e, s, alice, "create", "--image", "web"))
	defer remoteRun(t, e, s, alice, nil, "rm", id2)
	if got := remoteMust(t, e, s, alice, "exec", id2, "--", "cat", "version.txt"); got != "v2\n" {
		t.Errorf("after the late change: %q", got)
	}

	// A template FROM this one inherits its configuration; the parent's
	// app is stopped for the steps and its start command runs once after.
	child := t.TempDir()
	if err := os.WriteFile(filepath.Join(child, "Dockerfile"), []byte("FROM web\nRUN echo child > child.txt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remoteRun(t, e, s, alice, nil, "template", "rm", "kid") })
	remoteMust(t, e, s, alice, "template", "build", "-t", "kid", "--ready", "curl -sf localhost:8000", child)
	id3 := strings.TrimSpace(remoteMust(t, e, s, alice, "create", "--image", "kid"))
	defer remoteRun(t, e, s, alice, nil, "rm", id3)
	for cmd, want := range map[string]string{
		"pwd; id -un; cat child.txt version.txt; echo $PORT":   "/srv/app\nappuser\nchild\nv2\n8000",
		"ps -o args= -C python3 | grep -c http.server":         "1",
		"curl -sS -o /dev/null -w %{http_code} localhost:8000": "200",
	} {
		if got := strings.TrimSpace(remoteMust(t, e, s, alice, "exec", id3, "--", "sh", "-c", cmd)); got != want {
			t.Errorf("FROM web: %s: %q, want %q", cmd, got, want)
		}
	}

	// Failures name their line; a failed RUN shows its output and code.
	bad := t.TempDir()
	for _, c := range []struct{ df, want string }{
		{"FROM base\nRUN echo about to fail; exit 3\n", "Dockerfile:2: RUN: exit code 3"},
		{"FROM base\nHEALTHCHECK CMD true\n", "Dockerfile:2: HEALTHCHECK is not supported"},
		{"FROM base\nCOPY ../outside /x\n", "Dockerfile:2: COPY"},
	} {
		if err := os.WriteFile(filepath.Join(bad, "Dockerfile"), []byte(c.df), 0o644); err != nil {
			t.Fatal(err)
		}
		r := remoteRun(t, e, s, alice, nil, "template", "build", "-t", "bad", bad)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%q: code %d, stderr %s", c.df, r.code, r.stderr)
		}
		if strings.Contains(c.df, "exit 3") && !strings.Contains(r.stderr, "about to fail") {
			t.Errorf("the failed RUN's output is not shown: %s", r.stderr)
		}
	}
	// The last failed build's log is kept.
	if log := remoteMust(t, e, s, alice, "template", "logs", "bad"); !strings.Contains(log, "Dockerfile:2: COPY") || !strings.Contains(log, "failed after") {
		t.Errorf("the failed build's log:\n%s", log)
	}
	// The failed build's builder is gone.
	var sbs []struct {
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(remoteMust(t, e, s, alice, "ls", "--json")), &sbs); err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if sb.Metadata["airlock.template-build"] != "" {
			t.Errorf("a builder is left: %+v", sb)
		}
	}
}

// remoteMust is remoteRun that fails the test unless the command exits 0;
// it returns stdout.
func remoteMust(t *testing.T, e env, s *apiServer, key string, args ...string) string {
	t.Helper()
	r := remoteRun(t, e, s, key, nil, args...)
	if r.code != 0 {
		t.Fatalf("airlock %v: exit %d\n%s", args, r.code, r.stderr)
	}
	return r.stdout
}

// TestTemplateFromRegistry: FROM an OCI reference pulls the image from a
// registry an admin allowed (serve --template-registry; here a registry of
// the test's own on loopback) and builds on it; a registry not allowed is
// refused, saying how to allow it, before anything connects there; a
// rebuild asks the registry for the tag's digest and pulls nothing.
func TestTemplateFromRegistry(t *testing.T) {
	e := setup(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, err := name.ParseReference(host + "/tiny:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, busyboxImage(t)); err != nil {
		t.Fatalf("push the test image: %v", err)
	}
	run := strings.ToLower(rand.Text()[:8])
	key := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-pull-"+run))
	s := startServe(t, e, "--template-registry", host)
	t.Cleanup(func() {
		remoteRun(t, e, s, key, nil, "template", "rm", "tiny")
		remoteRun(t, e, s, key, nil, "template", "prune")
		e.must(t, "image", "prune") // the pulled blob, unnamed
	})
	dir := t.TempDir()
	write := func(df string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Not allowed: refused with the flag to use, and nothing pulled.
	write("FROM registry.invalid/team/app:1\nRUN true\n")
	r := remoteRun(t, e, s, key, nil, "template", "build", "-t", "tiny", dir)
	if r.code == 0 || !strings.Contains(r.stderr, "--template-registry registry.invalid") || !strings.Contains(r.stderr, "Dockerfile:1") {
		t.Fatalf("FROM a registry not allowed: code %d\n%s", r.code, r.stderr)
	}

	write("FROM " + ref.String() + "\nRUN /bin/busybox --install -s /bin && echo pulled > /hello\n")
	r = remoteRun(t, e, s, key, nil, "template", "build", "-t", "tiny", dir)
	if r.code != 0 || !strings.Contains(r.stderr, "pulling "+ref.String()) {
		t.Fatalf("build FROM %s: code %d\n%s", ref, r.code, r.stderr)
	}
	id := strings.TrimSpace(remoteMust(t, e, s, key, "create", "--image", "tiny"))
	defer remoteRun(t, e, s, key, nil, "rm", id)
	if got := remoteMust(t, e, s, key, "exec", id, "--", "cat", "/hello"); got != "pulled\n" {
		t.Errorf("a sandbox of the template: %q", got)
	}
	// Unchanged: the tag's digest is asked for, the image not pulled again.
	r = remoteRun(t, e, s, key, nil, "template", "build", "-t", "tiny", dir)
	if ran, cached := builtSteps(r.stderr); r.code != 0 || len(ran) != 0 || len(cached) != 1 || !strings.Contains(r.stderr, "(pulled before)") || strings.Contains(r.stderr, "pulling ") {
		t.Fatalf("rebuild: code %d\n%s", r.code, r.stderr)
	}
}
