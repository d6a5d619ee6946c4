package api

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Templates is the template part of the manager (sandbox.Manager's methods
// of the same names), acting for a caller: another tenant's template is
// ErrNotFound like a missing one.
type Templates interface {
	BuildTemplateFromTar(ctx context.Context, c sandbox.Caller, o sandbox.BuildOptions, r io.Reader, dockerfile string) (sandbox.Template, error)
	ListTemplates(ctx context.Context, c sandbox.Caller, all bool) ([]sandbox.Template, error)
	GetTemplate(ctx context.Context, c sandbox.Caller, name string) (sandbox.Template, error)
	RemoveTemplate(ctx context.Context, c sandbox.Caller, name string) error
	PruneTemplateCache(ctx context.Context, c sandbox.Caller) (int, error)
	TemplateLog(ctx context.Context, c sandbox.Caller, name string, w io.Writer) error
}

var _ Templates = (*sandbox.Manager)(nil)

// Template is the API's view of a template.
type Template struct {
	Name         string            `json:"name"`
	Tenant       string            `json:"tenant"`
	Runtime      string            `json:"runtime"`
	From         string            `json:"from"`
	Steps        int               `json:"steps"`
	BuildMS      int64             `json:"build_ms"`
	CreatedAt    time.Time         `json:"created_at"`
	Env          []string          `json:"env"`
	WorkDir      string            `json:"workdir"`
	User         string            `json:"user"`
	Cmd          []string          `json:"cmd"`
	Entrypoint   []string          `json:"entrypoint"`
	ExposedPorts []string          `json:"exposed_ports"`
	Labels       map[string]string `json:"labels"`
	Start        string            `json:"start"`
	Ready        string            `json:"ready"`
}

func viewTemplate(t sandbox.Template) Template {
	nz := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	labels := t.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return Template{
		Name: t.Name, Tenant: t.Tenant, Runtime: cmp.Or(t.Runtime, "qemu"), From: t.Base, Steps: t.Steps, BuildMS: t.BuildMS, CreatedAt: t.Created.UTC(),
		Env: nz(t.Env), WorkDir: t.WorkDir, User: t.User, Cmd: nz(t.Cmd), Entrypoint: nz(t.Entrypoint),
		ExposedPorts: nz(t.ExposedPorts), Labels: labels, Start: t.Start, Ready: t.Ready,
	}
}

var (
	errNoTemplates = &Error{http.StatusServiceUnavailable, "unavailable", "templates are not available on this server"}
	errNoTemplate  = &Error{http.StatusNotFound, "not_found", "template not found"}
)

func templateErr(err error) error {
	if errors.Is(err, errdefs.ErrNotFound) {
		return errNoTemplate
	}
	return err
}

// buildTemplate builds template {name} from the request body, a tar of
// the build context. Query: dockerfile (path in the context), start,
// ready, ready_timeout_s, build_arg (K=V, repeated), cpus, memory_mb,
// disk_mb, no_cache. The answer is NDJSON: the build's events, then a
// "built" line with the template, or an "error" line.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil {
		s.fail(w, r, errNoTemplates)
		return
	}
	q := r.URL.Query()
	o := sandbox.BuildOptions{Name: r.PathValue("name"), Start: q.Get("start"), Ready: q.Get("ready"), NoCache: truthy(q.Get("no_cache"))}
	if err := sandbox.ValidTemplateName(o.Name); err != nil {
		s.fail(w, r, err)
		return
	}
	readyS := 0
	ints := []struct {
		key string
		dst *int
		max int
	}{{"cpus", &o.CPUs, 64}, {"memory_mb", &o.MemoryMiB, 1 << 20}, {"disk_mb", &o.DiskMiB, 1 << 24}, {"ready_timeout_s", &readyS, 3600}}
	for _, f := range ints {
		v := q.Get(f.key)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > f.max {
			s.fail(w, r, invalidf("%s must be an integer between 0 and %d", f.key, f.max))
			return
		}
		*f.dst = n
	}
	o.ReadyTimeout = time.Duration(readyS) * time.Second
	if args := q["build_arg"]; len(args) > 0 {
		o.BuildArgs = map[string]string{}
		for _, a := range args {
			k, v, ok := strings.Cut(a, "=")
			if !ok || k == "" {
				s.fail(w, r, invalidf("build_arg %q: use NAME=VALUE", a))
				return
			}
			o.BuildArgs[k] = v
		}
	}
	nw := newNDJSON(w, false)
	started := false
	begin := func() {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
	}
	o.Progress = func(ev sandbox.BuildEvent) {
		begin()
		if ev.Kind == "built" {
			return // the last line, below
		}
		_ = nw.line(ev)
	}
	t, err := s.cfg.Templates.BuildTemplateFromTar(r.Context(), callerOf(r), o, http.MaxBytesReader(w, r.Body, sandbox.MaxBuildContextBytes+(256<<20)), q.Get("dockerfile"))
	if err != nil {
		if !started {
			s.fail(w, r, err)
			return
		}
		pe := publicError(err)
		line := map[string]any{"kind": "error", "message": pe.Message, "code": pe.Code}
		if be, ok := errors.AsType[*sandbox.BuildError](err); ok {
			line["step"], line["steps"], line["line"], line["text"] = be.Step, be.Steps, be.Line, be.Text
			if be.ExitCode != nil {
				line["exit_code"] = *be.ExitCode
			}
		}
		_ = nw.line(line)
		return
	}
	begin()
	_ = nw.line(map[string]any{"kind": "built", "elapsed_ms": t.BuildMS, "template": viewTemplate(t)})
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil {
		s.fail(w, r, errNoTemplates)
		return
	}
	ts, err := s.cfg.Templates.ListTemplates(r.Context(), callerOf(r), truthy(r.URL.Query().Get("all")))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []Template{}
	for _, t := range ts {
		out = append(out, viewTemplate(t))
	}
	writeJSON(w, http.StatusOK, map[string][]Template{"templates": out})
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil {
		s.fail(w, r, errNoTemplates)
		return
	}
	t, err := s.cfg.Templates.GetTemplate(r.Context(), callerOf(r), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, templateErr(err))
		return
	}
	writeJSON(w, http.StatusOK, viewTemplate(t))
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil {
		s.fail(w, r, errNoTemplates)
		return
	}
	if err := s.cfg.Templates.RemoveTemplate(r.Context(), callerOf(r), r.PathValue("name")); err != nil {
		s.fail(w, r, templateErr(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pruneTemplates(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil {
		s.fail(w, r, errNoTemplates)
		return
	}
	n, err := s.cfg.Templates.PruneTemplateCache(r.Context(), callerOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"removed": n})
}

// templateLog answers the log of the tenant's last build of {name}, as
// text; 404 if there is none.
func (s *Server) templateLog(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil {
		s.fail(w, r, errNoTemplates)
		return
	}
	var b bytes.Buffer
	if err := s.cfg.Templates.TemplateLog(r.Context(), callerOf(r), r.PathValue("name"), &b); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			s.fail(w, r, errNoBuildLog)
			return
		}
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b.Bytes())
}

var errNoBuildLog = &Error{http.StatusNotFound, "not_found", "no build log of that template name (a log is kept for the last build of each name, failed ones too)"}
