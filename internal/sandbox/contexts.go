package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
)

// CreateContext starts a code context ("python" by default) in a running
// sandbox (a paused one is resumed). An empty spec.ID gets a generated one.
// Errors: ErrNotFound (no sandbox c may see), ErrFailedPrecondition (not
// running), ErrInvalid (bad language, id, cwd or env), ErrConflict (the id
// is taken), ErrUnsupported (the guest agent predates code contexts).
func (m *Manager) CreateContext(ctx context.Context, c Caller, sandboxID string, spec guest.ContextSpec) (guest.ContextInfo, error) {
	if err := spec.Validate(); err != nil {
		return guest.ContextInfo{}, err
	}
	sb, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return guest.ContextInfo{}, err
	}
	info, err := sc.CreateContext(ctx, spec)
	if err == nil {
		m.audit(ctx, c, sb.ID, "context.create", map[string]any{"context": info.ID, "language": info.Language})
	}
	return info, err
}

// ListContexts returns the sandbox's code contexts.
func (m *Manager) ListContexts(ctx context.Context, c Caller, sandboxID string) ([]guest.ContextInfo, error) {
	_, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return nil, err
	}
	return sc.ListContexts(ctx)
}

// checkContextRef returns ErrNotFound for anything that is not a context id
// (so no malformed id reaches the shim).
func checkContextRef(id string) error {
	if guest.ValidateContextID(id) != nil {
		return fmt.Errorf("%w: no context %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// DeleteContext stops a context and forgets its state. ErrNotFound if the
// sandbox has no such context.
func (m *Manager) DeleteContext(ctx context.Context, c Caller, sandboxID, contextID string) error {
	if err := checkContextRef(contextID); err != nil {
		return err
	}
	sb, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return err
	}
	if err := sc.DeleteContext(ctx, contextID); err != nil {
		return err
	}
	m.audit(ctx, c, sb.ID, "context.delete", map[string]any{"context": contextID})
	return nil
}

// RestartContext replaces a context's interpreter with a fresh one (same
// id, state lost). ErrNotFound if the sandbox has no such context.
func (m *Manager) RestartContext(ctx context.Context, c Caller, sandboxID, contextID string) (guest.ContextInfo, error) {
	if err := checkContextRef(contextID); err != nil {
		return guest.ContextInfo{}, err
	}
	_, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return guest.ContextInfo{}, err
	}
	return sc.RestartContext(ctx, contextID)
}

// InterruptContext interrupts the code running in a context (the context
// survives). ErrNotFound if the sandbox has no such context.
func (m *Manager) InterruptContext(ctx context.Context, c Caller, sandboxID, contextID string) error {
	if err := checkContextRef(contextID); err != nil {
		return err
	}
	_, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return err
	}
	return sc.InterruptContext(ctx, contextID)
}

// RunCode runs req.Code in a context of a running sandbox (req.ContextID,
// or the default context of req.Language, created on first use) and calls
// fn for every event: stdout, stderr, result, error and status events, the
// last being exactly one end. It returns nil after the end event. The shim
// enforces the limits whatever the guest does: output (stdout + stderr +
// result bytes, at most MaxCodeOutputBytes; End.Truncated), the timeout
// (req.Timeout plus a grace; End.TimedOut), and result sizes. An error
// from fn ends the run (the code is interrupted) and is returned. Ending
// ctx interrupts the code; the context survives.
//
// A run that must wait for an interpreter to start (the language's default
// context does not exist yet, or the context is dead) gets EventStatus
// events while it waits: the first after m.ContextProgress.Delay, then one
// every m.ContextProgress.Every. The start happens before the code runs, so
// it does not count against req.Timeout: a missing default context is
// created, a dead one restarted by an empty run, whose stderr line from the
// guest (that the context had died, why, and that its state is lost) comes
// first. req.ReturnFiles adds the image files the run wrote as results
// before the end (see returnFiles).
//
// Errors: ErrNotFound (no sandbox or context), ErrFailedPrecondition (not
// running, or the interpreter did not start), ErrInvalid, ErrUnsupported
// (old agent), ErrUnavailable (the stream broke).
func (m *Manager) RunCode(ctx context.Context, c Caller, sandboxID string, req guest.CodeRequest, fn func(guest.CodeEvent) error) error {
	if err := ValidateRunCode(req); err != nil {
		return err
	}
	sb, sc, err := m.running(ctx, c, sandboxID)
	if err != nil {
		return err
	}
	t0 := time.Now()
	var end *guest.CodeEnd
	var errName string
	err = m.runCode(ctx, sc, req, func(ev guest.CodeEvent) error {
		switch ev.Kind {
		case guest.EventEnd:
			end = ev.End
		case guest.EventError:
			if ev.Error != nil {
				errName = ev.Error.Name
			}
		}
		return fn(ev)
	})
	lang := req.Language
	if lang == "" && req.ContextID == "" {
		lang = guest.LangPython
	}
	detail := map[string]any{"context": req.ContextID, "language": lang, "duration_ms": time.Since(t0).Milliseconds()}
	if end != nil {
		detail["context"] = end.ContextID
		detail["timed_out"] = end.TimedOut
	}
	if errName != "" {
		detail["error"] = clipName(errName)
	}
	if err != nil {
		detail["failed"] = true
	}
	m.audit(ctx, c, sb.ID, "code.run", detail)
	return err
}

// runCode starts the run's context if it must (with progress), runs the
// code and returns the files asked for.
func (m *Manager) runCode(ctx context.Context, sc *shimclient.Client, req guest.CodeRequest, fn func(guest.CodeEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lang, target := req.Language, req.ContextID
	if lang == "" {
		lang = guest.LangPython
	}
	if target == "" {
		target = "default-" + lang
	}
	infos, err := sc.ListContexts(ctx)
	if err != nil {
		return err
	}
	var info *guest.ContextInfo
	for i := range infos {
		if infos[i].ID == target {
			info = &infos[i]
		}
	}
	if info != nil {
		lang = info.Language
	}
	p := m.newProgress(fn, lang, cancel)
	defer p.stop()
	switch {
	case info == nil && req.ContextID == "":
		// The default context starts now: create it apart from the run,
		// so that the wait for its interpreter has a known end.
		p.start("starting " + lang + " context")
		created, err := sc.CreateContext(ctx, guest.ContextSpec{ID: target, Language: lang})
		if err := p.finish(); err != nil {
			return err
		}
		switch {
		case err == nil:
			info = &created
		case errors.Is(err, errdefs.ErrConflict): // another run created it
		default:
			return fmt.Errorf("start the %s context: %w", lang, err)
		}
	case info != nil && info.State == "dead":
		// The guest restarts a dead context at the start of the next run
		// and says so first: make that run an empty one, so that the
		// restart does not count against the code's timeout, and pass on
		// what it says.
		p.start(fmt.Sprintf("restarting %s context %s (it had died: %s)", lang, target, info.Exit.Reason()))
		err := sc.RunCode(ctx, guest.CodeRequest{ContextID: target}, func(ev guest.CodeEvent) error {
			if err := p.finish(); err != nil {
				return err
			}
			if ev.Kind == guest.EventStdout || ev.Kind == guest.EventStderr {
				return fn(ev)
			}
			return nil
		})
		if err := p.finish(); err != nil {
			return err
		}
		if err != nil {
			return fmt.Errorf("restart the %s context: %w", lang, err)
		}
	}
	var files *returnFiles
	if len(req.ReturnFiles) > 0 {
		cwd := "/root"
		if info != nil && info.Cwd != "" {
			cwd = info.Cwd
		}
		files = newReturnFiles(cwd, req.ReturnFiles)
		files.before(ctx, sc)
	}
	var end *guest.CodeEvent
	err = sc.RunCode(ctx, req, func(ev guest.CodeEvent) error {
		if ev.Kind == guest.EventEnd && files != nil {
			end = &ev // the files come before it
			return nil
		}
		return fn(ev)
	})
	if err != nil || end == nil {
		return err
	}
	if err := files.after(ctx, sc, fn); err != nil {
		return err
	}
	return fn(*end)
}

// clipName bounds a guest-supplied error name for the audit trail.
func clipName(s string) string {
	if len(s) > 64 {
		s = s[:64]
	}
	return strings.ToValidUTF8(s, "")
}
