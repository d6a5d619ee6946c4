package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

type execRequest struct {
	Cmd              []string          `json:"cmd"`
	Env              map[string]string `json:"env"`
	Cwd              string            `json:"cwd"`
	User             string            `json:"user"`
	Stdin            *string           `json:"stdin"`
	StdinOpen        bool              `json:"stdin_open"`
	TimeoutS         int               `json:"timeout_s"`
	Background       bool              `json:"background"`
	KillOnDisconnect bool              `json:"kill_on_disconnect"`
	PidsLimit        int64             `json:"pids_limit"`
}

// Exec is the API's view of an exec session.
type Exec struct {
	ExecID    string     `json:"exec_id"`
	Cmd       []string   `json:"cmd"`
	PID       int        `json:"pid"`
	State     string     `json:"state"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at"`
	Exit      *exitView  `json:"exit"`
}

type exitView struct {
	Code       int32 `json:"code"`
	Signal     int32 `json:"signal"`
	Timeout    bool  `json:"timeout"`
	Truncated  bool  `json:"truncated"`
	DurationMS int64 `json:"duration_ms"`
	OOMKilled  bool  `json:"oom_killed"`
}

func viewExit(ex *guest.ExitStatus) *exitView {
	if ex == nil {
		return nil
	}
	code := int32(ex.Code)
	if ex.Signal > 0 {
		code = -1
	}
	return &exitView{code, int32(ex.Signal), ex.TimedOut, ex.Truncated, ex.Duration.Milliseconds(), ex.OOMKilled}
}

func viewExec(e ExecInfo) Exec {
	v := Exec{ExecID: e.ID, Cmd: e.Argv, PID: e.PID, State: e.State, StartedAt: e.StartedAt.UTC(), Exit: viewExit(e.Exit)}
	if v.Cmd == nil {
		v.Cmd = []string{}
	}
	if !e.EndedAt.IsZero() {
		t := e.EndedAt.UTC()
		v.EndedAt = &t
	}
	return v
}

// execs returns the exec service or answers 503.
func (s *Server) execs(w http.ResponseWriter, r *http.Request) (Execs, bool) {
	if s.cfg.Execs == nil {
		s.fail(w, r, errNoExecs)
		return nil, false
	}
	return s.cfg.Execs, true
}

// execFail answers an error of the exec service: a sandbox the caller
// cannot use and an unknown exec keep the API's own words; a program the
// guest could not start is 422 exec_not_started (the sandbox is fine, so
// it must not read as a missing sandbox). A request that
// is invalid for a sandbox the caller cannot use is answered 404 all the
// same (so ids cannot be probed): only this error path reads the sandbox
// again.
func (s *Server) execFail(w http.ResponseWriter, r *http.Request, err error) {
	switch se, notStarted := guest.AsStartError(err); {
	case notStarted:
		err = &Error{http.StatusUnprocessableEntity, "exec_not_started", se.Error()}
	case guest.IsNoExec(err):
		err = errNoExec
	case errors.Is(err, errdefs.ErrNotFound):
		err = noSandbox(r, err)
	case publicError(err).Status == http.StatusBadRequest:
		s.requestFail(w, r, err)
		return
	}
	s.fail(w, r, err)
}

// requestFail answers a request the API refused before the manager saw
// it, or errNoSandbox if the caller cannot use the sandbox.
func (s *Server) requestFail(w http.ResponseWriter, r *http.Request, err error) {
	if _, verr := s.sandbox(r); verr != nil {
		err = verr
	}
	s.fail(w, r, err)
}

// specFor translates the request (the sandbox's env is merged under it by
// the shim; the manager validates the rest).
//
// pids_limit (0: the guest's default, 1024) is bounded by the kernel's
// own pid_max ceiling.
// maxPidsLimit is the largest pids_limit: the kernel's PID_MAX_LIMIT.
const maxPidsLimit = 4 << 20

func specFor(req execRequest) (guest.ExecSpec, error) {
	if req.TimeoutS < 0 || req.TimeoutS > 24*3600 {
		return guest.ExecSpec{}, invalidf("timeout_s must be between 0 and 86400")
	}
	if req.PidsLimit < 0 || req.PidsLimit > maxPidsLimit {
		return guest.ExecSpec{}, invalidf("pids_limit must be between 0 and %d", maxPidsLimit)
	}
	return guest.ExecSpec{
		Argv: req.Cmd, Env: req.Env, Cwd: req.Cwd, User: req.User,
		Stdin: req.Stdin != nil || req.StdinOpen, Timeout: time.Duration(req.TimeoutS) * time.Second,
		PidsLimit: uint32(req.PidsLimit),
	}, nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	b64 := r.URL.Query().Get("encoding") == "base64"
	var req execRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.requestFail(w, r, err)
		return
	}
	spec, err := specFor(req)
	if err != nil {
		s.requestFail(w, r, err)
		return
	}
	var stdin []byte
	if req.Stdin != nil {
		stdin = []byte(*req.Stdin)
		if b64 {
			if stdin, err = base64.StdEncoding.DecodeString(*req.Stdin); err != nil {
				s.requestFail(w, r, invalidf("stdin is not valid base64"))
				return
			}
		}
	}
	sid := r.PathValue("id")
	// A background exec has no stream whose end could kill it.
	st, err := ex.Exec(r.Context(), callerOf(r), sid, spec, req.KillOnDisconnect && !req.Background)
	if err != nil {
		s.execFail(w, r, err)
		return
	}
	defer st.Close()
	info := st.Info()
	if req.Stdin != nil {
		if err := s.execStdinOnce(r, ex, st, stdin, !req.StdinOpen, req.Background); err != nil {
			s.log.Warn("exec stdin", "request_id", requestID(r), "sandbox_id", sid, "exec_id", info.ID, "err", err)
		}
	}
	if req.Background {
		writeJSON(w, http.StatusAccepted, map[string]any{"exec_id": info.ID, "pid": info.PID})
		return
	}
	nw := newNDJSON(w, b64)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if err := nw.line(map[string]any{"type": "start", "exec_id": info.ID, "pid": info.PID}); err != nil {
		return
	}
	s.stream(r, nw, st, sid)
}

// execStdinOnce hands the request's stdin to a just started exec. A
// streamed exec sends it on its own stream (which stays open until the
// exit). A background exec's stream ends at once, which could drop input
// still in flight: its stdin goes over a control stream whose end reports
// that the shim passed all of it on.
func (s *Server) execStdinOnce(r *http.Request, ex Execs, st guest.ExecStream, data []byte, closeStdin, background bool) error {
	if background {
		cs, err := ex.ExecControl(r.Context(), callerOf(r), r.PathValue("id"), st.Info().ID)
		if err != nil {
			return err
		}
		defer cs.Close()
		st = cs
	}
	err := st.Stdin(data)
	if err == nil && closeStdin {
		err = st.CloseStdin()
	}
	if err == nil && background {
		err = st.Finish()
	}
	return err
}

// ndjson writes one JSON object per line and flushes after each, with a
// rolling write deadline so a client that stops reading is dropped.
type ndjson struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
	b64 bool
}

func newNDJSON(w http.ResponseWriter, b64 bool) *ndjson {
	return &ndjson{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w), b64: b64}
}

func (n *ndjson) line(v any) error {
	_ = n.rc.SetWriteDeadline(time.Now().Add(ioIdle))
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	return n.rc.Flush()
}

func (n *ndjson) data(b []byte) string {
	if n.b64 {
		return base64.StdEncoding.EncodeToString(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// event writes one exec event; done is true after the exit line.
func (n *ndjson) event(ev guest.ExecEvent) (done bool, err error) {
	switch ev.Kind {
	case guest.ExecStdout:
		return false, n.line(map[string]any{"type": "stdout", "data": n.data(ev.Data)})
	case guest.ExecStderr:
		return false, n.line(map[string]any{"type": "stderr", "data": n.data(ev.Data)})
	case guest.ExecExited:
		x := viewExit(ev.Exit)
		if x == nil {
			x = &exitView{}
		}
		return true, n.line(map[string]any{"type": "exit", "code": x.Code, "signal": x.Signal, "timeout": x.Timeout,
			"truncated": x.Truncated, "duration_ms": x.DurationMS, "oom_killed": x.OOMKilled})
	}
	return false, nil
}

// stream writes an exec's events to nw until its exit line, the client's
// departure (the exec keeps running unless kill_on_disconnect) or an error.
func (s *Server) stream(r *http.Request, nw *ndjson, st guest.ExecStream, sandboxID string) {
	for {
		ev, err := st.Recv()
		if err != nil {
			if errors.Is(err, guest.ErrExecPaused) {
				_ = nw.line(map[string]any{"type": "paused", "exec_id": st.Info().ID,
					"message": "the sandbox was paused; the exec goes on when it resumes: re-attach at GET /v1/sandboxes/" + sandboxID + "/execs/" + st.Info().ID + "/stream (which resumes it)"})
				return
			}
			if errors.Is(context.Cause(r.Context()), ErrStopping) {
				// The client may still be reading: say why the stream ends.
				_ = nw.line(map[string]any{"type": "error", "error": map[string]string{"code": "unavailable",
					"message": "the server is stopping; the exec goes on: re-attach at GET /v1/sandboxes/" + sandboxID + "/execs/" + st.Info().ID + "/stream"}})
				return
			}
			if r.Context().Err() == nil {
				s.log.Warn("exec stream ended early", "request_id", requestID(r), "sandbox_id", sandboxID, "exec_id", st.Info().ID, "err", err)
			}
			return
		}
		if done, err := nw.event(ev); err != nil || done {
			return
		}
	}
}

func (s *Server) listExecs(w http.ResponseWriter, r *http.Request) {
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	infos, err := ex.ListExecs(r.Context(), callerOf(r), r.PathValue("id"))
	if err != nil {
		s.execFail(w, r, err)
		return
	}
	out := make([]Exec, 0, len(infos))
	for _, e := range infos {
		out = append(out, viewExec(e))
	}
	writeJSON(w, http.StatusOK, map[string][]Exec{"execs": out})
}

func (s *Server) getExec(w http.ResponseWriter, r *http.Request) {
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	info, err := ex.GetExec(r.Context(), callerOf(r), r.PathValue("id"), r.PathValue("exec_id"))
	if err != nil {
		s.execFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewExec(info))
}

func (s *Server) streamExec(w http.ResponseWriter, r *http.Request) {
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	sid := r.PathValue("id")
	st, err := ex.AttachExec(r.Context(), callerOf(r), sid, r.PathValue("exec_id"), true)
	if err != nil {
		s.execFail(w, r, err)
		return
	}
	defer st.Close()
	nw := newNDJSON(w, r.URL.Query().Get("encoding") == "base64")
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = nw.rc.Flush()
	s.stream(r, nw, st, sid)
}

// control opens a control stream to {exec_id} of {id}, or answers.
func (s *Server) control(w http.ResponseWriter, r *http.Request) (guest.ExecStream, bool) {
	ex, ok := s.execs(w, r)
	if !ok {
		return nil, false
	}
	st, err := ex.ExecControl(r.Context(), callerOf(r), r.PathValue("id"), r.PathValue("exec_id"))
	if err != nil {
		s.execFail(w, r, err)
		return nil, false
	}
	return st, true
}

func (s *Server) execStdin(w http.ResponseWriter, r *http.Request) {
	st, ok := s.control(w, r)
	if !ok {
		return
	}
	defer st.Close()
	closeStdin := r.URL.Query().Get("close") == "true"
	// Streamed in chunks: a large body never sits in memory whole.
	body := idleReader{r.Body, http.NewResponseController(w)}
	buf := make([]byte, 64<<10)
	for {
		n, rerr := io.ReadFull(body, buf)
		last := rerr != nil
		if n > 0 {
			if err := st.Stdin(buf[:n]); err != nil {
				s.fail(w, r, err)
				return
			}
		}
		if last {
			if !errors.Is(rerr, io.EOF) && !errors.Is(rerr, io.ErrUnexpectedEOF) {
				s.fail(w, r, invalidf("reading the request body failed"))
				return
			}
			break
		}
	}
	if closeStdin {
		if err := st.CloseStdin(); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if err := st.Finish(); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) execSignal(w http.ResponseWriter, r *http.Request) {
	st, ok := s.control(w, r)
	if !ok {
		return
	}
	defer st.Close()
	var req struct {
		Signal int32 `json:"signal"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Signal < 1 || req.Signal > 64 {
		s.fail(w, r, invalidf("signal must be between 1 and 64"))
		return
	}
	if err := st.Signal(int(req.Signal)); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := st.Finish(); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
