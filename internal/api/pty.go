package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-sandbox/airlock/internal/guest"
)

// maxPTYMessage bounds one WebSocket message from the client (input or
// control).
const maxPTYMessage = 64 << 10

// ptyControl is a text message of the PTY WebSocket, either way.
type ptyControl struct {
	Type   string    `json:"type"`             // client: resize, signal; server: started, exit, error
	Rows   uint32    `json:"rows,omitempty"`   // resize
	Cols   uint32    `json:"cols,omitempty"`   // resize
	Signal int       `json:"signal,omitempty"` // signal
	ExecID string    `json:"exec_id,omitempty"`
	PID    int       `json:"pid,omitempty"`
	Exit   *exitView `json:"exit,omitempty"`
	Error  string    `json:"error,omitempty"`
}

// pty serves GET /v1/sandboxes/{id}/pty: a WebSocket to a command on a
// terminal in the guest. The command (repeated cmd; default a login shell),
// its size, env (repeated K=V), cwd and user are query parameters, or
// exec_id re-attaches to a running terminal exec (its retained output
// first). Errors before the upgrade are ordinary JSON answers. Then binary
// messages are the terminal's bytes both ways; text messages are JSON
// control: the client's {"type":"resize","rows","cols"} and
// {"type":"signal","signal"}, the server's {"type":"started","exec_id",
// "pid"} first and {"type":"exit","exit":{...}} last. The command is
// killed when the socket closes unless keep=true; a keep=true command the
// sandbox's pause parked ends the socket with {"type":"paused","exec_id"}
// instead of the exit, and goes on when the sandbox resumes.
func (s *Server) pty(w http.ResponseWriter, r *http.Request) {
	ex, ok := s.execs(w, r)
	if !ok {
		return
	}
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err) // the same 404 as every route for a sandbox the caller cannot use
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		w.Header().Set("Upgrade", "websocket")
		s.fail(w, r, &Error{http.StatusUpgradeRequired, "upgrade_required", "this route is a WebSocket: send Upgrade: websocket"})
		return
	}
	q := r.URL.Query()
	sid := sb.ID
	var st guest.ExecStream
	if id := q.Get("exec_id"); id != "" {
		st, err = ex.AttachExec(r.Context(), callerOf(r), sid, id, true)
		if err == nil && !st.Info().TTY {
			st.Close()
			s.requestFail(w, r, invalidf("exec %s does not run on a terminal", id))
			return
		}
	} else {
		spec, serr := ptySpec(q)
		if serr != nil {
			s.requestFail(w, r, serr)
			return
		}
		// The exec outlives this request (it is the shim's); the socket's
		// end kills it unless the client asked to keep it.
		st, err = ex.Exec(context.WithoutCancel(r.Context()), callerOf(r), sid, spec, q.Get("keep") != "true")
	}
	if err != nil {
		s.execFail(w, r, err)
		return
	}
	defer st.Close()
	// Same-origin only (the library's default): a page elsewhere cannot
	// open a terminal with the user's credentials.
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept answered
	}
	defer func() { _ = c.CloseNow() }()
	c.SetReadLimit(maxPTYMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// The client's going (or the server's) ends the exec stream, which
	// Recv below may be waiting on: without keep that kills the command.
	context.AfterFunc(ctx, st.Close)
	info := st.Info()
	if err := writeControl(ctx, c, ptyControl{Type: "started", ExecID: info.ID, PID: info.PID}); err != nil {
		return
	}
	go func() {
		defer cancel()
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if err := st.Stdin(b); err != nil {
					_ = writeControl(ctx, c, ptyControl{Type: "error", Error: "input: " + err.Error()})
				}
				continue
			}
			var m ptyControl
			if err := json.Unmarshal(b, &m); err != nil {
				_ = writeControl(ctx, c, ptyControl{Type: "error", Error: "a text message must be JSON control"})
				continue
			}
			switch m.Type {
			case "resize":
				err = st.Resize(guest.TermSize{Rows: m.Rows, Cols: m.Cols})
			case "signal":
				err = st.Signal(m.Signal)
			default:
				err = errors.New("unknown control type " + strconv.Quote(m.Type))
			}
			if err != nil {
				_ = writeControl(ctx, c, ptyControl{Type: "error", Error: m.Type + ": " + err.Error()})
			}
		}
	}()
	for {
		ev, err := st.Recv()
		if errors.Is(err, guest.ErrExecPaused) {
			_ = writeControl(ctx, c, ptyControl{Type: "paused", ExecID: st.Info().ID, Error: err.Error()})
			_ = c.Close(websocket.StatusNormalClosure, "paused")
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				_ = writeControl(ctx, c, ptyControl{Type: "error", Error: err.Error()})
				_ = c.Close(websocket.StatusInternalError, "the exec stream broke")
			}
			return
		}
		switch ev.Kind {
		case guest.ExecStdout, guest.ExecStderr:
			wctx, wcancel := context.WithTimeout(ctx, ioIdle)
			err = c.Write(wctx, websocket.MessageBinary, ev.Data)
			wcancel()
			if err != nil {
				return
			}
		case guest.ExecExited:
			_ = writeControl(ctx, c, ptyControl{Type: "exit", Exit: viewExit(ev.Exit)})
			_ = c.Close(websocket.StatusNormalClosure, "exited")
			return
		}
	}
}

func writeControl(ctx context.Context, c *websocket.Conn, m ptyControl) error {
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Write(ctx, websocket.MessageText, b)
}

// ptySpec reads a terminal exec from the query: cmd (repeated; default a
// login shell), rows and cols (default 24x80), env (repeated K=V), cwd,
// user, timeout_s.
func ptySpec(q map[string][]string) (guest.ExecSpec, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	spec := guest.ExecSpec{Argv: q["cmd"], Cwd: get("cwd"), User: get("user"), Stdin: true, TTY: &guest.TermSize{Rows: 24, Cols: 80}}
	if len(spec.Argv) == 0 {
		spec.Argv = []string{"/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l"}
	}
	for _, k := range []string{"rows", "cols", "timeout_s"} {
		v := get(k)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return spec, invalidf("%s must be a number", k)
		}
		switch k {
		case "rows":
			spec.TTY.Rows = uint32(n)
		case "cols":
			spec.TTY.Cols = uint32(n)
		default:
			if n > 24*3600 {
				return spec, invalidf("timeout_s must be between 0 and 86400")
			}
			spec.Timeout = time.Duration(n) * time.Second
		}
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return spec, invalidf("env %q is not KEY=VALUE", kv)
		}
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		spec.Env[k] = v
	}
	if err := spec.Validate(); err != nil {
		return spec, err
	}
	return spec, nil
}
