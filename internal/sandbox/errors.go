package sandbox

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// category maps a Connect code from a shim or the guest agent to an errdefs
// category; codes with no better meaning are ErrUnavailable.
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

// shimErr turns an error from a shim service into an errdefs category. The
// remote text is kept as data (bounded by the shim), never parsed.
func shimErr(ctx context.Context, step string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", step, ctx.Err())
	}
	msg := err.Error()
	if ce, ok := errors.AsType[*connect.Error](err); ok {
		msg = ce.Message()
	}
	return fmt.Errorf("%w: %s: %s", category(connect.CodeOf(err)), step, msg)
}
