package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// EnvdVersion is the envd version airlock reports. E2B's SDKs refuse a
// sandbox below 0.1.0 and take their modern paths (a default user,
// closeStdin, octet-stream uploads) from 0.5.7.
const EnvdVersion = "0.5.7"

// DefaultTimeout is a create's lifetime when the request sets none (E2B's
// default; SDK 2.51 omits the field unless the user gives one).
const DefaultTimeout = 300 * time.Second

// maxBody caps every JSON request body.
const maxBody = 1 << 20

// Config is what the adapter needs.
type Config struct {
	// Sandboxes, Execs and Files are the manager (the same one /v1 uses).
	Sandboxes api.Sandboxes
	Execs     api.Execs
	Files     api.Files
	Contexts  api.Contexts
	// Snapshots is the manager's snapshot and fork part (E2B's snapshots,
	// fork, and creates from a snapshot).
	Snapshots api.Snapshots
	// Secret (at least 32 bytes, the same for every server of the state
	// dir) derives each sandbox's envd access token.
	Secret []byte
	// Limiter takes one request from a tenant's rate limit for in-sandbox
	// traffic, which carries no API key (nil: none).
	Limiter func(tenant string) bool
	// Domain is returned as each sandbox's domain ("" returns null, and
	// the SDK keeps its E2B_DOMAIN): the API's preview domain, where
	// getHost(port) is served.
	Domain string
	// TrafficToken is a sandbox's trafficAccessToken, which E2B's SDKs
	// send to the code interpreter and preview hosts (nil: the API
	// server's preview token, api.Server.PreviewToken).
	TrafficToken func(id string) string
	Log          *slog.Logger
}

// Register mounts E2B's control-plane routes on srv, behind its key check
// and rate limit. Call it before serving.
func Register(srv *api.Server, cfg Config) error {
	switch {
	case cfg.Sandboxes == nil || cfg.Execs == nil || cfg.Files == nil || cfg.Contexts == nil || cfg.Snapshots == nil:
		return errors.New("e2b: Sandboxes, Execs, Files, Contexts and Snapshots are required")
	case len(cfg.Secret) < 32:
		return errors.New("e2b: Secret must be at least 32 bytes")
	}
	if cfg.TrafficToken == nil {
		cfg.TrafficToken = srv.PreviewToken
	}
	if cfg.TrafficToken("probe") == "" {
		return errors.New("e2b: the API server has no Secret for preview tokens (trafficAccessToken)")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	h := &handler{cfg: cfg}
	h.envd, h.interpreter = h.newEnvd(), h.newInterpreter()
	srv.RouteByHeader("E2b-Sandbox-Id", http.HandlerFunc(h.inSandbox))
	srv.HandlePublic("GET /files", http.HandlerFunc(h.signedFiles))
	srv.HandlePublic("POST /files", http.HandlerFunc(h.signedFiles))
	for _, rt := range []struct {
		pattern string
		fn      func(http.ResponseWriter, *http.Request, sandbox.Caller)
	}{
		{"POST /sandboxes", h.create},
		{"POST /v2/sandboxes", h.create},
		{"GET /sandboxes", h.list},
		{"GET /v2/sandboxes", h.list},
		{"GET /sandboxes/{id}", h.get},
		{"DELETE /sandboxes/{id}", h.kill},
		{"POST /sandboxes/{id}/timeout", h.setTimeout},
		{"POST /sandboxes/{id}/connect", h.connect},
		{"POST /v2/sandboxes/{id}/connect", h.connect},
		{"POST /sandboxes/{id}/resume", h.connect},
		{"POST /sandboxes/{id}/pause", h.pause},
		{"POST /sandboxes/{id}/fork", h.fork},
		{"POST /sandboxes/{id}/snapshots", h.createSnapshot},
		{"GET /snapshots", h.listSnapshots},
		{"DELETE /templates/{id}", h.deleteSnapshot},
		{"PUT /sandboxes/{id}/network", h.updateNetwork},
		{"GET /sandboxes/{id}/metrics", h.metrics},
		// E2B features airlock lacks: E2B's error shape with a message that
		// says so, never a silent success or a bare 404.
		{"/secrets", lacks("E2B's secrets store (Secret)", "pass values as envs, or use airlock's /v1 secrets, which the guest never sees")},
		{"/secrets/", lacks("E2B's secrets store (Secret)", "pass values as envs, or use airlock's /v1 secrets, which the guest never sees")},
		{"/volumes", lacks("volumes", "keep data in a snapshot, or copy it with files.write")},
		{"/volumes/", lacks("volumes", "keep data in a snapshot, or copy it with files.write")},
		{"/volumecontent/", lacks("volumes", "keep data in a snapshot, or copy it with files.write")},
		{"/v3/templates", lacks("E2B's template builds (Template.build)", "build an airlock template from a Dockerfile (airlock template build, or POST /v1/templates/{name}/build) and use its name as the templateID")},
		{"/v2/templates/", lacks("E2B's template builds (Template.build)", "build an airlock template from a Dockerfile (airlock template build, or POST /v1/templates/{name}/build) and use its name as the templateID")},
		{"/templates/", lacks("E2B's template management (aliases, tags, builds)", "use an airlock template or image name as the templateID (airlock template ls); snapshots are deleted with DELETE /templates/{snapshotID}")},
	} {
		fn := rt.fn
		srv.HandleAuthenticated(rt.pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c, ok := api.CallerOf(r.Context())
			if !ok {
				writeError(w, http.StatusUnauthorized, "unauthenticated")
				return
			}
			c.Via = "e2b"
			fn(w, r, c)
		}))
	}
	return nil
}

type handler struct {
	cfg         Config
	envd        http.Handler // envd's port: process, filesystem, /files, /health
	interpreter http.Handler // the code interpreter's port: /execute, /contexts
}

// Sandbox is E2B's answer to a create or connect.
type Sandbox struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	Alias              *string `json:"alias,omitempty"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    *string `json:"envdAccessToken,omitempty"`
	Domain             *string `json:"domain"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
}

// ListedSandbox is one entry of a list.
type ListedSandbox struct {
	SandboxID    string            `json:"sandboxID"`
	TemplateID   string            `json:"templateID"`
	ClientID     string            `json:"clientID"`
	Alias        *string           `json:"alias,omitempty"`
	Metadata     map[string]string `json:"metadata"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	State        string            `json:"state"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int               `json:"memoryMB"`
	DiskSizeMB   int               `json:"diskSizeMB"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []VolumeMount     `json:"volumeMounts"`
}

// VolumeMount is E2B's volume mount: a volume of the tenant, mounted
// read-write (E2B has no read-only mounts; a sandbox that mounts a volume
// read-only through airlock's /v1 API lists it here all the same).
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// SandboxDetail is the answer to a get.
type SandboxDetail struct {
	ListedSandbox
	AllowInternetAccess bool            `json:"allowInternetAccess"`
	Domain              *string         `json:"domain"`
	Lifecycle           map[string]any  `json:"lifecycle"`
	Network             json.RawMessage `json:"network,omitempty"`
}

// clientID is what E2B's schema requires and no SDK reads.
const clientID = "airlock"

func (h *handler) domain() *string {
	if h.cfg.Domain == "" {
		return nil
	}
	d := h.cfg.Domain
	return &d
}

// newSandboxRequest is E2B's NewSandbox (v1) and NewSandboxV2: the fields
// airlock maps, and the ones it refuses rather than ignore.
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *struct {
		AllowOut           []string        `json:"allowOut"`
		DenyOut            []string        `json:"denyOut"`
		Rules              json.RawMessage `json:"rules"`
		EgressProxy        json.RawMessage `json:"egressProxy"`
		AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
		MaskRequestHost    json.RawMessage `json:"maskRequestHost"`
		HTTPSPorts         json.RawMessage `json:"httpsPorts"`
	} `json:"network"`
	VolumeMounts    []VolumeMount   `json:"volumeMounts"`
	MCP             json.RawMessage `json:"mcp"`
	IAM             json.RawMessage `json:"iam"`
	AutoPause       *bool           `json:"autoPause"`
	AutoPauseMemory *bool           `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
}

// allTraffic is E2B's ALL_TRAFFIC: a denyOut entry that denies everything.
const allTraffic = "0.0.0.0/0"

// set reports whether a raw JSON field was given a value.
func set(raw json.RawMessage) bool {
	v := strings.TrimSpace(string(raw))
	return v != "" && v != "null" && v != "{}" && v != "[]"
}

// refusal is why a create asks for something airlock does not do ("" if
// nothing): never a silent success.
func (req *newSandboxRequest) refusal() string {
	switch {
	case slices.ContainsFunc(req.VolumeMounts, func(v VolumeMount) bool { return v.Name == "" || v.Path == "" }):
		return "volumeMounts: each needs a name and a path"
	case set(req.MCP):
		return "mcp is not supported by airlock's E2B surface"
	case set(req.IAM):
		return "iam tokens are not supported by airlock"
	case req.AutoPause != nil && *req.AutoPause, req.AutoResume != nil && req.AutoResume.Enabled:
		return "lifecycle onTimeout 'pause' and autoResume are not supported by airlock's E2B surface yet: a sandbox is killed when its timeout passes (airlock's /v1 API has idle pause)"
	case req.Network == nil:
		return ""
	case set(req.Network.Rules):
		return "network.rules (request transforms) are not supported by airlock's E2B surface; airlock's /v1 API injects secrets into requests to named hosts"
	case set(req.Network.EgressProxy):
		return "network.egressProxy is not supported by airlock"
	case set(req.Network.MaskRequestHost), set(req.Network.HTTPSPorts):
		return "network.maskRequestHost and httpsPorts are not supported by airlock"
	case req.Network.AllowPublicTraffic != nil && *req.Network.AllowPublicTraffic:
		return "allowPublicTraffic: true is not supported: airlock's preview hosts always need the sandbox's trafficAccessToken (or an API key)"
	}
	for _, d := range req.Network.DenyOut {
		if d != allTraffic {
			return fmt.Sprintf("network.denyOut %q: airlock denies all traffic (%s) with allowOut exceptions, or nothing; it has no deny list", d, allTraffic)
		}
	}
	return ""
}

// egress maps allow_internet_access and network.allowOut/denyOut to an
// airlock network: denying all traffic (allow_internet_access false, or
// denyOut 0.0.0.0/0) is mode deny with allowOut as its allow rules; else
// everything is allowed (allowOut adds nothing) and the mode is public.
func (req *newSandboxRequest) egress() netconf.Spec {
	denyAll := req.AllowInternetAccess != nil && !*req.AllowInternetAccess
	var allow []string
	if req.Network != nil {
		denyAll = denyAll || slices.Contains(req.Network.DenyOut, allTraffic)
		allow = req.Network.AllowOut
	}
	if !denyAll {
		return netconf.Spec{}
	}
	return netconf.Spec{Mode: "deny", Allow: slices.Clone(allow)}
}

// templateImages maps E2B's well-known template names to airlock images.
var templateImages = map[string]string{
	"code-interpreter-v1": "base",
	"code-interpreter":    "base",
}

func (h *handler) create(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req newSandboxRequest
	if !decode(w, r, &req) {
		return
	}
	if why := req.refusal(); why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	timeout := DefaultTimeout
	if req.Timeout != nil {
		if !validTimeout(w, *req.Timeout) {
			return
		}
		timeout = time.Duration(*req.Timeout) * time.Second
	}
	// A templateID that names one of the tenant's snapshots starts from it
	// (E2B's Sandbox.create(snapshotID)); any other is an image.
	if req.TemplateID != "" {
		sn, err := h.cfg.Snapshots.GetSnapshot(r.Context(), c, "", req.TemplateID)
		switch {
		case err == nil:
			h.createFromSnapshot(w, r, c, req, sn, timeout)
			return
		case !errors.Is(err, errdefs.ErrNotFound):
			h.fail(w, r, err)
			return
		}
	}
	tmpl := req.TemplateID
	if tmpl == "" {
		tmpl = "base"
	}
	image := tmpl
	if im, ok := templateImages[tmpl]; ok {
		image = im
	}
	o := sandbox.CreateOptions{Image: image, Timeout: timeout, Metadata: req.Metadata, Env: req.EnvVars, Network: req.egress()}
	// E2B's volume mounts are read-write.
	for _, v := range req.VolumeMounts {
		o.Volumes = append(o.Volumes, sandbox.VolumeMount{Name: v.Name, Path: v.Path})
	}
	sb, err := h.cfg.Sandboxes.Create(r.Context(), c, o)
	if err != nil {
		switch {
		case errors.Is(err, errdefs.ErrNotFound) && len(o.Volumes) > 0:
			writeError(w, http.StatusNotFound, fmt.Sprintf("template %q or a volume of volumeMounts not found (volumes are made with airlock's /v1 API or CLI)", tmpl))
		case errors.Is(err, errdefs.ErrNotFound):
			writeError(w, http.StatusNotFound, fmt.Sprintf("template %q not found: build or import an airlock image of that name", tmpl))
		case len(o.Volumes) > 0:
			status, _, msg := api.PublicMountError(err)
			writeError(w, status, msg)
		default:
			h.fail(w, r, err)
		}
		return
	}
	writeJSON(w, http.StatusCreated, h.sandbox(sb, tmpl))
}

func (h *handler) sandbox(sb store.Sandbox, tmpl string) Sandbox {
	tok, traffic := h.accessToken(sb.ID), h.trafficToken(sb.ID)
	return Sandbox{SandboxID: sb.ID, TemplateID: tmpl, ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: &tok, TrafficAccessToken: &traffic, Domain: h.domain()}
}

// state is sb's state in E2B's terms, "" for one E2B does not show.
func state(sb store.Sandbox) string {
	switch sb.State {
	case store.StateCreating, store.StateRunning, store.StateResuming:
		return "running"
	case store.StatePausing, store.StatePaused:
		return "paused"
	}
	return ""
}

func listed(sb store.Sandbox) ListedSandbox {
	end := sb.ExpiresAt
	if sb.State == store.StatePaused {
		end = time.Now().Add(sb.LifetimeLeft)
	}
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return ListedSandbox{
		SandboxID: sb.ID, TemplateID: sb.Image, ClientID: clientID, Metadata: md,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(), State: state(sb),
		CPUCount: sb.CPUs, MemoryMB: sb.MemoryMiB, DiskSizeMB: sb.DiskMiB, EnvdVersion: EnvdVersion,
		VolumeMounts: volumeMounts(sb.Mounts),
	}
}

// volumeMounts are sb's volumes in E2B's terms (host directories, which
// E2B has no word for, are left out).
func volumeMounts(ms []store.Mount) []VolumeMount {
	out := []VolumeMount{}
	for _, m := range ms {
		if m.VolumeID != "" {
			out = append(out, VolumeMount{Name: m.VolumeName, Path: m.Path})
		}
	}
	return out
}

// visible returns sandbox id as c may see it in E2B's terms, or answers
// 404 (a failed sandbox is in no state E2B knows) and returns false.
func (h *handler) visible(w http.ResponseWriter, r *http.Request, c sandbox.Caller, id string) (store.Sandbox, bool) {
	sb, err := h.cfg.Sandboxes.Get(r.Context(), c, id)
	if err == nil && state(sb) == "" {
		err = sandbox.ErrNoSandbox
	}
	if err != nil {
		h.fail(w, r, err)
		return sb, false
	}
	return sb, true
}

func (h *handler) get(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, ok := h.visible(w, r, c, r.PathValue("id"))
	if !ok {
		return
	}
	d := SandboxDetail{ListedSandbox: listed(sb), AllowInternetAccess: sb.Network.Mode != "deny" && sb.Network.Mode != "none" && len(sb.Network.Allow) == 0,
		Domain: h.domain(), Lifecycle: map[string]any{"onTimeout": "kill", "autoResume": false}}
	writeJSON(w, http.StatusOK, d)
}

// list serves GET /v2/sandboxes (and the v1 route older SDKs call):
// state (a comma list) and metadata filters, newest first, limit and
// nextToken (the id of the last entry of the previous page, in
// X-Next-Token).
func (h *handler) list(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	states := []string{"running", "paused"}
	if v := q.Get("state"); v != "" {
		states = strings.Split(v, ",")
		for _, s := range states {
			if s != "running" && s != "paused" {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("state %q: want running or paused", s))
				return
			}
		}
	}
	md, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit, ok := pageLimit(w, q.Get("limit"))
	if !ok {
		return
	}
	sbs, err := h.cfg.Sandboxes.List(r.Context(), c)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	slices.SortFunc(sbs, func(a, b store.Sandbox) int {
		if d := b.CreatedAt.Compare(a.CreatedAt); d != 0 {
			return d
		}
		return strings.Compare(a.ID, b.ID)
	})
	writePage(w, sbs, q.Get("nextToken"), limit, func(sb store.Sandbox) string { return sb.ID }, func(sb store.Sandbox) bool {
		st := state(sb)
		return st != "" && slices.Contains(states, st) && matches(sb.Metadata, md)
	}, listed)
}

// metadataFilter parses E2B's metadata query parameter: after the normal
// query decoding, one more URL decoding of the whole, then "k=v" pairs
// joined by "&", each key and value URL-encoded once more.
func metadataFilter(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	whole, err := url.QueryUnescape(v)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(whole, "&") {
		k, val, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("metadata: %q is not key=value", pair)
		}
		if k, err = url.QueryUnescape(k); err == nil {
			val, err = url.QueryUnescape(val)
		}
		if err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		out[k] = val
	}
	return out, nil
}

func matches(md, want map[string]string) bool {
	for k, v := range want {
		if md[k] != v {
			return false
		}
	}
	return true
}

func (h *handler) kill(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := h.cfg.Sandboxes.Remove(r.Context(), c, r.PathValue("id")); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *handler) setTimeout(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Timeout == nil || *req.Timeout < 0 || *req.Timeout > int(sandbox.MaxTimeout/time.Second) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout (seconds) is required, between 0 and %d", int(sandbox.MaxTimeout/time.Second)))
		return
	}
	if err := h.cfg.Sandboxes.SetTimeout(r.Context(), c, r.PathValue("id"), time.Duration(*req.Timeout)*time.Second); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect resumes a paused sandbox (201) or answers a running one (200);
// a timeout in the body sets the lifetime from now.
func (h *handler) connect(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Timeout *int  `json:"timeout"`
		Memory  *bool `json:"memory"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Timeout != nil && !validTimeout(w, *req.Timeout) {
		return
	}
	id := r.PathValue("id")
	sb, ok := h.visible(w, r, c, id)
	if !ok {
		return
	}
	status := http.StatusOK
	if state(sb) == "paused" {
		var err error
		if sb, err = h.cfg.Sandboxes.Resume(r.Context(), c, id); err != nil {
			h.fail(w, r, err)
			return
		}
		status = http.StatusCreated
	}
	if req.Timeout != nil {
		if err := h.cfg.Sandboxes.SetTimeout(r.Context(), c, id, time.Duration(*req.Timeout)*time.Second); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	writeJSON(w, status, h.sandbox(sb, sb.Image))
}

// pause pauses a running sandbox with its memory (204); a paused one is
// 409, which the SDK reads as "already paused".
func (h *handler) pause(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Memory != nil && !*req.Memory {
		writeError(w, http.StatusBadRequest, "airlock pauses keep memory; memory: false is not supported")
		return
	}
	id := r.PathValue("id")
	sb, ok := h.visible(w, r, c, id)
	if !ok {
		return
	}
	if state(sb) == "paused" {
		writeError(w, http.StatusConflict, "the sandbox is already paused")
		return
	}
	if _, err := h.cfg.Sandboxes.Pause(r.Context(), c, id, false); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// lacks answers a route of an E2B feature airlock lacks: 501 in E2B's
// error shape, saying what instead.
func lacks(what, instead string) func(http.ResponseWriter, *http.Request, sandbox.Caller) {
	return func(w http.ResponseWriter, _ *http.Request, _ sandbox.Caller) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("airlock does not have %s; %s", what, instead))
	}
}

// validTimeout reports whether a create's or connect's timeout (seconds)
// is a lifetime airlock gives, and answers 400 if not.
func validTimeout(w http.ResponseWriter, s int) bool {
	if s < 1 || s > int(sandbox.MaxTimeout/time.Second) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout must be between 1 and %d seconds", int(sandbox.MaxTimeout/time.Second)))
		return false
	}
	return true
}

// decode reads a JSON body of at most maxBody into v; an empty body leaves
// v as it is. Unknown fields are ignored: E2B's SDKs send many that
// airlock has no use for.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	err := json.NewDecoder(r.Body).Decode(v)
	if err == nil || errors.Is(err, io.EOF) {
		return true
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", maxBody))
		return false
	}
	writeError(w, http.StatusBadRequest, "bad JSON body: "+err.Error())
	return false
}

// fail answers with err's public face in E2B's error shape.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, _, msg := api.PublicError(err)
	if status >= 500 {
		h.cfg.Log.Error("e2b request failed", "route", r.Pattern, "err", err)
	}
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, status, msg)
}

// writeError writes E2B's error body: {"code": status, "message": msg}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
