package airlock

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// CodeRequest is code to run in a code context (a long-lived interpreter
// that keeps its state between calls).
type CodeRequest struct {
	Code string
	// Language is "python", "javascript" or "bash" (with no Context: the
	// language's default context; python if both are empty).
	Language string
	// Context is a context id (CreateContext, or CodeExecution.Context of
	// an earlier run). Not with Language.
	Context string
	// Timeout interrupts the code (whole seconds; 0: none). The context
	// survives; CodeExecution.TimedOut reports it.
	Timeout time.Duration
	// ReturnFiles asks for the image files (.png, .jpg, .jpeg, .gif, .svg)
	// the run writes that match these glob patterns (*, ?, [...]; relative
	// to the context's directory, or absolute): each comes back as a
	// Result with File set. At most 8 patterns; the server returns at most
	// 16 files of at most 8 MiB and says on stderr what it left out.
	ReturnFiles []string
}

// Result is one rich value: MIME type -> content. Text types (text/plain,
// text/html, image/svg+xml, application/json, ...) hold UTF-8 text; image
// types (image/png, image/jpeg) hold the raw image bytes.
type Result struct {
	// Main is true for the value of the last expression; false for
	// display() and figure outputs.
	Main bool
	Data map[string][]byte
	// File is the guest path of a file that ReturnFiles returned (relative
	// to the context's directory when under it); "" for the code's own
	// results. It is the guest's text: escape it before printing it to a
	// terminal.
	File string
}

// Text returns the text/plain value ("" if none).
func (r Result) Text() string { return string(r.Data["text/plain"]) }

// CodeError is an exception the code raised.
type CodeError struct {
	Name      string   `json:"name"`
	Value     string   `json:"value"`
	Traceback []string `json:"traceback"`
}

func (e *CodeError) Error() string { return e.Name + ": " + e.Value }

// CodeHandlers receive a run's events as they arrive; nil fields ignore
// theirs.
type CodeHandlers struct {
	OnStdout func([]byte)
	OnStderr func([]byte)
	OnResult func(Result)
	OnError  func(*CodeError)
	// OnStatus gets the server's word on the run's progress while the
	// context's interpreter starts ("starting python context", then
	// "still starting python context (10s)"): never the code's output.
	OnStatus func(string)
}

// CodeExecution is what a RunCode produced.
type CodeExecution struct {
	Results []Result
	// Error is the exception the code raised, nil if none.
	Error          *CodeError
	Stdout, Stderr []byte
	TimedOut       bool
	// Truncated: output beyond the server's cap (16 MiB) was dropped.
	Truncated      bool
	Duration       time.Duration
	ExecutionCount int
	// Context is the id of the context that ran the code.
	Context string
}

// Main returns the main result (the last expression's value), or nil.
func (e *CodeExecution) Main() *Result {
	for i := range e.Results {
		if e.Results[i].Main {
			return &e.Results[i]
		}
	}
	return nil
}

// Text returns the main result's text/plain value ("" if none).
func (e *CodeExecution) Text() string {
	if m := e.Main(); m != nil {
		return m.Text()
	}
	return ""
}

// maxCodeLine caps one NDJSON record of a code stream: a result may carry
// several images, base64-encoded.
const maxCodeLine = 24 << 20

// ErrCodeStreamBroken is matched (errors.Is) when a code stream ends
// before its end record.
var ErrCodeStreamBroken = errors.New("airlock: code stream ended before its end record")

// RunCode runs req.Code in sandbox id, calls h for each event as it
// arrives, and returns the collected execution. An exception raised by the
// code is not an error: it is in CodeExecution.Error. Output is held in
// memory (capped by the server at 16 MiB).
func (c *Client) RunCode(ctx context.Context, id string, req CodeRequest, h CodeHandlers) (*CodeExecution, error) {
	if req.Timeout < 0 {
		return nil, errors.New("airlock: negative timeout")
	}
	body := codeRequest{
		Code: req.Code, Language: req.Language, Context: req.Context,
		TimeoutS: seconds(req.Timeout), ReturnFiles: req.ReturnFiles,
	}
	resp, err := c.openStream(ctx, http.MethodPost, sandboxPath(id, "code"), nil, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readCodeStream(resp.Body, h)
}

// codeRequest is the body of POST /v1/sandboxes/{id}/code.
type codeRequest struct {
	Code        string   `json:"code"`
	Language    string   `json:"language,omitempty"`
	Context     string   `json:"context,omitempty"`
	TimeoutS    int64    `json:"timeout_s,omitempty"`
	ReturnFiles []string `json:"return_files,omitempty"`
}

// codeRecord is one NDJSON line of a code stream.
type codeRecord struct {
	Type           string          `json:"type"`
	Data           json.RawMessage `json:"data"`
	Main           bool            `json:"main"`
	File           string          `json:"file"`
	Name           string          `json:"name"`
	Value          string          `json:"value"`
	Traceback      []string        `json:"traceback"`
	TimedOut       bool            `json:"timed_out"`
	Truncated      bool            `json:"truncated"`
	DurationMS     int64           `json:"duration_ms"`
	ExecutionCount int             `json:"execution_count"`
	Context        string          `json:"context"`
}

// textMIME reports whether the server sends mime as text (else base64).
func textMIME(mime string) bool {
	return strings.HasPrefix(mime, "text/") || mime == "image/svg+xml" || mime == "application/json" ||
		mime == "application/javascript" || strings.HasSuffix(mime, "+json") || strings.HasSuffix(mime, "+xml")
}

func readCodeStream(r io.Reader, h CodeHandlers) (*CodeExecution, error) {
	broken := func(err error) error { return fmt.Errorf("%w: %w", ErrCodeStreamBroken, err) }
	rr := newRecordReader(r, maxCodeLine)
	var ex CodeExecution
	var stdout, stderr bytes.Buffer
	for {
		rec, _, err := rr.next()
		if err != nil {
			var tooLong recordTooLongError
			if !errors.As(err, &tooLong) && ex.Error != nil && ex.Error.Name == "AirlockError" {
				err = fmt.Errorf("%s: %w", ex.Error.Value, err)
			}
			return nil, broken(err)
		}
		var m codeRecord
		if err := json.Unmarshal(rec, &m); err != nil {
			return nil, broken(fmt.Errorf("bad record: %w", err))
		}
		switch m.Type {
		case "stdout", "stderr":
			var s string
			if err := json.Unmarshal(m.Data, &s); err != nil {
				return nil, broken(fmt.Errorf("bad %s data: %w", m.Type, err))
			}
			if m.Type == "stdout" {
				stdout.WriteString(s)
				if h.OnStdout != nil {
					h.OnStdout([]byte(s))
				}
			} else {
				stderr.WriteString(s)
				if h.OnStderr != nil {
					h.OnStderr([]byte(s))
				}
			}
		case "result":
			var d map[string]string
			if err := json.Unmarshal(m.Data, &d); err != nil {
				return nil, broken(fmt.Errorf("bad result: %w", err))
			}
			res := Result{Main: m.Main, File: m.File, Data: make(map[string][]byte, len(d))}
			for k, v := range d {
				if textMIME(k) {
					res.Data[k] = []byte(v)
					continue
				}
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil {
					return nil, broken(fmt.Errorf("bad %s value: %w", k, err))
				}
				res.Data[k] = b
			}
			ex.Results = append(ex.Results, res)
			if h.OnResult != nil {
				h.OnResult(res)
			}
		case "status":
			var s string
			if err := json.Unmarshal(m.Data, &s); err != nil {
				return nil, broken(fmt.Errorf("bad status data: %w", err))
			}
			if h.OnStatus != nil {
				h.OnStatus(s)
			}
		case "error":
			ce := &CodeError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}
			ex.Error = ce
			if h.OnError != nil && ce.Name != "AirlockError" {
				h.OnError(ce)
			}
		case "end":
			ex.Stdout, ex.Stderr = stdout.Bytes(), stderr.Bytes()
			ex.TimedOut, ex.Truncated = m.TimedOut, m.Truncated
			ex.Duration = time.Duration(m.DurationMS) * time.Millisecond
			ex.ExecutionCount, ex.Context = m.ExecutionCount, m.Context
			return &ex, nil
		}
	}
}

// Context is a code context of a sandbox.
type Context struct {
	ID        string    `json:"id"`
	Language  string    `json:"language"`
	Cwd       string    `json:"cwd"`
	CreatedAt time.Time `json:"created_at"`
	State     string    `json:"state"` // "idle", "busy" or "dead" (the next run restarts it)
	IsDefault bool      `json:"is_default"`
	// Exit says how a dead context's interpreter ended; nil while it runs
	// or when the server does not know.
	Exit *ContextExit `json:"exit,omitempty"`
}

// ContextExit is how a context's interpreter ended.
type ContextExit struct {
	// Reason is "out of memory", "killed by signal N" or "exit code N".
	Reason    string `json:"reason"`
	Code      int    `json:"code"` // -1 when a signal ended it
	Signal    int    `json:"signal"`
	OOMKilled bool   `json:"oom_killed"`
}

// ContextOptions configure CreateContext.
type ContextOptions struct {
	ID       string            `json:"id,omitempty"`       // empty: generated
	Language string            `json:"language,omitempty"` // default python
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
}

// CreateContext starts a code context in sandbox id.
func (c *Client) CreateContext(ctx context.Context, id string, opts ContextOptions) (*Context, error) {
	var out Context
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "contexts"), nil, opts, &out, http.StatusCreated, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListContexts returns the code contexts of sandbox id.
func (c *Client) ListContexts(ctx context.Context, id string) ([]Context, error) {
	var out struct {
		Contexts []Context `json:"contexts"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "contexts"), nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Contexts, nil
}

// DeleteContext stops a code context and forgets its state.
func (c *Client) DeleteContext(ctx context.Context, id, contextID string) error {
	return c.doJSON(ctx, http.MethodDelete, sandboxPath(id, "contexts", contextID), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}

// RestartContext replaces a context's interpreter (same id, state lost).
func (c *Client) RestartContext(ctx context.Context, id, contextID string) (*Context, error) {
	var out Context
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "contexts", contextID, "restart"), nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// InterruptContext interrupts the code running in a context.
func (c *Client) InterruptContext(ctx context.Context, id, contextID string) error {
	return c.doJSON(ctx, http.MethodPost, sandboxPath(id, "contexts", contextID, "interrupt"), nil, nil, nil, http.StatusNoContent, http.StatusOK)
}
