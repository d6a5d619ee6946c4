// Package errdefs holds airlock's error categories. Errors are wrapped with
// the step that failed and matched by category with errors.Is, never by
// string. One table (Category / ExitCode) maps categories to user-facing
// codes; the HTTP, E2B and MCP surfaces add their own columns later.
package errdefs

import (
	"context"
	"errors"
)

// Categories. Wrap them: fmt.Errorf("%w: sandbox %q", errdefs.ErrNotFound, id).
var (
	ErrNotFound           = errors.New("not found")
	ErrInvalid            = errors.New("invalid argument")
	ErrConflict           = errors.New("conflict")
	ErrUnavailable        = errors.New("unavailable")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrUnsupported        = errors.New("unsupported")
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrPermissionDenied: the caller may not do this (e.g. a host
	// mount outside the directories the server allows).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrInsufficientStorage: the host's disk cannot take it (the state
	// dir would fall below its free-space reserve).
	ErrInsufficientStorage = errors.New("insufficient storage")
)

// Category returns the short name of err's category, or "internal".
func Category(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	case errors.Is(err, ErrResourceExhausted):
		return "resource_exhausted"
	case errors.Is(err, ErrUnsupported):
		return "unsupported"
	case errors.Is(err, ErrFailedPrecondition):
		return "failed_precondition"
	case errors.Is(err, ErrPermissionDenied):
		return "permission_denied"
	case errors.Is(err, ErrInsufficientStorage):
		return "insufficient_storage"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	default:
		return "internal"
	}
}
