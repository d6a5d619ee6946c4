package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// LogReader is an optional ability of a Sandboxes implementation, found by
// type assertion (the manager has it): a sandbox's logs (GET
// /v1/sandboxes/{id}/logs). It decides which logs the caller may read
// (sandbox.Manager.Logs: the supervisor's for admins only).
type LogReader interface {
	Logs(ctx context.Context, c sandbox.Caller, id string, tail int64) ([]sandbox.LogTail, error)
}

var _ LogReader = (*sandbox.Manager)(nil)

// defaultLogTail is what one log's answer holds unless tail_bytes asks.
const defaultLogTail = 64 << 10

// SandboxLog is the end of one of a sandbox's logs.
type SandboxLog struct {
	Source string `json:"source"`
	// Exists is false when the sandbox has no such log.
	Exists bool  `json:"exists"`
	Size   int64 `json:"size"`
	// Truncated tells that Text is the end of a longer log.
	Truncated bool `json:"truncated"`
	// Text is the log's bytes as text (invalid UTF-8 replaced): guest
	// output, to be shown as text, never markup.
	Text string `json:"text"`
}

var errNoLogs = &Error{http.StatusServiceUnavailable, "unavailable", "sandbox logs are not available on this server"}

func (s *Server) sandboxLogs(w http.ResponseWriter, r *http.Request) {
	sb, err := s.sandbox(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	lr, ok := s.cfg.Sandboxes.(LogReader)
	if !ok {
		s.fail(w, r, errNoLogs)
		return
	}
	tail := int64(defaultLogTail)
	if v := r.URL.Query().Get("tail_bytes"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > sandbox.MaxLogTail {
			s.fail(w, r, invalidf("tail_bytes must be between 1 and %d", sandbox.MaxLogTail))
			return
		}
		tail = n
	}
	logs, err := lr.Logs(r.Context(), callerOf(r), sb.ID, tail)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := struct {
		Logs []SandboxLog `json:"logs"`
	}{Logs: make([]SandboxLog, 0, len(logs))}
	for _, l := range logs {
		out.Logs = append(out.Logs, SandboxLog{Source: string(l.Source), Exists: l.Exists, Size: l.Size,
			Truncated: l.Size > int64(len(l.Text)), Text: strings.ToValidUTF8(string(l.Text), "\uFFFD")})
	}
	writeJSON(w, http.StatusOK, out)
}
