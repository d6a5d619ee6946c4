package shimclient

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
)

// clientOptions are the options of every generated service client: reads
// capped, no compression.
func clientOptions() []connect.ClientOption {
	return []connect.ClientOption{connect.WithReadMaxBytes(MaxMessageBytes), connect.WithAcceptCompression("gzip", nil, nil)}
}

// category maps a Connect code from a shim to an errdefs category; codes
// with no better meaning are ErrUnavailable.
func category(code connect.Code) error {
	switch code {
	case connect.CodeNotFound:
		return errdefs.ErrNotFound
	case connect.CodeInvalidArgument, connect.CodePermissionDenied:
		return errdefs.ErrInvalid
	case connect.CodeAlreadyExists:
		return errdefs.ErrConflict
	case connect.CodeFailedPrecondition:
		return errdefs.ErrFailedPrecondition
	case connect.CodeResourceExhausted:
		return errdefs.ErrResourceExhausted
	case connect.CodeUnimplemented:
		return errdefs.ErrUnsupported
	default:
		return errdefs.ErrUnavailable
	}
}

// wireErr turns an error from a shim service into an errdefs category,
// prefixed with step. The remote text is kept as data (bounded by the
// shim), never parsed. A cancelled ctx wins: the caller went away.
func wireErr(ctx context.Context, step string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", step, ctx.Err())
	}
	msg := err.Error()
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		msg = ce.Message()
	}
	if connect.CodeOf(err) == connect.CodeFailedPrecondition && msg == guest.ErrExecExited.Error() {
		return fmt.Errorf("%w: %s: %w", errdefs.ErrConflict, step, guest.ErrExecExited)
	}
	return fmt.Errorf("%w: %s: %s", category(connect.CodeOf(err)), step, msg)
}
