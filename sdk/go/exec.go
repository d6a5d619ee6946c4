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
	"net/url"
	"time"
)

// ExecRequest describes a command to run in a sandbox.
type ExecRequest struct {
	Cmd  []string          // argv; required
	Env  map[string]string // added to the sandbox's default environment
	Cwd  string            // working directory ("" = server default)
	User string            // user name ("" = server default)
	// Stdin, if non-nil, is the whole stdin; the exec's stdin is closed after
	// it. A non-nil empty slice means an empty, closed stdin. Nil means no
	// stdin, unless StdinOpen.
	Stdin []byte
	// StdinOpen keeps stdin open for SendStdin (with Start or Exec).
	StdinOpen bool
	// Timeout kills the command after this long (whole seconds, rounded up;
	// 0 = none beyond the sandbox's lifetime). ExitStatus.TimedOut reports it.
	Timeout time.Duration
	// KillOnDisconnect kills the command if its output stream breaks.
	KillOnDisconnect bool
	// PidsLimit caps the command's processes and threads (0: the guest's
	// default: 1024 in a QEMU sandbox, half the sandbox's task budget under
	// gVisor).
	PidsLimit int
}

type execRequest struct {
	Cmd              []string          `json:"cmd"`
	Env              map[string]string `json:"env,omitempty"`
	Cwd              string            `json:"cwd,omitempty"`
	User             string            `json:"user,omitempty"`
	Stdin            *string           `json:"stdin,omitempty"`
	StdinOpen        bool              `json:"stdin_open,omitempty"`
	TimeoutS         int64             `json:"timeout_s,omitempty"`
	Background       bool              `json:"background"`
	KillOnDisconnect bool              `json:"kill_on_disconnect,omitempty"`
	PidsLimit        int               `json:"pids_limit,omitempty"`
}

func (r ExecRequest) wire(background bool) execRequest {
	w := execRequest{
		Cmd: r.Cmd, Env: r.Env, Cwd: r.Cwd, User: r.User, StdinOpen: r.StdinOpen,
		TimeoutS: seconds(r.Timeout), Background: background, KillOnDisconnect: r.KillOnDisconnect,
		PidsLimit: r.PidsLimit,
	}
	if r.Stdin != nil {
		s := base64.StdEncoding.EncodeToString(r.Stdin)
		w.Stdin = &s
	}
	return w
}

// ExitStatus is how an exec ended.
type ExitStatus struct {
	Code      int           // exit code; -1 when killed by a signal
	Signal    int           // the signal that killed it, 0 if none
	TimedOut  bool          // killed because ExecRequest.Timeout passed
	Truncated bool          // output beyond the server's cap was dropped
	Duration  time.Duration // wall time of the command
	// OOMKilled: the guest kernel's OOM killer killed a process of the
	// command (with Signal 9 when it was the command itself).
	OOMKilled bool
}

type wireExit struct {
	Code       int   `json:"code"`
	Signal     int   `json:"signal"`
	Timeout    bool  `json:"timeout"`
	Truncated  bool  `json:"truncated"`
	DurationMS int64 `json:"duration_ms"`
	OOMKilled  bool  `json:"oom_killed"`
}

func (w wireExit) status() ExitStatus {
	return ExitStatus{
		Code: w.Code, Signal: w.Signal, TimedOut: w.Timeout, Truncated: w.Truncated,
		Duration: time.Duration(w.DurationMS) * time.Millisecond, OOMKilled: w.OOMKilled,
	}
}

// ExecHandlers receive an exec's output as it arrives, from the calling
// goroutine, in order. Each slice is freshly allocated and may be retained.
// Nil handlers discard their stream.
type ExecHandlers struct {
	OnStart  func(execID string, pid int) // Exec only: the exec ID, for Attach/SendStdin/Signal
	OnStdout func([]byte)
	OnStderr func([]byte)
}

// ExecResult is the collected outcome of Run.
type ExecResult struct {
	ExecID string
	Stdout []byte
	Stderr []byte
	Exit   ExitStatus
}

// maxLine caps one NDJSON record; the server sends output in chunks far
// smaller than this.
const maxLine = 16 << 20

// execQuery is the query every exec stream uses: base64 so bytes round-trip.
var execQuery = url.Values{"encoding": {"base64"}}

// Exec runs req in sandbox id and streams its output to h until the command
// exits. If the stream breaks first, the error is a *StreamError and the
// command keeps running (unless KillOnDisconnect); Attach resumes it.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest, h ExecHandlers) (*ExitStatus, error) {
	resp, err := c.openStream(ctx, http.MethodPost, sandboxPath(id, "exec"), execQuery, req.wire(false))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readStream(resp.Body, "", h)
}

// Run runs req in sandbox id and returns its collected output. Output is
// held in memory (the server caps it per exec); use Exec to stream instead.
func (c *Client) Run(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	var res ExecResult
	var stdout, stderr bytes.Buffer
	st, err := c.Exec(ctx, id, req, ExecHandlers{
		OnStart:  func(execID string, _ int) { res.ExecID = execID },
		OnStdout: func(p []byte) { stdout.Write(p) },
		OnStderr: func(p []byte) { stderr.Write(p) },
	})
	if err != nil {
		return nil, err
	}
	res.Stdout, res.Stderr, res.Exit = stdout.Bytes(), stderr.Bytes(), *st
	return &res, nil
}

// Start runs req in sandbox id in the background and returns its exec ID
// at once. Follow it with Attach, GetExec, SendStdin and Signal.
func (c *Client) Start(ctx context.Context, id string, req ExecRequest) (string, error) {
	var out struct {
		ExecID string `json:"exec_id"`
		PID    int    `json:"pid"`
	}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id, "exec"), execQuery, req.wire(true), &out, http.StatusAccepted, http.StatusOK); err != nil {
		return "", err
	}
	if out.ExecID == "" {
		return "", errors.New("airlock: start exec: the server returned no exec_id")
	}
	return out.ExecID, nil
}

// Attach streams the output of exec execID in sandbox id to h, from the
// start of its retained output, until it exits; it returns at once with the
// replayed output for an exec that already exited. h.OnStart is not called.
func (c *Client) Attach(ctx context.Context, id, execID string, h ExecHandlers) (*ExitStatus, error) {
	resp, err := c.openStream(ctx, http.MethodGet, sandboxPath(id, "execs", execID, "stream"), execQuery, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readStream(resp.Body, execID, h)
}

// streamRecord is one NDJSON line of an exec stream.
type streamRecord struct {
	Type    string `json:"type"`
	ExecID  string `json:"exec_id"`
	PID     int    `json:"pid"`
	Data    string `json:"data"`
	Message string `json:"message"` // paused: what happened
	Error   *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	wireExit
}

// readStream parses an exec NDJSON stream (base64 data) from r, calling h,
// until the "exit" record. Unknown record types are ignored. execID names
// the exec in a *StreamError until a "start" record names it.
func readStream(r io.Reader, execID string, h ExecHandlers) (*ExitStatus, error) {
	rr := newRecordReader(r, maxLine)
	for {
		rec, partial, err := rr.next()
		if err != nil {
			if partial {
				err = fmt.Errorf("truncated record: %w", err)
			}
			return nil, &StreamError{ExecID: execID, Err: err}
		}
		var m streamRecord
		if err := json.Unmarshal(rec, &m); err != nil {
			return nil, &StreamError{ExecID: execID, Err: fmt.Errorf("bad record: %w", err)}
		}
		switch m.Type {
		case "start":
			execID = m.ExecID
			if h.OnStart != nil {
				h.OnStart(m.ExecID, m.PID)
			}
		case "stdout", "stderr":
			p, err := base64.StdEncoding.DecodeString(m.Data)
			if err != nil {
				return nil, &StreamError{ExecID: execID, Err: fmt.Errorf("bad %s data: %w", m.Type, err)}
			}
			f := h.OnStdout
			if m.Type == "stderr" {
				f = h.OnStderr
			}
			if f != nil {
				f(p)
			}
		case "exit":
			st := m.status()
			return &st, nil
		case "paused": // the sandbox was paused; the exec goes on when it resumes
			if m.ExecID != "" {
				execID = m.ExecID
			}
			return nil, &StreamError{ExecID: execID, Err: ErrExecPaused}
		case "error": // the server ended the stream (it is stopping); the exec goes on
			msg := "the server ended the stream"
			if m.Error != nil {
				msg = m.Error.Code + ": " + m.Error.Message
			}
			return nil, &StreamError{ExecID: execID, Err: errors.New(msg)}
		}
	}
}

// ExecInfo describes an exec known to the server.
type ExecInfo struct {
	ID        string      `json:"exec_id"`
	Cmd       []string    `json:"cmd"`
	PID       int         `json:"pid"`
	State     string      `json:"state"` // "running" or "exited"
	StartedAt time.Time   `json:"started_at"`
	EndedAt   time.Time   `json:"ended_at"` // zero while running
	Exit      *ExitStatus `json:"-"`        // nil while running
}

// UnmarshalJSON decodes the wire form, whose "exit" is null or an exit record.
func (e *ExecInfo) UnmarshalJSON(b []byte) error {
	type plain ExecInfo
	var w struct {
		plain
		Exit *wireExit `json:"exit"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*e = ExecInfo(w.plain)
	if w.Exit != nil {
		st := w.Exit.status()
		e.Exit = &st
	}
	return nil
}

// ListExecs returns the execs of sandbox id.
func (c *Client) ListExecs(ctx context.Context, id string) ([]ExecInfo, error) {
	var out struct {
		Execs []ExecInfo `json:"execs"`
	}
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "execs"), nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return out.Execs, nil
}

// GetExec returns exec execID of sandbox id.
func (c *Client) GetExec(ctx context.Context, id, execID string) (*ExecInfo, error) {
	var out ExecInfo
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id, "execs", execID), nil, nil, &out, http.StatusOK); err != nil {
		return nil, err
	}
	return &out, nil
}

// SendStdin writes data to the stdin of exec execID (started with
// StdinOpen) and, if closeStdin, closes it afterwards.
func (c *Client) SendStdin(ctx context.Context, id, execID string, data []byte, closeStdin bool) error {
	var q url.Values
	if closeStdin {
		q = url.Values{"close": {"true"}}
	}
	req, err := c.newRequest(ctx, http.MethodPost, sandboxPath(id, "execs", execID, "stdin"), q, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req, http.StatusNoContent, http.StatusOK)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Signal sends signal number sig (e.g. 15 for SIGTERM) to exec execID.
func (c *Client) Signal(ctx context.Context, id, execID string, sig int) error {
	in := struct {
		Signal int `json:"signal"`
	}{sig}
	return c.doJSON(ctx, http.MethodPost, sandboxPath(id, "execs", execID, "signal"), nil, in, nil, http.StatusNoContent, http.StatusOK)
}
