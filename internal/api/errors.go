package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// Error is an error with a public face: its code and message go to the
// client as they are. Anything else is logged and answered with a generic
// message for its category.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func invalidf(format string, args ...any) error {
	return &Error{http.StatusBadRequest, "invalid", fmt.Sprintf(format, args...)}
}

var (
	errNoRoute = &Error{http.StatusNotFound, "not_found", "no such route"}
	// errNoSandbox is the one answer for a sandbox that is missing, of
	// another tenant, or named by a malformed id: the same bytes for all.
	errNoSandbox  = &Error{http.StatusNotFound, "not_found", "sandbox not found"}
	errNoExec     = &Error{http.StatusNotFound, "not_found", "exec not found"}
	errUnauth     = &Error{http.StatusUnauthorized, "unauthenticated", "missing or invalid API key"}
	errTooLarge   = &Error{http.StatusRequestEntityTooLarge, "too_large", "request body is larger than 1 MiB"}
	errNoExecs    = &Error{http.StatusServiceUnavailable, "unavailable", "exec sessions are not available on this server"}
	errNoContexts = &Error{http.StatusServiceUnavailable, "unavailable", "code contexts are not available on this server"}
	errNoContext  = &Error{http.StatusNotFound, "not_found", "context not found"}
	errOldAgent   = &Error{http.StatusPreconditionFailed, "failed_precondition", "the sandbox's guest agent is too old for code contexts"}
)

// categories maps errdefs categories to HTTP; messages are generic because
// the wrapped text may hold host details.
var categories = []struct {
	err     error
	status  int
	code    string
	message string
}{
	{errdefs.ErrNotFound, http.StatusNotFound, "not_found", "not found"},
	{errdefs.ErrInvalid, http.StatusBadRequest, "invalid", "invalid request"},
	{errdefs.ErrConflict, http.StatusConflict, "conflict", "conflict"},
	{errdefs.ErrFailedPrecondition, http.StatusPreconditionFailed, "failed_precondition", "the sandbox is not in a state that allows this"},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, "permission_denied", "not allowed"},
	{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, "resource_exhausted", "resource exhausted"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", "temporarily unavailable; retry later"},
	{errdefs.ErrUnsupported, http.StatusBadRequest, "invalid", "not supported"},
	{errdefs.ErrInsufficientStorage, http.StatusInsufficientStorage, "insufficient_storage", "the server is short of disk space"},
}

// publicError returns the client's view of err.
func publicError(err error) *Error {
	if f, ok := errors.AsType[*faced](err); ok {
		return f.pub
	}
	if e, ok := errors.AsType[*Error](err); ok {
		return e
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errTooLarge
	}
	if errors.Is(err, sandbox.ErrNoSandbox) {
		return errNoSandbox // the manager's answer for a sandbox the caller cannot use
	}
	if errors.Is(err, sandbox.ErrNoBrowser) {
		return &Error{http.StatusPreconditionFailed, "failed_precondition", strings.TrimPrefix(sandbox.ErrNoBrowser.Error(), errdefs.ErrFailedPrecondition.Error()+": ")}
	}
	if errors.Is(err, guest.ErrExecExited) {
		return &Error{http.StatusConflict, "conflict", guest.ErrExecExited.Error()}
	}
	if se, ok := errors.AsType[*statedir.SpaceError](err); ok {
		// The tenant learns what it asked for, not the host's free space.
		return &Error{http.StatusInsufficientStorage, "insufficient_storage",
			fmt.Sprintf("the server is short of disk space: %s needs up to %d MiB beyond what it keeps free; retry later or ask for less", se.What, se.Need>>20)}
	}
	if fe, ok := errors.AsType[*sandbox.FloorError](err); ok {
		return &Error{http.StatusForbidden, "permission_denied", fe.Error()}
	}
	if q, ok := errors.AsType[*sandbox.QuotaError](err); ok {
		return &Error{http.StatusTooManyRequests, "resource_exhausted", "quota " + q.Detail()}
	}
	// A template build's failure says what failed in the tenant's own
	// Dockerfile, build and output: its text is the message.
	be, built := errors.AsType[*sandbox.BuildError](err)
	for _, c := range categories {
		if errors.Is(err, c.err) {
			if built {
				return &Error{c.status, c.code, be.Error()}
			}
			msg := c.message
			// Validation messages of the manager name only the user's own
			// values; keep them (without CLI flag dashes).
			if c.err == errdefs.ErrInvalid { //nolint:errorlint // compares the table's own sentinel, not a returned error
				msg = strings.ReplaceAll(strings.TrimPrefix(err.Error(), errdefs.ErrInvalid.Error()+": "), "--", "")
			}
			return &Error{c.status, c.code, msg}
		}
	}
	return &Error{http.StatusInternalServerError, "internal", "internal error"}
}

// PublicError is err as the API shows it (status, code, message), for
// adapters that answer in another envelope (the E2B surface): the same
// categories and the same care not to leak more than the caller's own
// values.
func PublicError(err error) (status int, code, message string) {
	e := publicError(err)
	return e.Status, e.Code, e.Message
}

// fail answers r with err's public face and logs the detail.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := publicError(err)
	_, public := errors.AsType[*Error](err)
	if e.Status >= 500 && !public {
		s.log.Error("request failed", "request_id", requestID(r), "route", r.Pattern, "err", err)
		s.metrics.failures.WithLabelValues(routeOp(r.Pattern)).Inc()
	} else if !public {
		s.log.Debug("request refused", "request_id", requestID(r), "route", r.Pattern, "err", err)
	}
	type body struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id"`
	}
	if _, local := localCaller(r); local {
		// The host's own user (Local) gets the manager's full text and no
		// request id: there is no server log to look it up in.
		msg := e.Message
		if !public {
			msg = err.Error()
		}
		w.Header().Del("X-Request-Id")
		writeJSON(w, e.Status, map[string]body{"error": {e.Code, msg, ""}})
		return
	}
	writeJSON(w, e.Status, map[string]body{"error": {e.Code, e.Message, requestID(r)}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeJSON reads a JSON body of at most MaxJSONBody into v. An empty body
// leaves v as it is.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, MaxJSONBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return errTooLarge
		}
		return invalidf("request body: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return errTooLarge
		}
		return invalidf("request body: trailing data after the JSON object")
	}
	return nil
}

// jsonProblem describes a decode error without echoing the client's bytes.
func jsonProblem(err error) string {
	if e, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Sprintf("field %q has the wrong type", e.Field)
	}
	if _, ok := errors.AsType[*json.SyntaxError](err); ok {
		return "malformed JSON"
	}
	if strings.HasPrefix(err.Error(), "json: unknown field ") {
		return strings.TrimPrefix(err.Error(), "json: ")
	}
	return "malformed JSON"
}
