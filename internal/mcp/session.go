package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// session is one MCP session: its own sdk.Server (so its resources are
// its own), its principal and the sandboxes it created.
type session struct {
	h   *Handler
	p   Principal
	id  string
	srv *sdk.Server

	// defaultMu serializes the creation of the default sandbox.
	defaultMu sync.Mutex

	mu      sync.Mutex
	ss      *sdk.ServerSession // set once by watch
	created []string           // sandboxes this session created and has not removed
	def     string             // the default sandbox of run_code/exec ("" until first use)
	ended   bool               // the session ended: create nothing more
	// browserDef is the default sandbox of the browser tools ("" until
	// first use).
	browserDef string

	// br is the state of the browser tools (connections, tabs, refs).
	br browsers
}

// caller is s's principal for the manager (KeyID and Via set by the handler).
func (s *session) caller() sandbox.Caller { return s.p }

// watch starts, once, the goroutine that removes s's sandboxes when ss ends.
func (s *session) watch(ss *sdk.ServerSession) {
	s.mu.Lock()
	if s.ss != nil || s.ended {
		s.mu.Unlock()
		return
	}
	s.ss = ss
	s.mu.Unlock()
	s.h.cleanups.Go(func() {
		_ = ss.Wait()
		s.end()
	})
}

// close ends s's connection (its watcher then cleans up); a session that
// never connected is cleaned up here.
func (s *session) close() {
	s.mu.Lock()
	ss := s.ss
	s.mu.Unlock()
	if ss != nil {
		_ = ss.Close()
		return
	}
	s.end()
}

// end marks s ended and removes its sandboxes (unless KeepSandboxes).
func (s *session) end() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	ids := slices.Clone(s.created)
	s.created, s.def, s.browserDef = nil, "", ""
	s.mu.Unlock()
	defer s.h.forget(s)
	s.br.close()
	if s.h.cfg.KeepSandboxes {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range ids {
		if err := s.h.cfg.Service.Remove(ctx, s.p, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.h.log.Warn("remove session sandbox", "session", s.id, "sandbox_id", id, "err", err)
		}
	}
}

// sandbox returns the sandbox id if s's principal may see it (the manager
// decides); every other case is errNoSandbox.
func (s *session) sandbox(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := s.h.cfg.Service.Get(ctx, s.p, id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
			return sb, errNoSandbox
		}
		return sb, err
	}
	return sb, nil
}

var errNoSandbox = fmt.Errorf("%w: sandbox not found (see sandbox_list)", errdefs.ErrNotFound)

// create makes a sandbox for s and registers it as a resource.
func (s *session) create(ctx context.Context, o sandbox.CreateOptions) (store.Sandbox, error) {
	sbs, err := s.boot(ctx, 1, func(ctx context.Context) ([]store.Sandbox, error) {
		sb, err := s.h.cfg.Service.Create(ctx, s.p, o)
		if err != nil {
			return nil, err
		}
		return []store.Sandbox{sb}, nil
	})
	if err != nil {
		return store.Sandbox{}, err
	}
	return sbs[0], nil
}

// boot makes n sandboxes for s with fn: it checks the session's limit
// (fn's manager call checks the principal's quota), then registers the
// sandboxes as the session's (removed when it ends). fn runs under a ctx
// that is not cancelled with the call (the manager cleans up failures; a
// finished sandbox is removed with the session).
func (s *session) boot(ctx context.Context, n int, fn func(ctx context.Context) ([]store.Sandbox, error)) ([]store.Sandbox, error) {
	s.mu.Lock()
	switch {
	case s.ended:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: the session has ended", errdefs.ErrFailedPrecondition)
	case len(s.created)+n > s.h.cfg.MaxSessionSandboxes:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: this session has %d sandboxes and may create at most %d; kill one with sandbox_kill", errdefs.ErrResourceExhausted, len(s.created), s.h.cfg.MaxSessionSandboxes)
	}
	s.mu.Unlock()
	bctx := context.WithoutCancel(ctx)
	sbs, err := fn(bctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	ended := s.ended
	if !ended {
		for _, sb := range sbs {
			s.created = append(s.created, sb.ID)
		}
	}
	s.mu.Unlock()
	if ended { // the session ended while we booted
		if !s.h.cfg.KeepSandboxes {
			for _, sb := range sbs {
				_ = s.h.cfg.Service.Remove(bctx, s.p, sb.ID)
			}
		}
		return nil, fmt.Errorf("%w: the session has ended", errdefs.ErrFailedPrecondition)
	}
	for _, sb := range sbs {
		s.srv.AddResource(&sdk.Resource{
			URI: resourceURI(sb.ID), Name: "sandbox " + sb.ID, MIMEType: "application/json",
			Description: "A sandbox created by this MCP session (removed when the session ends).",
		}, s.readResource)
	}
	return sbs, nil
}

// removed forgets a sandbox s created.
func (s *session) removed(id string) {
	s.mu.Lock()
	i := slices.Index(s.created, id)
	if i >= 0 {
		s.created = slices.Delete(s.created, i, i+1)
	}
	if s.def == id {
		s.def = ""
	}
	if s.browserDef == id {
		s.browserDef = ""
	}
	s.mu.Unlock()
	s.br.drop(id)
	if i >= 0 {
		s.srv.RemoveResources(resourceURI(id))
	}
}

// target returns id if given and visible, else the session's default
// sandbox, created on first use.
func (s *session) target(ctx context.Context, id string) (string, error) {
	return s.sessionSandbox(ctx, id, &s.def, sandbox.CreateOptions{Metadata: map[string]string{"mcp_session": s.id}})
}

// sessionSandbox returns id if given and visible, else the session's
// sandbox *def (guarded by s.mu), made with o on first use or when the
// last one expired or failed.
func (s *session) sessionSandbox(ctx context.Context, id string, def *string, o sandbox.CreateOptions) (string, error) {
	if id != "" {
		sb, err := s.sandbox(ctx, id)
		return sb.ID, err
	}
	s.defaultMu.Lock()
	defer s.defaultMu.Unlock()
	s.mu.Lock()
	cur := *def
	s.mu.Unlock()
	if cur != "" {
		if sb, err := s.h.cfg.Service.Get(ctx, s.p, cur); err == nil && usable(sb.State) {
			return cur, nil // a paused one is resumed by the call that uses it
		}
		s.removed(cur) // expired or failed: make a new one
	}
	sb, err := s.create(ctx, o)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	*def = sb.ID
	s.mu.Unlock()
	return sb.ID, nil
}

// usable reports whether a sandbox in state st can take calls: running,
// or paused (or on its way there or back), which the manager resumes on
// the next call.
func usable(st store.State) bool {
	switch st {
	case store.StateRunning, store.StatePausing, store.StatePaused, store.StateResuming:
		return true
	}
	return false
}

const uriPrefix = "airlock://sandbox/"

func resourceURI(id string) string { return uriPrefix + id }

func (s *session) readResource(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
	uri := req.Params.URI
	id := uri[min(len(uri), len(uriPrefix)):]
	sb, err := s.sandbox(ctx, id)
	if err != nil {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	b, _ := json.MarshalIndent(viewSandbox(sb), "", "  ")
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
}

// sandboxView is a sandbox as tools show it.
type sandboxView struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Reason    string            `json:"reason,omitempty"`
	Image     string            `json:"image"`
	CPUs      int               `json:"cpus"`
	MemoryMB  int               `json:"memory_mb"`
	DiskMB    int               `json:"disk_mb"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// IdlePauseS: idle seconds before the sandbox pauses itself (0: never).
	IdlePauseS int64 `json:"idle_pause_s,omitempty"`
	// PausedAt: when it was last paused.
	PausedAt *time.Time `json:"paused_at,omitempty"`
	// LifetimeLeftS: while paused, the running time left (the lifetime
	// counts running time only).
	LifetimeLeftS *int64 `json:"lifetime_left_s,omitempty"`
	// Source: "snapshot:<name>" or "fork:<sandbox id>" (absent for an image).
	Source string `json:"source,omitempty"`
	// Mounts: its volumes (and host directories, made through the CLI or
	// HTTP API).
	Mounts []mountView `json:"mounts,omitempty"`
	// Ports: its published ports, with the host port the shim picked.
	Ports []portView `json:"ports,omitempty"`
}

type mountView struct {
	Volume   string `json:"volume,omitempty"`
	HostPath string `json:"host_path,omitempty"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

func viewSandbox(sb store.Sandbox) sandboxView {
	v := sandboxView{
		ID: sb.ID, State: string(sb.State), Reason: sb.Reason, Image: sb.Image, CPUs: sb.CPUs,
		MemoryMB: sb.MemoryMiB, DiskMB: sb.DiskMiB, CreatedAt: sb.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt.UTC(),
		Metadata: sb.Metadata, IdlePauseS: int64(sb.IdlePause / time.Second), Source: sb.Source,
	}
	v.PausedAt, v.LifetimeLeftS = sb.PauseView()
	v.Ports = viewPorts(sb.Network.Ports)
	for _, m := range sb.Mounts {
		v.Mounts = append(v.Mounts, mountView{Volume: m.VolumeName, HostPath: m.HostPath, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return v
}
