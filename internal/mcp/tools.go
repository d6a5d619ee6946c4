package mcp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

const instructions = `airlock runs untrusted code in disposable microVM sandboxes.
Use run_code (python, javascript or bash; state persists in a code context) or exec
(a command line). Without sandbox_id both use this session's own sandbox, created on
first use. Sandboxes this session creates are removed when the session ends. File tools
act on paths inside a sandbox only; nothing on the host is reachable. Sandboxes reach
the public internet by default (never private, loopback or cloud metadata addresses);
sandbox_create takes network "deny" with allow rules, or "none"; sandbox_network_set
changes a sandbox's egress policy while it runs. A paused sandbox
(sandbox_pause, or idle_pause_s) resumes by itself on the next call. sandbox_snapshot
saves a sandbox to start others from (sandbox_create from_snapshot); sandbox_fork copies
a live one. The browser_* tools drive Chromium in a sandbox made from the browser image:
browser_navigate, then browser_snapshot (the page's accessibility tree, each element with
a ref such as e12) and browser_click / browser_type by ref, browser_screenshot,
browser_text, browser_eval, tabs and downloads. Without sandbox_id they use this
session's browser sandbox, created on first use and separate from run_code's.`

// newServer returns the sdk.Server of session s with every tool.
func (h *Handler) newServer(s *session) *sdk.Server {
	srv := sdk.NewServer(&sdk.Implementation{Name: "airlock", Version: h.cfg.Version}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       h.log,
		Capabilities: &sdk.ServerCapabilities{
			Tools:     &sdk.ToolCapabilities{ListChanged: true},
			Resources: &sdk.ResourceCapabilities{ListChanged: true},
		},
		InitializedHandler: func(_ context.Context, req *sdk.InitializedRequest) { s.watch(req.Session) },
	})
	t := &tools{h: h, s: s}
	add(srv, t, "sandbox_create", `Create a new sandbox (a microVM) and return its id and details. Usually unnecessary: run_code and exec create this session's sandbox on first use. Sandboxes created here are removed when this MCP session ends. Network: "public" (default: public internet only; private, loopback, link-local and metadata addresses are always refused), "deny" (only what "allow" names: domains, *.suffix, IPs, CIDRs, each with an optional :port) or "none". Published ports ("ports") need an admin key (others reach a port through the preview route). Secrets: by the name of a secret in the user's vault (set with "airlock secret set", never a value here): the guest sees a placeholder in $NAME and the host puts the real value into requests to the secret's hosts only.`, t.sandboxCreate)
	add(srv, t, "sandbox_list", "List the sandboxes this session may use (its tenant's), with state, size and expiry. Those created by this session are marked.", t.sandboxList)
	add(srv, t, "sandbox_kill", "Stop and delete a sandbox now, with everything in it.", t.sandboxKill)
	add(srv, t, "sandbox_pause", "Pause a sandbox: its memory, processes and disk are saved to the server's disk and its RAM is freed; its lifetime stops counting. The next call on it (run_code, exec, files, or sandbox_resume) resumes it with everything as it was (variables, processes), though the guest's open TCP connections are reset. Commands still running are parked and go on after the resume; refused while code runs unless force (which ends it and the commands).", t.sandboxPause)
	add(srv, t, "sandbox_resume", "Resume a paused sandbox now (any other call on it resumes it too). A running sandbox is left as it is.", t.sandboxResume)
	add(srv, t, "sandbox_snapshot", "Save a sandbox (memory, processes, files) as a named snapshot; the sandbox keeps running (saved while it runs: it stops only while its memory is written out, and keeps its open TCP connections). Start new sandboxes from it with sandbox_create from_snapshot. Running commands go on (in the snapshot too); refused while code runs unless force, and for sandboxes with secrets.", t.sandboxSnapshot)
	add(srv, t, "sandbox_fork", "Make count (1-16, default 1) running copies of a sandbox, each with its processes, variables and files as they are now (a fresh clock and network stack each). The source is saved while it runs (it stops only while its memory is written out). The copies belong to this session like created sandboxes (removed when it ends). Returns their ids.", t.sandboxFork)
	add(srv, t, "sandbox_secret_set", `Give a running or paused sandbox a secret from the user's vault, now (or replace its secret of that name): by the vault secret's name, never a value. The guest's new commands see a placeholder in $NAME (name, default the vault name); the host puts the real value into new requests to the secret's hosts only (the vault secret's, or fewer given in hosts). A paused sandbox gets it when it resumes.`, t.sandboxSecretSet)
	add(srv, t, "sandbox_secret_remove", `Remove a secret from a running or paused sandbox, now: no request gets its value from then on (connections that did are closed) and new commands no longer see $NAME.`, t.sandboxSecretRemove)
	add(srv, t, "sandbox_network_set", `Replace a sandbox's egress policy now, whole: network "public" (the public internet; private, loopback, link-local and metadata addresses stay refused) or "deny" (only what "allow" names: domains, *.suffix, IPs, CIDRs, each with an optional :port); every rule not given is removed. New connections follow it at once and open connections it forbids are closed. A paused sandbox gets it when it resumes. "none" cannot be set or left on a sandbox that exists. Returns the new policy and how many connections were closed.`, t.sandboxNetworkSet)
	add(srv, t, "sandbox_set_timeout", "Set a sandbox's remaining lifetime: it is stopped and deleted timeout_s seconds from now.", t.sandboxSetTimeout)
	add(srv, t, "run_code", "Run code in a stateful code context (like a Jupyter kernel: variables and imports persist between calls of one context). Returns stdout, stderr, the value of the last expression, and images as image content: every matplotlib figure left open (whatever the backend, Agg too; they are closed after), and with return_files the image files the code wrote. An exception is returned as an error result with its traceback. A context whose interpreter died (e.g. out of memory) is restarted by the next call, whose stderr says so first; its state is lost. The first python call of a sandbox starts the interpreter (seconds). Without sandbox_id the session's own sandbox is used (created on first use).", t.runCode)
	add(srv, t, "exec", "Run a command in a sandbox and wait for it: returns stdout, stderr and the exit code. cmd is an argv array (no shell); use [\"bash\",\"-lc\",\"...\"] for shell syntax. Without sandbox_id the session's own sandbox is used (created on first use).", t.exec)
	add(srv, t, "file_read", "Read a file inside a sandbox. Text comes back as text; binary data as base64 (PNG/JPEG also as an image). Large files are cut at max_bytes with a note.", t.fileRead)
	add(srv, t, "file_write", "Write a file inside a sandbox (parent directories are made; an existing file is replaced). Give content as text, or as base64 with encoding \"base64\".", t.fileWrite)
	add(srv, t, "file_list", "List a directory inside a sandbox: type, size, mode and path of each entry.", t.fileList)
	add(srv, t, "context_create", "Create a code context (a fresh interpreter) in a sandbox for run_code: language python (default), javascript or bash, with an optional id, working directory and environment.", t.contextCreate)
	add(srv, t, "context_list", "List the code contexts of a sandbox with their language and state (idle, busy, or dead: reset it).", t.contextList)
	add(srv, t, "context_reset", "Restart a code context: its interpreter is replaced with a fresh one (all its variables are lost); the id stays.", t.contextReset)
	addBrowserTools(srv, t)
	return srv
}

// add registers a tool whose handler returns text or an error; errors
// become error results with their public text.
func add[In any](srv *sdk.Server, t *tools, name, desc string, fn func(ctx context.Context, in In) (*sdk.CallToolResult, error)) {
	sdk.AddTool(srv, &sdk.Tool{Name: name, Description: desc}, func(ctx context.Context, req *sdk.CallToolRequest, in In) (*sdk.CallToolResult, any, error) {
		t.s.watch(req.Session)
		res, err := fn(ctx, in)
		if err != nil {
			if _, notStarted := guest.AsStartError(err); !notStarted && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
				t.h.log.Warn("mcp tool failed", "session", t.s.id, "tool", name, "err", err)
			}
			return errorResult(publicText(err)), nil, nil
		}
		return res, nil, nil
	})
}

type tools struct {
	h *Handler
	s *session
}

// timeout returns the call's deadline for timeout_s (0: the default).
func (t *tools) timeout(sec int) (time.Duration, error) {
	if sec < 0 || time.Duration(sec)*time.Second > t.h.cfg.MaxTimeout {
		return 0, fmt.Errorf("%w: timeout_s must be between 0 and %d", errdefs.ErrInvalid, int(t.h.cfg.MaxTimeout/time.Second))
	}
	if sec == 0 {
		return t.h.cfg.DefaultTimeout, nil
	}
	return time.Duration(sec) * time.Second, nil
}

// begin validates timeoutS (seconds, 0 for the default) and finds the
// sandbox a command or code runs in. It returns a context that outlives
// the timeout by 30 s, so the guest's own timeout fires first, its cancel
// (a no-op on error), the sandbox id and the timeout.
func (t *tools) begin(ctx context.Context, sandboxID string, timeoutS int) (context.Context, context.CancelFunc, string, time.Duration, error) {
	d, err := t.timeout(timeoutS)
	if err != nil {
		return ctx, func() {}, "", 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	id, err := t.s.target(ctx, sandboxID)
	if err != nil {
		cancel()
		return ctx, func() {}, "", 0, err
	}
	return ctx, cancel, id, d, nil
}

type createIn struct {
	Image        string            `json:"image,omitempty" jsonschema:"image or template name (a template of your tenant, built with airlock template build, goes first; default \"base\")"`
	CPUs         int               `json:"cpus,omitempty" jsonschema:"virtual CPUs, 1-32 (default 1)"`
	MemoryMB     int               `json:"memory_mb,omitempty" jsonschema:"memory in MiB, 128-65536 (default 512)"`
	TimeoutS     int               `json:"timeout_s,omitempty" jsonschema:"lifetime in seconds before the sandbox is deleted (default 900, at most 86400)"`
	Env          map[string]string `json:"env,omitempty" jsonschema:"default environment of every command and code context in the sandbox"`
	Metadata     map[string]string `json:"metadata,omitempty" jsonschema:"labels (keys 1-64 bytes, values at most 1024)"`
	Network      string            `json:"network,omitempty" jsonschema:"public (default), deny or none"`
	Allow        []string          `json:"allow,omitempty" jsonschema:"allow rules: example.com, *.example.com, 203.0.113.7, 203.0.113.0/24, each optionally :port or :lo-hi (makes the default mode deny)"`
	IdlePauseS   int               `json:"idle_pause_s,omitempty" jsonschema:"pause the sandbox after this many idle seconds (no command or code running, no call, no inbound connection); the next call resumes it. 0 (default): never; at most 604800"`
	FromSnapshot string            `json:"from_snapshot,omitempty" jsonschema:"start from this snapshot (see sandbox_snapshot): processes, variables and files as saved; its image, size, env and network are the snapshot's (leave image, cpus, memory_mb, env, network and allow out)"`
	Volumes      []volumeIn        `json:"volumes,omitempty" jsonschema:"named volumes to mount for the sandbox's life (at most 4; created with the CLI or HTTP API): a volume is mounted read-write by one sandbox at a time, or read-only by any number. Not with from_snapshot."`
	Ports        []portIn          `json:"ports,omitempty" jsonschema:"TCP ports to publish on the server's host (at most 32; admin keys only, others use the preview route); every connection is in the audit trail (net.inbound). Not with from_snapshot."`
	Secrets      []secretIn        `json:"secrets,omitempty" jsonschema:"secrets from the user's vault (by name, never a value): the guest sees a placeholder in $NAME, the host injects the real value into requests to the secret's hosts only. Not with from_snapshot."`
}

// secretIn is one secret of sandbox_create: a vault secret's name, never a
// value (an agent must not handle one).
type secretIn struct {
	Vault string   `json:"vault" jsonschema:"the name of a secret in the user's vault (airlock secret ls)"`
	Name  string   `json:"name,omitempty" jsonschema:"the guest environment variable that holds the placeholder (default: the vault name)"`
	Hosts []string `json:"hosts,omitempty" jsonschema:"hosts (names or *.suffix) the value may be sent to (default: the vault secret's; must be among them)"`
}

// vaultSecrets is in as the manager's secrets, each naming its vault
// secret.
func vaultSecrets(in []secretIn) ([]netconf.Secret, error) {
	var out []netconf.Secret
	for _, s := range in {
		if s.Vault == "" {
			return nil, fmt.Errorf("%w: secrets: each needs vault, the name of a secret in the user's vault (MCP never takes a secret's value)", errdefs.ErrInvalid)
		}
		out = append(out, netconf.Secret{Name: cmp.Or(s.Name, s.Vault), Hosts: s.Hosts, Vault: s.Vault})
	}
	return out, nil
}

// volumeIn is one volume of sandbox_create. Host directories are not
// offered over MCP: an agent picks its own arguments, and sharing host
// files is for the user to decide (CLI or HTTP API).
type volumeIn struct {
	Name     string `json:"name" jsonschema:"the volume's name"`
	Path     string `json:"path" jsonschema:"where the guest sees it: an absolute path such as /data"`
	ReadOnly bool   `json:"read_only,omitempty" jsonschema:"mount it read-only (default: read-write)"`
}

func volumeMounts(in []volumeIn) []sandbox.VolumeMount {
	var out []sandbox.VolumeMount
	for _, v := range in {
		out = append(out, sandbox.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return out
}

// errVolumeBusy is what a create learns when a volume it asked for is
// mounted elsewhere in a way that excludes its mount.
const errVolumeBusy = "a volume asked for is mounted by another sandbox: a volume is mounted read-write by one sandbox at a time, or read-only by any number, never both"

func (t *tools) sandboxCreate(ctx context.Context, in createIn) (*sdk.CallToolResult, error) {
	network := netconf.Spec{Mode: in.Network, Allow: in.Allow}
	var err error
	if network.Ports, err = publishPorts(t.s.p, in.Ports); err != nil {
		return nil, err
	}
	if _, err := network.Normalize(nil); err != nil {
		return nil, err
	}
	secrets, err := vaultSecrets(in.Secrets)
	if err != nil {
		return nil, err
	}
	network.Secrets = secrets
	if in.FromSnapshot != "" && len(secrets) > 0 {
		return nil, fmt.Errorf("%w: from_snapshot: a sandbox from a snapshot cannot have secrets; give it one with sandbox_secret_set once it runs", errdefs.ErrInvalid)
	}
	if in.CPUs < 0 || in.MemoryMB < 0 || in.TimeoutS < 0 || in.TimeoutS > int(sandbox.MaxTimeout/time.Second) {
		return nil, fmt.Errorf("%w: cpus and memory_mb must not be negative; timeout_s must be between 0 and %d", errdefs.ErrInvalid, int(sandbox.MaxTimeout/time.Second))
	}
	if in.IdlePauseS < 0 || in.IdlePauseS > int(sandbox.MaxIdlePause/time.Second) {
		return nil, fmt.Errorf("%w: idle_pause_s must be between 0 (never) and %d", errdefs.ErrInvalid, int(sandbox.MaxIdlePause/time.Second))
	}
	if in.FromSnapshot != "" {
		return t.createFromSnapshot(ctx, in)
	}
	sb, err := t.s.create(ctx, sandbox.CreateOptions{
		Image: in.Image, CPUs: in.CPUs, MemoryMiB: in.MemoryMB, Timeout: time.Duration(in.TimeoutS) * time.Second,
		Env: in.Env, Metadata: in.Metadata, Network: network, IdlePause: time.Duration(in.IdlePauseS) * time.Second,
		Volumes: volumeMounts(in.Volumes),
	})
	if err != nil {
		if len(in.Volumes) > 0 && errors.Is(err, errdefs.ErrConflict) {
			return errorResult(errVolumeBusy), nil
		}
		return nil, err
	}
	return jsonResult(viewSandbox(sb))
}

type listIn struct{}

func (t *tools) sandboxList(ctx context.Context, _ listIn) (*sdk.CallToolResult, error) {
	sbs, err := t.h.cfg.Service.List(ctx, t.s.p)
	if err != nil {
		return nil, err
	}
	t.s.mu.Lock()
	mine, def := slices.Clone(t.s.created), t.s.def
	t.s.mu.Unlock()
	type row struct {
		sandboxView
		Session bool `json:"created_by_this_session,omitempty"`
		Default bool `json:"session_default,omitempty"`
	}
	out := []row{}
	for _, sb := range sbs {
		out = append(out, row{viewSandbox(sb), slices.Contains(mine, sb.ID), sb.ID == def})
	}
	return jsonResult(map[string]any{"sandboxes": out})
}

type idIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
}

func (t *tools) sandboxKill(ctx context.Context, in idIn) (*sdk.CallToolResult, error) {
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	if err := t.h.cfg.Service.Remove(context.WithoutCancel(ctx), t.s.p, sb.ID); err != nil {
		return nil, err
	}
	t.s.removed(sb.ID)
	return textResult("sandbox " + sb.ID + " removed"), nil
}

// lifecycleTimeout bounds a pause or resume, which is not abandoned when
// the call is cancelled (a save or restore cut half-way helps nobody).
const lifecycleTimeout = 5 * time.Minute

type pauseIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Force     bool   `json:"force,omitempty" jsonschema:"end commands and code still running instead of refusing"`
}

func (t *tools) sandboxPause(ctx context.Context, in pauseIn) (*sdk.CallToolResult, error) {
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	t.s.br.disconnect(sb.ID) // the browser tools' connection would hold the pause off
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lifecycleTimeout)
	defer cancel()
	res, err := t.h.cfg.Service.Pause(lctx, t.s.p, sb.ID, in.Force)
	if err != nil {
		return nil, err
	}
	if sb, err = t.h.cfg.Service.Get(lctx, t.s.p, sb.ID); err != nil {
		return nil, err
	}
	return jsonResult(map[string]any{"sandbox": viewSandbox(sb), "state_bytes": res.StateBytes, "save_ms": res.Save.Milliseconds()})
}

func (t *tools) sandboxResume(ctx context.Context, in idIn) (*sdk.CallToolResult, error) {
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lifecycleTimeout)
	defer cancel()
	if sb, err = t.h.cfg.Service.Resume(lctx, t.s.p, sb.ID); err != nil {
		return nil, err
	}
	return jsonResult(viewSandbox(sb))
}

// forkBasePrefix names the manager's unlisted fork bases: not for users.
const forkBasePrefix = "_fork-"

func (t *tools) createFromSnapshot(ctx context.Context, in createIn) (*sdk.CallToolResult, error) {
	if in.Env != nil || in.Network != "" || in.Allow != nil {
		return nil, fmt.Errorf("%w: from_snapshot: env and network come from the snapshot; leave env, network and allow out", errdefs.ErrInvalid)
	}
	if in.Ports != nil {
		return nil, fmt.Errorf("%w: from_snapshot: a snapshot's sandboxes publish no ports; leave ports out", errdefs.ErrInvalid)
	}
	o := sandbox.CreateOptions{
		Image: in.Image, CPUs: in.CPUs, MemoryMiB: in.MemoryMB, Timeout: time.Duration(in.TimeoutS) * time.Second,
		Metadata: in.Metadata, IdlePause: time.Duration(in.IdlePauseS) * time.Second,
		Volumes: volumeMounts(in.Volumes), // the manager refuses them
	}
	sbs, err := t.s.boot(ctx, 1, func(ctx context.Context) ([]store.Sandbox, error) {
		ctx, cancel := context.WithTimeout(ctx, lifecycleTimeout)
		defer cancel()
		sb, err := t.h.cfg.Service.CreateFromSnapshot(ctx, t.s.p, in.FromSnapshot, o)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("%w: snapshot %q not found", errdefs.ErrNotFound, in.FromSnapshot)
		}
		if err != nil {
			return nil, err
		}
		return []store.Sandbox{sb}, nil
	})
	if err != nil {
		return nil, err
	}
	return jsonResult(viewSandbox(sbs[0]))
}

type snapshotIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to save"`
	Name      string `json:"name" jsonschema:"the snapshot's name: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"`
	Force     bool   `json:"force,omitempty" jsonschema:"end commands and code still running instead of refusing"`
}

// snapshotView is a snapshot as tools show it (never env or secrets).
type snapshotView struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Image     string    `json:"image"`
	CPUs      int       `json:"cpus"`
	MemoryMB  int       `json:"memory_mb"`
	DiskMB    int       `json:"disk_mb"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

func (t *tools) sandboxSnapshot(ctx context.Context, in snapshotIn) (*sdk.CallToolResult, error) {
	if strings.HasPrefix(in.Name, forkBasePrefix) {
		return nil, fmt.Errorf("%w: snapshot names starting with %q are reserved", errdefs.ErrInvalid, forkBasePrefix)
	}
	if err := sandbox.ValidateSnapshotName(in.Name); err != nil {
		return nil, err
	}
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lifecycleTimeout)
	defer cancel()
	t.s.br.disconnect(sb.ID)
	sn, err := t.h.cfg.Service.Snapshot(lctx, t.s.p, sb.ID, in.Name, in.Force)
	if err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return nil, fmt.Errorf("%w: a snapshot named %q exists", errdefs.ErrInvalid, in.Name)
		}
		return nil, err
	}
	return jsonResult(snapshotView{sn.Name, sn.ID, sn.SandboxID, sn.Image, sn.CPUs, sn.MemoryMiB, sn.DiskMiB, sn.Size, sn.Created.UTC()})
}

type forkIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox to copy"`
	Count     int    `json:"count,omitempty" jsonschema:"how many copies, 1-16 (default 1)"`
	Force     bool   `json:"force,omitempty" jsonschema:"end code (and commands) still running in the source instead of refusing"`
	Secrets   bool   `json:"secrets,omitempty" jsonschema:"bind the source's secret values in each copy"`
}

func (t *tools) sandboxFork(ctx context.Context, in forkIn) (*sdk.CallToolResult, error) {
	if in.Count == 0 {
		in.Count = 1
	}
	if in.Count < 1 || in.Count > sandbox.MaxForks {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", errdefs.ErrInvalid, sandbox.MaxForks)
	}
	src, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	forks, err := t.s.boot(ctx, in.Count, func(ctx context.Context) ([]store.Sandbox, error) {
		ctx, cancel := context.WithTimeout(ctx, lifecycleTimeout)
		defer cancel()
		t.s.br.disconnect(src.ID)
		return t.h.cfg.Service.Fork(ctx, t.s.p, src.ID, sandbox.ForkOptions{Count: in.Count, Force: in.Force, Secrets: in.Secrets})
	})
	if err != nil {
		return nil, err
	}
	views := make([]sandboxView, 0, len(forks))
	for _, f := range forks {
		views = append(views, viewSandbox(f))
	}
	return jsonResult(map[string]any{"sandboxes": views})
}

type networkSetIn struct {
	SandboxID string   `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Network   string   `json:"network,omitempty" jsonschema:"public or deny (default: deny when allow is given, else public)"`
	Allow     []string `json:"allow,omitempty" jsonschema:"the new allow rules (replacing all others): example.com, *.example.com, 203.0.113.7, 203.0.113.0/24, each optionally :port or :lo-hi"`
}

func (t *tools) sandboxNetworkSet(ctx context.Context, in networkSetIn) (*sdk.CallToolResult, error) {
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	ch, err := t.h.cfg.Service.SetNetwork(ctx, t.s.p, sb.ID, sandbox.EgressPolicy{Mode: in.Network, Allow: in.Allow})
	if err != nil {
		return nil, err
	}
	return jsonResult(map[string]any{"sandbox_id": sb.ID, "network": ch.Network.Mode, "allow": ch.Network.Allow,
		"closed_connections": ch.Closed, "applied": ch.Applied})
}

type secretSetIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	secretIn
}

func (t *tools) sandboxSecretSet(ctx context.Context, in secretSetIn) (*sdk.CallToolResult, error) {
	secs, err := vaultSecrets([]secretIn{in.secretIn})
	if err != nil {
		return nil, err
	}
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	ch, err := t.h.cfg.Service.SetSecret(ctx, t.s.p, sb.ID, secs[0], "")
	if err != nil {
		return nil, err
	}
	return secretResult(sb.ID, ch)
}

type secretRemoveIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Name      string `json:"name" jsonschema:"the secret's guest environment variable"`
}

func (t *tools) sandboxSecretRemove(ctx context.Context, in secretRemoveIn) (*sdk.CallToolResult, error) {
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	ch, err := t.h.cfg.Service.RemoveSecret(ctx, t.s.p, sb.ID, in.Name)
	if err != nil {
		return nil, err
	}
	return secretResult(sb.ID, ch)
}

// secretResult is what a live secret change answers: the sandbox's
// secrets by name and hosts (never values).
func secretResult(id string, ch sandbox.NetworkChange) (*sdk.CallToolResult, error) {
	type sec struct {
		Name  string   `json:"name"`
		Hosts []string `json:"hosts"`
		Vault string   `json:"vault,omitempty"`
	}
	secs := []sec{}
	for _, s := range ch.Network.Secrets {
		secs = append(secs, sec{s.Name, s.Hosts, s.Vault})
	}
	return jsonResult(map[string]any{"sandbox_id": id, "secrets": secs, "closed_connections": ch.Closed, "applied": ch.Applied})
}

type timeoutIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	TimeoutS  int    `json:"timeout_s" jsonschema:"seconds from now until the sandbox is deleted (1-86400)"`
}

func (t *tools) sandboxSetTimeout(ctx context.Context, in timeoutIn) (*sdk.CallToolResult, error) {
	if in.TimeoutS < 1 || in.TimeoutS > int(sandbox.MaxTimeout/time.Second) {
		return nil, fmt.Errorf("%w: timeout_s must be between 1 and %d", errdefs.ErrInvalid, int(sandbox.MaxTimeout/time.Second))
	}
	sb, err := t.s.sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, err
	}
	if err := t.h.cfg.Service.SetTimeout(ctx, t.s.p, sb.ID, time.Duration(in.TimeoutS)*time.Second); err != nil {
		return nil, err
	}
	if sb, err = t.h.cfg.Service.Get(ctx, t.s.p, sb.ID); err != nil {
		return nil, err
	}
	return jsonResult(viewSandbox(sb))
}

type execIn struct {
	Cmd       []string          `json:"cmd" jsonschema:"argv, e.g. [\"ls\",\"-la\",\"/\"] or [\"bash\",\"-lc\",\"echo $HOME | wc -c\"]"`
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"sandbox to run in (default: this session's sandbox, created on first use)"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory inside the sandbox"`
	TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (default 60)"`
}

func (t *tools) exec(ctx context.Context, in execIn) (*sdk.CallToolResult, error) {
	if len(in.Cmd) == 0 || in.Cmd[0] == "" {
		return nil, fmt.Errorf("%w: cmd must be a non-empty array", errdefs.ErrInvalid)
	}
	ctx, cancel, id, d, err := t.begin(ctx, in.SandboxID, in.TimeoutS)
	if err != nil {
		return nil, err
	}
	defer cancel()
	spec := guest.ExecSpec{Argv: in.Cmd, Env: in.Env, Cwd: in.Cwd, Timeout: d}
	st, err := t.h.cfg.Service.Exec(ctx, t.s.caller(), id, spec, true)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	out := newOutput(t.h.cfg.MaxOutputBytes)
	exit, err := guest.Drain(st, out.stdout, out.stderr)
	if err != nil {
		return nil, err
	}
	code := exit.Code
	status := fmt.Sprintf("exit_code: %d", code)
	if exit.Signal > 0 {
		code = -1
		status = fmt.Sprintf("exit_code: -1 (killed by signal %d)", exit.Signal)
	}
	if exit.OOMKilled {
		status += " (killed: out of memory)"
	}
	if exit.TimedOut {
		status += fmt.Sprintf(" (timed out after %s)", d)
	}
	if exit.Truncated {
		status += " (the guest dropped output beyond its cap)"
	}
	res := textResult(out.text(status + fmt.Sprintf("\nsandbox_id: %s\nduration_ms: %d", id, exit.Duration.Milliseconds())))
	res.StructuredContent = nil
	res.IsError = code != 0
	return res, nil
}

// publicText is what a client sees of err: the manager's own words for the
// categories whose messages name only the caller's values, a generic
// sentence for the others (their text may hold host paths).
func publicText(err error) string {
	if se, ok := guest.AsStartError(err); ok {
		return se.Error() // the sandbox is fine; the guest's reason
	}
	if fe, ok := errors.AsType[*sandbox.FloorError](err); ok {
		return fe.Error() // names the caller's own rule
	}
	if errors.Is(err, sandbox.ErrPortsNeedAdmin) {
		return err.Error()
	}
	for _, c := range []struct {
		err  error
		keep bool
		msg  string
	}{
		{errdefs.ErrInvalid, true, ""},
		{errdefs.ErrNotFound, true, ""},
		{errdefs.ErrFailedPrecondition, true, ""},
		{errdefs.ErrResourceExhausted, true, ""},
		{errdefs.ErrInsufficientStorage, false, "the server is short of disk space; retry later or ask for less"},
		{errdefs.ErrConflict, false, "conflict"},
		{errdefs.ErrUnsupported, true, ""},
		{errdefs.ErrUnavailable, false, "temporarily unavailable; retry later"},
		{context.DeadlineExceeded, false, "the call timed out (raise timeout_s)"},
	} {
		if errors.Is(err, c.err) {
			if c.keep {
				return strings.ReplaceAll(err.Error(), "--", "")
			}
			return c.msg
		}
	}
	return "internal error"
}

func errorResult(msg string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "error: " + msg}}, IsError: true}
}

func textResult(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

func jsonResult(v any) (*sdk.CallToolResult, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return textResult(string(b)), nil
}
