package api

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
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
}

func viewExit(ex *agentv1.ExecExited) *exitView {
	if ex == nil {
		return nil
	}
	code := ex.GetExitCode()
	if ex.GetSignal() > 0 {
		code = -1
	}
	return &exitView{code, ex.GetSignal(), ex.GetTimedOut(), ex.GetOutputTruncated(), ex.GetDurationMs()}
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

// startFor builds the agent's ExecStart: the sandbox's env under the
// request's.
func startFor(req execRequest, sandboxEnv map[string]string) (*agentv1.ExecStart, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, invalidf("cmd must be a non-empty array")
	}
	if req.TimeoutS < 0 || req.TimeoutS > 24*3600 {
		return nil, invalidf("timeout_s must be between 0 and 86400")
	}
	env := maps.Clone(sandboxEnv)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return nil, invalidf("env names must be non-empty without '=' or NUL, values without NUL")
		}
		env[k] = v
	}
	st := &agentv1.ExecStart{
		Argv: req.Cmd, Cwd: req.Cwd, User: req.User,
		Stdin: req.Stdin != nil || req.StdinOpen, TimeoutMs: uint32(req.TimeoutS) * 1000,
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		st.Env = append(st.Env, k+"="+env[k])
	}
	return st, nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	b64 := r.URL.Query().Get("encoding") == "base64"
	var req execRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	start, err := startFor(req, sb.Env)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var stdin []byte
	if req.Stdin != nil {
		stdin = []byte(*req.Stdin)
		if b64 {
			if stdin, err = base64.StdEncoding.DecodeString(*req.Stdin); err != nil {
				s.fail(w, r, invalidf("stdin is not valid base64"))
				return
			}
		}
	}
	k := keyOf(r)
	t0 := time.Now()
	info, err := ex.StartExec(r.Context(), sb.ID, start, Actor{Tenant: k.Tenant, KeyID: k.ID}, req.KillOnDisconnect)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.metrics.execLat.Observe(time.Since(t0).Seconds())
	if req.Stdin != nil {
		if err := ex.ExecInput(r.Context(), sb.ID, info.ID, stdin, !req.StdinOpen); err != nil {
			s.log.Warn("exec stdin", "request_id", requestID(r), "sandbox_id", sb.ID, "exec_id", info.ID, "err", err)
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
	s.attach(r, nw, ex, sb.ID, info.ID)
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
func (n *ndjson) event(ev *agentv1.ExecResponse) (done bool, err error) {
	switch e := ev.GetEvent().(type) {
	case *agentv1.ExecResponse_Stdout:
		return false, n.line(map[string]any{"type": "stdout", "data": n.data(e.Stdout)})
	case *agentv1.ExecResponse_Stderr:
		return false, n.line(map[string]any{"type": "stderr", "data": n.data(e.Stderr)})
	case *agentv1.ExecResponse_Exited:
		x := viewExit(e.Exited)
		return true, n.line(map[string]any{"type": "exit", "code": x.Code, "signal": x.Signal, "timeout": x.Timeout,
			"truncated": x.Truncated, "duration_ms": x.DurationMS})
	}
	return false, nil // "started" is not repeated
}

var errStreamDone = errors.New("exit written")

// attach streams an exec's events to nw until its exit line, the client's
// departure (the exec keeps running unless kill_on_disconnect) or an error.
func (s *Server) attach(r *http.Request, nw *ndjson, ex Execs, sandboxID, execID string) {
	err := ex.AttachExec(r.Context(), sandboxID, execID, true, func(ev *agentv1.ExecResponse) error {
		done, err := nw.event(ev)
		if err == nil && done {
			return errStreamDone
		}
		return err
	})
	if err != nil && !errors.Is(err, errStreamDone) && r.Context().Err() == nil {
		s.log.Warn("exec stream ended early", "request_id", requestID(r), "sandbox_id", sandboxID, "exec_id", execID, "err", err)
	}
}

// execOf resolves {id} and {exec_id}; an unknown or malformed exec id is
// errNoExec.
func (s *Server) execOf(w http.ResponseWriter, r *http.Request) (Execs, string, ExecInfo, bool) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return nil, "", ExecInfo{}, false
	}
	ex, ok := s.execs(w, r)
	if !ok {
		return nil, "", ExecInfo{}, false
	}
	// A malformed id is ErrNotFound from GetExec, like an unknown one.
	eid := r.PathValue("exec_id")
	info, err := ex.GetExec(r.Context(), sb.ID, eid)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = errNoExec
		}
		s.fail(w, r, err)
		return nil, "", ExecInfo{}, false
	}
	return ex, sb.ID, info, true
}

func (s *Server) listExecs(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	infos, err := ex.ListExecs(r.Context(), sb.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]Exec, 0, len(infos))
	for _, e := range infos {
		out = append(out, viewExec(e))
	}
	writeJSON(w, http.StatusOK, map[string][]Exec{"execs": out})
}

func (s *Server) getExec(w http.ResponseWriter, r *http.Request) {
	if _, _, info, ok := s.execOf(w, r); ok {
		writeJSON(w, http.StatusOK, viewExec(info))
	}
}

func (s *Server) streamExec(w http.ResponseWriter, r *http.Request) {
	ex, sid, info, ok := s.execOf(w, r)
	if !ok {
		return
	}
	nw := newNDJSON(w, r.URL.Query().Get("encoding") == "base64")
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = nw.rc.Flush()
	s.attach(r, nw, ex, sid, info.ID)
}

func (s *Server) execStdin(w http.ResponseWriter, r *http.Request) {
	ex, sid, info, ok := s.execOf(w, r)
	if !ok {
		return
	}
	closeStdin := r.URL.Query().Get("close") == "true"
	// Streamed in chunks: a large body never sits in memory whole.
	body := idleReader{r.Body, http.NewResponseController(w)}
	buf := make([]byte, 64<<10)
	for {
		n, rerr := io.ReadFull(body, buf)
		last := rerr != nil
		if n > 0 || (last && closeStdin) {
			if err := ex.ExecInput(r.Context(), sid, info.ID, buf[:n], last && closeStdin); err != nil {
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
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) execSignal(w http.ResponseWriter, r *http.Request) {
	ex, sid, info, ok := s.execOf(w, r)
	if !ok {
		return
	}
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
	if err := ex.ExecSignal(r.Context(), sid, info.ID, req.Signal); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
