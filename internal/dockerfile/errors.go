package dockerfile

import (
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// LineError is an error about one line of the Dockerfile (Line 0: the file
// as a whole). It unwraps to its category, errdefs.ErrInvalid or
// errdefs.ErrResourceExhausted.
type LineError struct {
	Line int
	Msg  string
	Kind error
}

func (e *LineError) Error() string {
	if e.Line <= 0 {
		return "Dockerfile: " + e.Msg
	}
	return fmt.Sprintf("Dockerfile:%d: %s", e.Line, e.Msg)
}

// Unwrap returns the error's category.
func (e *LineError) Unwrap() error { return e.Kind }

// invalid returns an ErrInvalid *LineError for line.
func invalid(line int, format string, args ...any) error {
	return &LineError{Line: line, Msg: fmt.Sprintf(format, args...), Kind: errdefs.ErrInvalid}
}

// exhausted returns an ErrResourceExhausted *LineError for line.
func exhausted(line int, format string, args ...any) error {
	return &LineError{Line: line, Msg: fmt.Sprintf(format, args...), Kind: errdefs.ErrResourceExhausted}
}
