package sandbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Code-context limits shared by the shim (which enforces them against the
// guest) and the manager (which checks requests before they leave the host).
const (
	// MaxCodeBytes caps the code of one RunCode.
	MaxCodeBytes = 1 << 20
	// MaxCodeOutputBytes is the default and the largest output cap of one
	// RunCode: stdout + stderr + result bytes.
	MaxCodeOutputBytes = 16 << 20
	// MaxResultValueBytes caps one MIME value of a CodeResult.
	MaxResultValueBytes = 8 << 20
	// MaxResultEntries caps the MIME entries of one CodeResult.
	MaxResultEntries = 16
	// MaxCodeMessageBytes caps one ContextService message from the guest
	// (and from the shim): a result with a MaxResultValueBytes image plus
	// its small text siblings.
	MaxCodeMessageBytes = MaxResultValueBytes + 1<<20
	// MaxCodeTimeoutMs is the longest timeout of one RunCode (24 h).
	MaxCodeTimeoutMs = 24 * 3600 * 1000
	// MaxContextEnv caps CreateContextRequest.env.
	MaxContextEnv = 256
)

// Context languages.
const (
	LangPython     = "python"
	LangJavaScript = "javascript"
	LangBash       = "bash"
)

var contextIDRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidateContextID checks a code-context id ([a-z0-9][a-z0-9-]{0,62}).
func ValidateContextID(id string) error {
	if !contextIDRe.MatchString(id) {
		return fmt.Errorf("%w: context id must match [a-z0-9][a-z0-9-]{0,62}", errdefs.ErrInvalid)
	}
	return nil
}

// ValidateLanguage checks a context language; "" means python.
func ValidateLanguage(lang string) error {
	switch lang {
	case "", LangPython, LangJavaScript, LangBash:
		return nil
	}
	return fmt.Errorf("%w: language must be python, javascript or bash", errdefs.ErrInvalid)
}

// ValidateCreateContext checks a CreateContextRequest on the host side.
func ValidateCreateContext(req *agentv1.CreateContextRequest) error {
	if req == nil {
		return fmt.Errorf("%w: empty create-context request", errdefs.ErrInvalid)
	}
	if err := ValidateLanguage(req.GetLanguage()); err != nil {
		return err
	}
	if id := req.GetId(); id != "" {
		if err := ValidateContextID(id); err != nil {
			return err
		}
	}
	if c := req.GetCwd(); c != "" {
		if err := validGuestPath(c); err != nil {
			return fmt.Errorf("%w: cwd: %v", errdefs.ErrInvalid, err)
		}
	}
	if len(req.GetEnv()) > MaxContextEnv {
		return fmt.Errorf("%w: at most %d environment variables", errdefs.ErrInvalid, MaxContextEnv)
	}
	for _, kv := range req.GetEnv() {
		k, v, ok := cutEnv(kv)
		if !ok || k == "" || len(k) > 256 || len(v) > 32<<10 || containsNUL(kv) {
			return fmt.Errorf("%w: env entries must be KEY=VALUE, names 1-256 bytes, values at most 32 KiB, no NUL", errdefs.ErrInvalid)
		}
	}
	return nil
}

// ValidateRunCode checks a RunCodeRequest on the host side.
func ValidateRunCode(req *agentv1.RunCodeRequest) error {
	if req == nil {
		return fmt.Errorf("%w: empty run-code request", errdefs.ErrInvalid)
	}
	if id := req.GetContextId(); id != "" {
		if err := ValidateContextID(id); err != nil {
			return err
		}
	}
	if err := ValidateLanguage(req.GetLanguage()); err != nil {
		return err
	}
	if len(req.GetCode()) > MaxCodeBytes {
		return fmt.Errorf("%w: code is longer than %d bytes", errdefs.ErrInvalid, MaxCodeBytes)
	}
	if req.GetTimeoutMs() > MaxCodeTimeoutMs {
		return fmt.Errorf("%w: timeout must be at most 24h", errdefs.ErrInvalid)
	}
	return nil
}

func cutEnv(kv string) (k, v string, ok bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return "", "", false
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// validGuestPath is the manager's copy of the shim's path check (the shim
// checks again).
func validGuestPath(p string) error {
	switch {
	case len(p) > 4096:
		return errors.New("path too long")
	case p[0] != '/':
		return errors.New("path is not absolute")
	case containsNUL(p):
		return errors.New("path contains NUL")
	}
	return nil
}

// contextClient returns a ContextService client for a running sandbox's
// shim and a func that closes its connections.
func (m *Manager) contextClient(ctx context.Context, sandboxID string) (agentv1connect.ContextServiceClient, func(), error) {
	if err := m.requireRunning(ctx, sandboxID); err != nil {
		return nil, nil, err
	}
	hc, closeFn := shimHTTPClient(m.L.Socket(sandboxID))
	c := agentapi.NewClient(hc, "http://shim", agentapi.Options{MaxMessageBytes: MaxCodeMessageBytes})
	return c.Contexts, closeFn, nil
}

// withClient calls call with a client that open makes for a running
// sandbox, closing it after; an error from call is categorised as step.
func withClient[C any](ctx context.Context, open func(context.Context, string) (C, func(), error), sandboxID, step string, call func(C) error) error {
	c, closeFn, err := open(ctx, sandboxID)
	if err != nil {
		return err
	}
	defer closeFn()
	if err := call(c); err != nil {
		return shimErr(ctx, step, err)
	}
	return nil
}

// withContexts is withClient for the guest's ContextService.
func (m *Manager) withContexts(ctx context.Context, sandboxID, step string, call func(agentv1connect.ContextServiceClient) error) error {
	return withClient(ctx, m.contextClient, sandboxID, step, call)
}

// CreateContext starts a code context ("python" by default) in a running
// sandbox. An empty req.Id gets a generated one. Errors: ErrNotFound (no
// sandbox), ErrFailedPrecondition (not running), ErrInvalid (bad language,
// id, cwd or env), ErrConflict (the id is taken), ErrUnsupported (the guest
// agent predates code contexts).
func (m *Manager) CreateContext(ctx context.Context, sandboxID string, req *agentv1.CreateContextRequest) (*agentv1.ContextInfo, error) {
	if err := ValidateCreateContext(req); err != nil {
		return nil, err
	}
	var info *agentv1.ContextInfo
	err := m.withContexts(ctx, sandboxID, "create context", func(c agentv1connect.ContextServiceClient) error {
		resp, err := c.Create(ctx, connect.NewRequest(req))
		if err == nil {
			info = resp.Msg
		}
		return err
	})
	return info, err
}

// ListContexts returns the sandbox's code contexts.
func (m *Manager) ListContexts(ctx context.Context, sandboxID string) ([]*agentv1.ContextInfo, error) {
	var out []*agentv1.ContextInfo
	err := m.withContexts(ctx, sandboxID, "list contexts", func(c agentv1connect.ContextServiceClient) error {
		resp, err := c.List(ctx, connect.NewRequest(&agentv1.ListContextsRequest{}))
		if err == nil {
			out = resp.Msg.GetContexts()
		}
		return err
	})
	return out, err
}

// checkContextRef returns ErrNotFound for anything that is not a context id
// (so no malformed id reaches the shim).
func checkContextRef(id string) error {
	if !contextIDRe.MatchString(id) {
		return fmt.Errorf("%w: no context %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// DeleteContext stops a context and forgets its state. ErrNotFound if the
// sandbox has no such context.
func (m *Manager) DeleteContext(ctx context.Context, sandboxID, contextID string) error {
	if err := checkContextRef(contextID); err != nil {
		return err
	}
	return m.withContexts(ctx, sandboxID, "delete context", func(c agentv1connect.ContextServiceClient) error {
		_, err := c.Delete(ctx, connect.NewRequest(&agentv1.DeleteContextRequest{Id: contextID}))
		return err
	})
}

// RestartContext replaces a context's interpreter with a fresh one (same
// id, state lost). ErrNotFound if the sandbox has no such context.
func (m *Manager) RestartContext(ctx context.Context, sandboxID, contextID string) (*agentv1.ContextInfo, error) {
	if err := checkContextRef(contextID); err != nil {
		return nil, err
	}
	var info *agentv1.ContextInfo
	err := m.withContexts(ctx, sandboxID, "restart context", func(c agentv1connect.ContextServiceClient) error {
		resp, err := c.Restart(ctx, connect.NewRequest(&agentv1.RestartContextRequest{Id: contextID}))
		if err == nil {
			info = resp.Msg
		}
		return err
	})
	return info, err
}

// InterruptContext interrupts the code running in a context (the context
// survives). ErrNotFound if the sandbox has no such context.
func (m *Manager) InterruptContext(ctx context.Context, sandboxID, contextID string) error {
	if err := checkContextRef(contextID); err != nil {
		return err
	}
	return m.withContexts(ctx, sandboxID, "interrupt context", func(c agentv1connect.ContextServiceClient) error {
		_, err := c.Interrupt(ctx, connect.NewRequest(&agentv1.InterruptContextRequest{Id: contextID}))
		return err
	})
}

// RunCode runs req.Code in a context of a running sandbox (req.ContextId,
// or the default context of req.Language, created on first use) and calls
// fn for every event: stdout, stderr, result and error events, the last
// being exactly one `end`. It returns nil after the end event. The shim
// enforces the limits whatever the guest does: output (stdout + stderr +
// result bytes, at most MaxCodeOutputBytes; end.truncated), the timeout
// (req.TimeoutMs plus a grace; end.timed_out), and result sizes. An error
// from fn ends the run (the code is interrupted) and is returned. Ending
// ctx interrupts the code; the context survives. Errors: ErrNotFound (no
// sandbox or context), ErrFailedPrecondition (not running), ErrInvalid,
// ErrUnsupported (old agent), ErrUnavailable (the stream broke).
func (m *Manager) RunCode(ctx context.Context, sandboxID string, req *agentv1.RunCodeRequest, fn func(*agentv1.RunCodeEvent) error) error {
	if err := ValidateRunCode(req); err != nil {
		return err
	}
	c, closeFn, err := m.contextClient(ctx, sandboxID)
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Run(ctx, connect.NewRequest(req))
	if err != nil {
		return shimErr(ctx, "run code", err)
	}
	defer st.Close()
	return pump(ctx, "run code", "an end event", st, fn,
		func(ev *agentv1.RunCodeEvent) bool { return ev.GetEvent() == nil },
		func(ev *agentv1.RunCodeEvent) bool { return ev.GetEnd() != nil })
}
