package mcp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Config is what a Handler needs. Service is required.
type Config struct {
	Service Service
	Log     *slog.Logger // nil: discard
	Version string       // reported to clients

	// KeepSandboxes leaves a session's sandboxes to their timeout when the
	// session ends instead of removing them.
	KeepSandboxes bool
	// MaxOutputBytes caps the text of one tool result (default 64 KiB).
	MaxOutputBytes int
	// DefaultTimeout is a call's deadline without timeout_s (default 60 s);
	// MaxTimeout is the largest timeout_s accepted (default 30 min).
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// MaxSessionSandboxes caps the sandboxes one session may create
	// (default 10), on top of the principal's quota (the manager's).
	MaxSessionSandboxes int
	// SessionIdle closes HTTP sessions that sent nothing for this long
	// (default 30 min); their sandboxes are then removed.
	SessionIdle time.Duration
}

// Validate checks c and fills in defaults.
func (c *Config) Validate() error {
	if c.Service == nil {
		return errors.New("mcp: Service is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.MaxOutputBytes <= 0 {
		c.MaxOutputBytes = 64 << 10
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = 60 * time.Second
	}
	if c.MaxTimeout <= 0 {
		c.MaxTimeout = 30 * time.Minute
	}
	if c.MaxSessionSandboxes <= 0 {
		c.MaxSessionSandboxes = 10
	}
	if c.SessionIdle <= 0 {
		c.SessionIdle = 30 * time.Minute
	}
	return nil
}

// Handler serves MCP sessions. Safe for concurrent use. Close ends every
// session and waits for their cleanup.
type Handler struct {
	cfg Config
	log *slog.Logger
	// cleanups are the goroutines that wait for a session's end and remove
	// its sandboxes.
	cleanups sync.WaitGroup

	mu       sync.Mutex
	sessions map[*session]struct{}
	closed   bool
}

// New returns a Handler for cfg.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg, log: cfg.Log, sessions: map[*session]struct{}{}}, nil
}

// ServeStdio serves one session as the local user on t (an
// StdioTransport in production) until the client goes away or ctx
// ends, then removes the session's sandboxes.
func (h *Handler) ServeStdio(ctx context.Context, t sdk.Transport) error {
	s := h.newSession(Principal{})
	if s == nil {
		return errors.New("mcp: handler closed")
	}
	ss, err := s.srv.Connect(ctx, t, nil)
	if err != nil {
		h.forget(s)
		return err
	}
	s.watch(ss)
	stop := context.AfterFunc(ctx, func() { _ = ss.Close() })
	defer stop()
	err = ss.Wait()
	h.cleanups.Wait()
	if ctx.Err() != nil || errors.Is(err, sdk.ErrConnectionClosed) {
		return nil
	}
	return err
}

// HTTPHandler returns the streamable-HTTP handler. authenticate returns
// the principal of an already authenticated request (false: 401); a
// session stays bound to the key that opened it.
func (h *Handler) HTTPHandler(authenticate func(r *http.Request) (Principal, bool)) http.Handler {
	type principalKey struct{}
	sh := sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		p, ok := r.Context().Value(principalKey{}).(Principal)
		if !ok {
			return nil
		}
		s := h.newSession(p)
		if s == nil {
			return nil
		}
		return s.srv
	}, &sdk.StreamableHTTPOptions{Logger: h.log, SessionTimeout: h.cfg.SessionIdle})
	checked := checkBody(sh)
	verify := func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		p, ok := authenticate(r)
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		// UserID binds a session to its key: the SDK refuses a request
		// for the session that carries another.
		return &auth.TokenInfo{UserID: "key:" + p.KeyID + "/tenant:" + p.Tenant}, nil
	}
	bearer := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	return bearer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, _ := authenticate(r)
		checked.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}))
}

// Close ends every session, waits until their sandboxes are removed (or
// ctx ends) and refuses new sessions.
func (h *Handler) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	var ss []*session
	for s := range h.sessions {
		ss = append(ss, s)
	}
	h.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
	done := make(chan struct{})
	go func() { h.cleanups.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Handler) newSession(p Principal) *session {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	s := &session{h: h, id: newID()}
	p.Via = "mcp"
	if p.KeyID == "" {
		p.KeyID = "mcp:" + s.id // the audit trail's key id of a stdio session
	}
	s.p = p
	s.srv = h.newServer(s)
	h.sessions[s] = struct{}{}
	return s
}

func (h *Handler) forget(s *session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.sessions, s)
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
