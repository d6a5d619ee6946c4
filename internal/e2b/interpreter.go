package e2b

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// interpreterKeepalive is how often a busy /execute stream carries a
// keepalive line (E2B's code interpreter: 5 s).
const interpreterKeepalive = 5 * time.Second

// trafficToken is sandbox id's trafficAccessToken, which E2B's
// code-interpreter SDK sends on every call to port 49999 (its context
// calls carry no envd token): the API's preview token (Config.TrafficToken).
func (h *handler) trafficToken(id string) string { return h.cfg.TrafficToken(id) }

// newInterpreter builds the handler of E2B's code-interpreter port over
// airlock's code contexts: /execute (NDJSON) and /contexts.
func (h *handler) newInterpreter() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /execute", h.execute)
	mux.HandleFunc("POST /contexts", h.createContext)
	mux.HandleFunc("GET /contexts", h.listContexts)
	mux.HandleFunc("DELETE /contexts/{ctx}", h.removeContext)
	mux.HandleFunc("POST /contexts/{ctx}/restart", h.restartContext)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		textError(w, http.StatusNotFound, fmt.Sprintf("the code interpreter has no route %s %s", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, ok := targetOf(r.Context())
		tt, et := r.Header.Get("E2B-Traffic-Access-Token"), r.Header.Get("X-Access-Token")
		switch {
		case ok && tt != "" && subtle.ConstantTimeCompare([]byte(tt), []byte(h.trafficToken(t.id))) == 1:
		case ok && et != "" && h.tokenOK(t.id, et):
		default:
			textError(w, http.StatusUnauthorized, "missing or invalid access token (E2B-Traffic-Access-Token: the trafficAccessToken of the sandbox's create or connect)")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// textError answers as E2B's code interpreter does: the message as the
// body (the SDK puts it in NotFoundError and friends).
func textError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg))
}

// interpreterFail answers a manager error: an unknown context is 404 with
// E2B's words, a sandbox gone since the request came in E2B's 502.
func (h *handler) interpreterFail(w http.ResponseWriter, r *http.Request, err error, contextID string) {
	switch {
	case errors.Is(err, sandbox.ErrNoSandbox):
		writeJSON(w, http.StatusBadGateway, map[string]any{"message": "The sandbox was not found", "code": http.StatusBadGateway})
		return
	case errors.Is(err, errdefs.ErrNotFound) && contextID != "":
		textError(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", contextID))
		return
	}
	status, _, msg := api.PublicError(err)
	if status >= 500 {
		h.cfg.Log.Error("e2b code interpreter request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	textError(w, status, msg)
}

// language maps E2B's language names to airlock's.
func language(l string) (string, error) {
	switch strings.ToLower(l) {
	case "", "python", "python3":
		return guest.LangPython, nil
	case "js", "javascript":
		return guest.LangJavaScript, nil
	case "bash", "sh":
		return guest.LangBash, nil
	}
	return "", fmt.Errorf("%w: language %q is not supported by airlock (python, javascript, bash)", errdefs.ErrInvalid, l)
}

// e2bContext is a context as E2B's SDK returns it to its user.
type e2bContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func viewContext(ci guest.ContextInfo) e2bContext {
	cwd := ci.Cwd
	if cwd == "" {
		cwd = home("")
	}
	return e2bContext{ID: ci.ID, Language: ci.Language, Cwd: cwd}
}

func (h *handler) createContext(w http.ResponseWriter, r *http.Request) {
	t, _ := targetOf(r.Context())
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if !decodeText(w, r, &req) {
		return
	}
	lang, err := language(req.Language)
	if err != nil {
		textError(w, http.StatusBadRequest, err.Error())
		return
	}
	spec := guest.ContextSpec{Language: lang}
	if req.Cwd != "" {
		if spec.Cwd, err = guestPath(req.Cwd, ""); err != nil {
			textError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	ci, err := h.cfg.Contexts.CreateContext(r.Context(), t.c, t.id, spec)
	if err != nil {
		h.interpreterFail(w, r, err, "")
		return
	}
	writeJSON(w, http.StatusOK, viewContext(ci))
}

func (h *handler) listContexts(w http.ResponseWriter, r *http.Request) {
	t, _ := targetOf(r.Context())
	cis, err := h.cfg.Contexts.ListContexts(r.Context(), t.c, t.id)
	if err != nil {
		h.interpreterFail(w, r, err, "")
		return
	}
	out := []e2bContext{}
	for _, ci := range cis {
		if !ci.IsDefault { // E2B lists the contexts its user made
			out = append(out, viewContext(ci))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) removeContext(w http.ResponseWriter, r *http.Request) {
	t, _ := targetOf(r.Context())
	id := r.PathValue("ctx")
	if err := h.cfg.Contexts.DeleteContext(r.Context(), t.c, t.id, id); err != nil {
		h.interpreterFail(w, r, err, id)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (h *handler) restartContext(w http.ResponseWriter, r *http.Request) {
	t, _ := targetOf(r.Context())
	id := r.PathValue("ctx")
	if _, err := h.cfg.Contexts.RestartContext(r.Context(), t.c, t.id, id); err != nil {
		h.interpreterFail(w, r, err, id)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// execute serves POST /execute: the code runs in the named context (or
// the default one of its language) and every event goes out as one NDJSON
// line as it happens, with a keepalive line every 5 s while the code is
// quiet, then end_of_execution.
func (h *handler) execute(w http.ResponseWriter, r *http.Request) {
	t, _ := targetOf(r.Context())
	var req struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if !decodeText(w, r, &req) {
		return
	}
	cr := guest.CodeRequest{Code: req.Code, ContextID: req.ContextID}
	switch {
	case req.ContextID != "" && req.Language != "":
		textError(w, http.StatusBadRequest, "context_id and language cannot be provided at the same time")
		return
	case len(req.EnvVars) > 0:
		textError(w, http.StatusBadRequest, "env_vars for one run are not supported by airlock yet; give the sandbox its envs at create, or set them in the code")
		return
	case req.ContextID == "":
		lang, err := language(req.Language)
		if err != nil {
			textError(w, http.StatusBadRequest, err.Error())
			return
		}
		cr.Language = lang
	}
	if err := sandbox.ValidateRunCode(cr); err != nil {
		if req.ContextID != "" && guest.ValidateContextID(req.ContextID) != nil {
			textError(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", req.ContextID))
			return
		}
		textError(w, http.StatusBadRequest, strings.TrimPrefix(err.Error(), errdefs.ErrInvalid.Error()+": "))
		return
	}
	s := &ndjson{w: w, rc: http.NewResponseController(w)}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := s.keepalive(ctx)
	err := h.cfg.Contexts.RunCode(ctx, t.c, t.id, cr, s.event)
	stop()
	switch {
	case err == nil:
		s.line(map[string]any{"type": "end_of_execution"})
	case !s.started:
		h.interpreterFail(w, r, err, req.ContextID)
	default:
		// Mid-stream: the status is sent. Say what happened as an error
		// line, then end, so the SDK's Execution carries it.
		_, _, msg := api.PublicError(err)
		s.line(map[string]any{"type": "error", "name": "SandboxError", "value": msg, "traceback": ""})
		s.line(map[string]any{"type": "end_of_execution"})
	}
}

// ndjson writes E2B's execution stream: one JSON object per line, each
// flushed; stdout and stderr split only at whole UTF-8 characters.
type ndjson struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	mu      sync.Mutex
	started bool
	pending [2][]byte // stdout, stderr bytes of an unfinished character
}

func (s *ndjson) line(v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lineLocked(v)
}

func (s *ndjson) lineLocked(v any) {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.WriteHeader(http.StatusOK)
	}
	b, _ := json.Marshal(v)
	_, _ = s.w.Write(append(b, '\n'))
	_ = s.rc.Flush()
}

// keepalive writes a keepalive line every interpreterKeepalive until the
// returned stop is called.
func (s *ndjson) keepalive(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interpreterKeepalive)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				s.line(map[string]any{"type": "keepalive"})
			}
		}
	}()
	return func() { cancel(); <-done }
}

// event writes one code event in E2B's terms.
func (s *ndjson) event(ev guest.CodeEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	switch ev.Kind {
	case guest.EventStdout, guest.EventStderr:
		i, typ := 0, "stdout"
		if ev.Kind == guest.EventStderr {
			i, typ = 1, "stderr"
		}
		buf := append(s.pending[i], ev.Data...)
		n := completeUTF8(buf)
		s.pending[i] = append([]byte(nil), buf[n:]...)
		if n > 0 {
			s.lineLocked(map[string]any{"type": typ, "text": strings.ToValidUTF8(string(buf[:n]), "\uFFFD"), "timestamp": now})
		}
	case guest.EventResult:
		if ev.Result != nil {
			s.lineLocked(resultLine(ev.Result))
		}
	case guest.EventError:
		if e := ev.Error; e != nil {
			s.lineLocked(map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": strings.Join(e.Traceback, "\n")})
		}
	case guest.EventEnd:
		for i, typ := range []string{"stdout", "stderr"} {
			if len(s.pending[i]) > 0 {
				s.lineLocked(map[string]any{"type": typ, "text": strings.ToValidUTF8(string(s.pending[i]), "\uFFFD"), "timestamp": now})
				s.pending[i] = nil
			}
		}
		if ev.End != nil && ev.End.ExecutionCount > 0 {
			s.lineLocked(map[string]any{"type": "number_of_executions", "execution_count": ev.End.ExecutionCount})
		}
		if ev.End != nil && ev.End.TimedOut {
			s.lineLocked(map[string]any{"type": "error", "name": "TimeoutError", "value": "the code ran past its timeout and was interrupted", "traceback": ""})
		}
	}
	return nil
}

// completeUTF8 is the length of b's longest prefix that does not end in
// the middle of a UTF-8 character (at most 3 bytes are held back).
func completeUTF8(b []byte) int {
	for back := 1; back <= 3 && back <= len(b); back++ {
		c := b[len(b)-back]
		if c < 0x80 {
			return len(b) // ASCII: complete
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-back:]) {
				return len(b)
			}
			return len(b) - back
		}
	}
	return len(b)
}

// resultFields maps MIME types to the fields of E2B's result lines; binary
// ones are base64.
var resultFields = map[string]struct {
	field  string
	binary bool
}{
	"text/plain":             {"text", false},
	"text/html":              {"html", false},
	"text/markdown":          {"markdown", false},
	"image/svg+xml":          {"svg", false},
	"image/png":              {"png", true},
	"image/jpeg":             {"jpeg", true},
	"application/pdf":        {"pdf", true},
	"text/latex":             {"latex", false},
	"application/javascript": {"javascript", false},
}

// resultLine is a rich result as E2B's result line: its known formats in
// their fields, application/json parsed, anything else under extra.
func resultLine(res *guest.CodeResult) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": res.Main}
	extra := map[string]any{}
	for mime, data := range res.Data {
		if f, ok := resultFields[mime]; ok {
			switch {
			case mime == "text/plain":
				// E2B's server hands a string's repr over without its
				// quotes: 'abc' is abc.
				t := string(data)
				if len(t) >= 2 && t[0] == '\'' && t[len(t)-1] == '\'' {
					t = t[1 : len(t)-1]
				}
				out[f.field] = t
			case f.binary:
				out[f.field] = base64.StdEncoding.EncodeToString(data)
			default:
				out[f.field] = string(data)
			}
			continue
		}
		if mime == "application/json" {
			var v any
			if json.Unmarshal(data, &v) == nil {
				out["json"] = v
				continue
			}
		}
		if utf8.Valid(data) {
			extra[mime] = string(data)
		} else {
			extra[mime] = base64.StdEncoding.EncodeToString(data)
		}
	}
	if len(extra) > 0 {
		out["extra"] = extra
	}
	return out
}

// decodeText reads a JSON body of at most maxBody into v, answering 400 in
// the code interpreter's plain-text shape; an empty body leaves v as is.
func decodeText(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := json.NewDecoder(r.Body).Decode(v); err != nil && !errors.Is(err, io.EOF) {
		textError(w, http.StatusBadRequest, "bad JSON body: "+err.Error())
		return false
	}
	return true
}
