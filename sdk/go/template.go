package airlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Template is a template of the key's tenant, built from a Dockerfile:
// sandboxes created with its name as the image start as clones of its
// saved state, with its start command already running.
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

// BuildOptions say how BuildTemplate builds.
type BuildOptions struct {
	// Dockerfile is the Dockerfile's path in the context ("": Dockerfile).
	Dockerfile string
	// Start is the command started after the last step ("": the
	// Dockerfile's ENTRYPOINT and CMD); Ready a shell command retried
	// until it exits 0 before the template is saved, for at most
	// ReadyTimeout (0: the server's default, 2 minutes).
	Start, Ready string
	ReadyTimeout time.Duration
	BuildArgs    map[string]string
	// CPUs, MemoryMB and DiskMB size the template's sandboxes.
	CPUs, MemoryMB, DiskMB int
	// NoCache runs every step again.
	NoCache bool
	// Progress gets each event of the build as it happens.
	Progress func(BuildEvent)
}

// BuildEvent is one line of a build's progress. Kind is "step" (step Step
// of Steps starts), "cached" (its result was found), "config" (a step that
// only sets configuration was applied), "output" (a chunk of
// its output), "done" (it ended after ElapsedMS), "status" (Message) or
// "error" (Message; ExitCode for a failed RUN).
type BuildEvent struct {
	Kind      string `json:"kind"`
	Step      int    `json:"step,omitempty"`
	Steps     int    `json:"steps,omitempty"`
	Line      int    `json:"line,omitempty"`
	Text      string `json:"text,omitempty"`
	Output    string `json:"output,omitempty"`
	Message   string `json:"message,omitempty"`
	Code      string `json:"code,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	ElapsedMS int64  `json:"elapsed_ms,omitempty"`
}

// BuildError is a build that failed after it started: Event is its
// "error" line.
type BuildError struct{ Event BuildEvent }

func (e *BuildError) Error() string { return "airlock: template build: " + e.Event.Message }

// BuildTemplate builds (or rebuilds) template name on the server from the
// build context tarball (a tar stream of the context directory; the
// Dockerfile in it, see BuildOptions.Dockerfile). Progress goes to
// o.Progress; the build runs server-side in sandboxes of the key's tenant
// and is cancelled with ctx. A failed step is a *BuildError.
func (c *Client) BuildTemplate(ctx context.Context, name string, buildContext io.Reader, o BuildOptions) (*Template, error) {
	q := url.Values{}
	set := func(k, v string) {
		if v != "" {
			q.Set(k, v)
		}
	}
	set("dockerfile", o.Dockerfile)
	set("start", o.Start)
	set("ready", o.Ready)
	if o.ReadyTimeout > 0 {
		q.Set("ready_timeout_s", strconv.Itoa(int((o.ReadyTimeout+time.Second-1)/time.Second)))
	}
	for k, v := range o.BuildArgs {
		q.Add("build_arg", k+"="+v)
	}
	for k, v := range map[string]int{"cpus": o.CPUs, "memory_mb": o.MemoryMB, "disk_mb": o.DiskMB} {
		if v != 0 {
			q.Set(k, strconv.Itoa(v))
		}
	}
	if o.NoCache {
		q.Set("no_cache", "true")
	}
	req, err := c.newRequest(ctx, http.MethodPost, templatePath(name)+"/build", q, uploadBody(buildContext))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req, http.StatusOK)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rr := newRecordReader(resp.Body, 1<<20)
	for {
		rec, _, err := rr.next()
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("airlock: template build: the server's stream ended before the build did")
			}
			return nil, fmt.Errorf("airlock: template build: %w", err)
		}
		var line struct {
			BuildEvent
			Template *Template `json:"template"`
		}
		if err := json.Unmarshal(rec, &line); err != nil {
			return nil, fmt.Errorf("airlock: template build: bad line: %w", err)
		}
		switch line.Kind {
		case "built":
			return line.Template, nil
		case "error":
			if o.Progress != nil {
				o.Progress(line.BuildEvent)
			}
			return nil, &BuildError{line.BuildEvent}
		}
		if o.Progress != nil {
			o.Progress(line.BuildEvent)
		}
	}
}

// ListTemplates returns the key's tenant's templates.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/templates", nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// GetTemplate returns template name (ErrNotFound if the tenant has none).
func (c *Client) GetTemplate(ctx context.Context, name string) (*Template, error) {
	var t Template
	if err := c.doJSON(ctx, http.MethodGet, templatePath(name), nil, nil, &t, http.StatusOK); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate removes template name; sandboxes running from it go on.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.doJSON(ctx, http.MethodDelete, templatePath(name), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}

// PruneTemplates removes the tenant's saved build steps (the build cache)
// and the saved states of replaced templates nothing uses; it returns
// how many it removed.
func (c *Client) PruneTemplates(ctx context.Context) (int, error) {
	var out struct {
		Removed int `json:"removed"`
	}
	if err := c.doJSON(ctx, http.MethodPost, "/v1/templates/prune", nil, nil, &out, http.StatusOK); err != nil {
		return 0, err
	}
	return out.Removed, nil
}

// TemplateLog returns the log of the tenant's last build of name, as text
// (kept for failed builds too); ErrNotFound if there is none.
func (c *Client) TemplateLog(ctx context.Context, name string) (string, error) {
	req, err := c.newRequest(ctx, http.MethodGet, templatePath(name)+"/log", nil, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.send(req, http.StatusOK)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return "", fmt.Errorf("airlock: template log: %w", err)
	}
	return string(b), nil
}

func templatePath(name string) string { return "/v1/templates/" + url.PathEscape(name) }
