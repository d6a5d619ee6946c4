package api

import (
	"encoding/base64"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Context is the API's view of a code context.
type Context struct {
	ID        string    `json:"id"`
	Language  string    `json:"language"`
	Cwd       string    `json:"cwd"`
	CreatedAt time.Time `json:"created_at"`
	State     string    `json:"state"`
	IsDefault bool      `json:"is_default"`
	// Exit says how a dead context's interpreter ended, when the guest
	// agent says.
	Exit *ContextExit `json:"exit,omitempty"`
}

// ContextExit is how a context's interpreter ended.
type ContextExit struct {
	// Reason is "out of memory", "killed by signal N" or "exit code N".
	Reason    string `json:"reason"`
	Code      int    `json:"code"`
	Signal    int    `json:"signal"`
	OOMKilled bool   `json:"oom_killed"`
}

func viewContext(in guest.ContextInfo) Context {
	out := Context{
		ID: in.ID, Language: in.Language, Cwd: in.Cwd,
		CreatedAt: in.CreatedAt.UTC(), State: in.State, IsDefault: in.IsDefault,
	}
	if e := in.Exit; e != nil {
		out.Exit = &ContextExit{Reason: e.Reason(), Code: e.Code, Signal: e.Signal, OOMKilled: e.OOMKilled}
	}
	return out
}

type codeRequest struct {
	Code        string   `json:"code"`
	Language    string   `json:"language"`
	Context     string   `json:"context"`
	TimeoutS    int      `json:"timeout_s"`
	ReturnFiles []string `json:"return_files"`
}

type createContextRequest struct {
	ID       string            `json:"id"`
	Language string            `json:"language"`
	Cwd      string            `json:"cwd"`
	Env      map[string]string `json:"env"`
}

// contexts returns the sandbox {id} (tenancy checked) and the context
// service, or answers the request.
func (s *Server) contexts(w http.ResponseWriter, r *http.Request) (string, Contexts, bool) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return "", nil, false
	}
	if s.cfg.Contexts == nil {
		s.fail(w, r, errNoContexts)
		return "", nil, false
	}
	return sb.ID, s.cfg.Contexts, true
}

// contextFail answers a context-method error: an unknown context is
// errNoContext, an old agent errOldAgent.
func (s *Server) contextFail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, errdefs.ErrUnsupported):
		err = errOldAgent
	case errors.Is(err, errdefs.ErrNotFound):
		err = errNoContext
	}
	s.fail(w, r, err)
}

// textMIME reports whether a result's MIME type holds UTF-8 text (sent as a
// JSON string); anything else is sent base64-encoded.
func textMIME(mime string) bool {
	switch {
	case strings.HasPrefix(mime, "text/"), mime == "image/svg+xml", mime == "application/json",
		mime == "application/javascript", strings.HasSuffix(mime, "+json"), strings.HasSuffix(mime, "+xml"):
		return true
	}
	return false
}

// resultData is a result's JSON form: text types as strings, others base64.
func resultData(data map[string][]byte) map[string]string {
	out := make(map[string]string, len(data))
	for k, v := range data {
		if textMIME(k) {
			out[k] = strings.ToValidUTF8(string(v), "\uFFFD")
		} else {
			out[k] = base64.StdEncoding.EncodeToString(v)
		}
	}
	return out
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	sid, cs, ok := s.contexts(w, r)
	if !ok {
		return
	}
	var req codeRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	if req.TimeoutS < 0 || req.TimeoutS > 24*3600 {
		s.fail(w, r, invalidf("timeout_s must be between 0 and 86400"))
		return
	}
	if req.Context != "" && req.Language != "" {
		s.fail(w, r, invalidf("give context or language, not both"))
		return
	}
	areq := guest.CodeRequest{ContextID: req.Context, Language: req.Language, Code: req.Code, Timeout: time.Duration(req.TimeoutS) * time.Second,
		ReturnFiles: req.ReturnFiles}
	if err := sandbox.ValidateRunCode(areq); err != nil {
		s.fail(w, r, err)
		return
	}
	nw := newNDJSON(w, false)
	started := false
	err := cs.RunCode(r.Context(), callerOf(r), sid, areq, func(ev guest.CodeEvent) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		switch ev.Kind {
		case guest.EventStdout:
			return nw.line(map[string]any{"type": "stdout", "data": nw.data(ev.Data)})
		case guest.EventStderr:
			return nw.line(map[string]any{"type": "stderr", "data": nw.data(ev.Data)})
		case guest.EventResult:
			line := map[string]any{"type": "result", "main": ev.Result.Main, "data": resultData(ev.Result.Data)}
			if ev.Result.File != "" {
				line["file"] = ev.Result.File
			}
			return nw.line(line)
		case guest.EventStatus:
			return nw.line(map[string]any{"type": "status", "data": ev.Status})
		case guest.EventError:
			tb := ev.Error.Traceback
			if tb == nil {
				tb = []string{}
			}
			return nw.line(map[string]any{"type": "error", "name": ev.Error.Name, "value": ev.Error.Value, "traceback": tb})
		case guest.EventEnd:
			end := ev.End
			return nw.line(map[string]any{"type": "end", "timed_out": end.TimedOut, "truncated": end.Truncated,
				"duration_ms": end.Duration.Milliseconds(), "execution_count": end.ExecutionCount, "context": end.ContextID})
		}
		return nil
	})
	if err == nil {
		return
	}
	if !started {
		s.contextFail(w, r, err)
		return
	}
	if r.Context().Err() == nil {
		s.log.Warn("code stream ended early", "request_id", requestID(r), "sandbox_id", sid, "err", err)
		// The client learns of it from a missing end line; say why.
		_ = nw.line(map[string]any{"type": "error", "name": "AirlockError", "value": publicError(err).Message, "traceback": []string{}})
	}
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	sid, cs, ok := s.contexts(w, r)
	if !ok {
		return
	}
	infos, err := cs.ListContexts(r.Context(), callerOf(r), sid)
	if err != nil {
		s.contextFail(w, r, err)
		return
	}
	out := make([]Context, 0, len(infos))
	for _, in := range infos {
		out = append(out, viewContext(in))
	}
	writeJSON(w, http.StatusOK, map[string][]Context{"contexts": out})
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	sid, cs, ok := s.contexts(w, r)
	if !ok {
		return
	}
	var req createContextRequest
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	areq := guest.ContextSpec{ID: req.ID, Language: req.Language, Cwd: req.Cwd}
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		areq.Env = append(areq.Env, k+"="+req.Env[k])
	}
	if err := areq.Validate(); err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := cs.CreateContext(r.Context(), callerOf(r), sid, areq)
	if err != nil {
		if errors.Is(err, errdefs.ErrUnsupported) {
			err = errOldAgent
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, viewContext(info))
}

// contextRef resolves {id} and {ctx}; a malformed context id is
// errNoContext.
func (s *Server) contextRef(w http.ResponseWriter, r *http.Request) (string, string, Contexts, bool) {
	sid, cs, ok := s.contexts(w, r)
	if !ok {
		return "", "", nil, false
	}
	cid := r.PathValue("ctx")
	if guest.ValidateContextID(cid) != nil {
		s.fail(w, r, errNoContext)
		return "", "", nil, false
	}
	return sid, cid, cs, true
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) {
	sid, cid, cs, ok := s.contextRef(w, r)
	if !ok {
		return
	}
	if err := cs.DeleteContext(r.Context(), callerOf(r), sid, cid); err != nil {
		s.contextFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	sid, cid, cs, ok := s.contextRef(w, r)
	if !ok {
		return
	}
	info, err := cs.RestartContext(r.Context(), callerOf(r), sid, cid)
	if err != nil {
		s.contextFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewContext(info))
}

func (s *Server) interruptContext(w http.ResponseWriter, r *http.Request) {
	sid, cid, cs, ok := s.contextRef(w, r)
	if !ok {
		return
	}
	if err := cs.InterruptContext(r.Context(), callerOf(r), sid, cid); err != nil {
		s.contextFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
