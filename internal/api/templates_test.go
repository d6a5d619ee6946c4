package api

import (
	"archive/tar"
	"bytes"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// contextTar is a build context holding files.
func contextTar(t *testing.T, files map[string]string) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// TestTemplateBuildRefusals checks the build route's answers before any
// sandbox runs: a bad context or Dockerfile is 400 naming its line, a FROM
// that names nothing is 404 saying what to do, bad query values are 400,
// and templates that do not exist are 404 to list, get and delete.
func TestTemplateBuildRefusals(t *testing.T) {
	h := newHarness(t, store.APIKey{})
	for _, c := range []struct {
		name, path string
		body       *bytes.Buffer
		status     int
		want       string
	}{
		{"not a tar", "/v1/templates/web/build", bytes.NewBufferString(strings.Repeat("x", 1024)), 400, "build context"},
		{"no Dockerfile", "/v1/templates/web/build", contextTar(t, map[string]string{"a.txt": "a"}), 400, "Dockerfile"},
		{"unsupported", "/v1/templates/web/build", contextTar(t, map[string]string{"Dockerfile": "FROM base\nVOLUME /data\n"}), 400, "Dockerfile:2: VOLUME is not supported"},
		{"outside", "/v1/templates/web/build", contextTar(t, map[string]string{"Dockerfile": "FROM base\nCOPY ../x /x\n"}), 400, "Dockerfile:2"},
		{"unknown FROM", "/v1/templates/web/build", contextTar(t, map[string]string{"Dockerfile": "FROM nosuch\nRUN true\n"}), 404, "airlock image pull"},
		{"bad name", "/v1/templates/Web!/build", contextTar(t, map[string]string{"Dockerfile": "FROM base\n"}), 400, "template name"},
		{"bad arg", "/v1/templates/web/build?build_arg=novalue", contextTar(t, map[string]string{"Dockerfile": "FROM base\n"}), 400, "build_arg"},
		{"bad size", "/v1/templates/web/build?cpus=-1", contextTar(t, map[string]string{"Dockerfile": "FROM base\n"}), 400, "cpus"},
		{"Dockerfile elsewhere", "/v1/templates/web/build?dockerfile=sub/Dockerfile", contextTar(t, map[string]string{"sub/Dockerfile": "FROM base\nSHELL [\"/bin/bash\"]\n"}), 400, "Dockerfile:2: SHELL"},
	} {
		r := h.do(h.alice, "POST", c.path, c.body)
		if r.code != c.status || !strings.Contains(r.err(t).Error.Message, c.want) {
			t.Errorf("%s: %d %s; want %d with %q", c.name, r.code, r.body, c.status, c.want)
		}
	}
	// The last build of the name left its log, for its tenant only.
	if r := h.do(h.alice, "GET", "/v1/templates/web/log", nil); r.code != 200 || !strings.Contains(string(r.body), "Dockerfile:2: SHELL") {
		t.Errorf("build log: %d %s", r.code, r.body)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/v1/templates/web"}, {"DELETE", "/v1/templates/web"}, {"GET", "/v1/templates/web/log"}} {
		if r := h.do(h.bob, c.method, c.path, nil); r.code != 404 {
			t.Errorf("%s %s: %d %s", c.method, c.path, r.code, r.body)
		}
	}
	if r := h.do(h.alice, "GET", "/v1/templates", nil); r.code != 200 || string(bytes.TrimSpace(r.body)) != `{"templates":[]}` {
		t.Errorf("list: %d %s", r.code, r.body)
	}
}
