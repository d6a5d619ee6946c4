package airlock

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Sentinel categories, matched with errors.Is against an *APIError.
var (
	ErrNotFound        = errors.New("airlock: not found")          // 404, not_found
	ErrUnauthenticated = errors.New("airlock: unauthenticated")    // 401, unauthenticated
	ErrQuota           = errors.New("airlock: resource exhausted") // 429, resource_exhausted (quota or rate)
	ErrInvalid         = errors.New("airlock: invalid request")    // 400, invalid
	ErrConflict        = errors.New("airlock: conflict")           // 409, conflict
	// ErrPermissionDenied: the key may not do this (403, permission_denied;
	// for example publishing host ports without an admin key).
	ErrPermissionDenied = errors.New("airlock: permission denied")
	// ErrFailedPrecondition: the sandbox is not in a state for this (412,
	// failed_precondition; for example Pause while code runs, without
	// force).
	ErrFailedPrecondition = errors.New("airlock: failed precondition")
	// ErrExecNotStarted: the sandbox is fine but the guest could not start
	// the command (no such executable, working directory or user; a file
	// that is not executable): 422, exec_not_started. It is not
	// ErrNotFound, so code that re-creates a sandbox on ErrNotFound keeps
	// it.
	ErrExecNotStarted = errors.New("airlock: exec not started")
	// ErrInsufficientStorage: the server's disk cannot take it now (a
	// create, fork, pause or snapshot would eat into the free space it
	// keeps): 507, insufficient_storage. Retry later or ask for less.
	ErrInsufficientStorage = errors.New("airlock: insufficient storage")
)

// APIError is an error answered by the server: a non-2xx status with the
// contract's error body, or whatever a proxy in between sent instead.
type APIError struct {
	Status    int    // HTTP status
	Code      string // contract code ("not_found", "invalid", ...); derived from Status if the body had none
	Message   string // the server's public message
	RequestID string // from the body, else the X-Request-Id header
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "airlock: %s (%d)", e.Code, e.Status)
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RequestID != "" {
		b.WriteString(" [request_id " + e.RequestID + "]")
	}
	return b.String()
}

// Is reports whether e belongs to the category target (one of the Err
// sentinels of this package).
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Code == "not_found"
	case ErrUnauthenticated:
		return e.Code == "unauthenticated"
	case ErrQuota:
		return e.Code == "resource_exhausted"
	case ErrInvalid:
		return e.Code == "invalid"
	case ErrConflict:
		return e.Code == "conflict"
	case ErrPermissionDenied:
		return e.Code == "permission_denied"
	case ErrFailedPrecondition:
		return e.Code == "failed_precondition"
	case ErrExecNotStarted:
		return e.Code == "exec_not_started"
	case ErrInsufficientStorage:
		return e.Code == "insufficient_storage"
	}
	return false
}

// codeForStatus is the contract's status table read backwards, for error
// bodies that carry no code.
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid"
	case http.StatusUnauthorized:
		return "unauthenticated"
	case http.StatusForbidden:
		return "permission_denied"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusConflict:
		return "conflict"
	case http.StatusPreconditionFailed:
		return "failed_precondition"
	case http.StatusRequestEntityTooLarge:
		return "too_large"
	case http.StatusUnprocessableEntity:
		return "exec_not_started"
	case http.StatusTooManyRequests:
		return "resource_exhausted"
	case http.StatusServiceUnavailable:
		return "unavailable"
	case http.StatusInsufficientStorage:
		return "insufficient_storage"
	}
	return "internal"
}

// decodeError turns a non-success response into an *APIError. It reads at
// most 64 KiB of the body.
func decodeError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
	var wire struct {
		Error *struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			RequestID string `json:"request_id"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &wire) == nil && wire.Error != nil {
		e.Code, e.Message = wire.Error.Code, wire.Error.Message
		if wire.Error.RequestID != "" {
			e.RequestID = wire.Error.RequestID
		}
	} else {
		// Not the contract's body (a proxy, a crash): keep a short excerpt.
		msg := strings.TrimSpace(string(body))
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		e.Message = msg
	}
	if e.Code == "" {
		e.Code = codeForStatus(resp.StatusCode)
	}
	return e
}

// ErrExecPaused is the cause (StreamError.Err) when an exec's stream ended
// because its sandbox was paused: the exec is parked in the guest and goes
// on, under the same id, when the sandbox resumes. Attach resumes the
// sandbox and picks the exec up again.
var ErrExecPaused = errors.New("the sandbox was paused; the exec goes on when it resumes")

// ErrStreamBroken is matched (errors.Is) by a *StreamError.
var ErrStreamBroken = errors.New("airlock: exec stream ended before its exit record")

// StreamError reports an exec output stream that ended before its "exit"
// record. The exec keeps running in the sandbox (unless it was started with
// KillOnDisconnect); pass ExecID to Attach to pick it up again.
type StreamError struct {
	ExecID string // empty if the stream broke before its "start" record
	Err    error  // the underlying cause (io.ErrUnexpectedEOF for a clean early end)
}

func (e *StreamError) Error() string {
	s := "airlock: exec stream ended before its exit record"
	if e.ExecID != "" {
		s += " (exec " + e.ExecID + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *StreamError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStreamBroken) true.
func (e *StreamError) Is(target error) bool { return target == ErrStreamBroken }
