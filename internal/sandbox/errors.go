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

// msgStream is the receiving side of a server stream from a shim.
type msgStream[T any] interface {
	Receive() bool
	Msg() *T
	Err() error
}

// pump calls fn for each message of st, skipping those skip reports, until
// last reports the final one (then it returns nil). Errors from fn are
// returned as they are; a broken stream is categorised as step, and a
// stream that ends early is ErrUnavailable saying it ended without final.
func pump[T any](ctx context.Context, step, final string, st msgStream[T], fn func(*T) error, skip, last func(*T) bool) error {
	for st.Receive() {
		msg := st.Msg()
		if skip != nil && skip(msg) {
			continue
		}
		if err := fn(msg); err != nil {
			return err
		}
		if last(msg) {
			return nil
		}
	}
	if err := st.Err(); err != nil {
		return shimErr(ctx, step, err)
	}
	return fmt.Errorf("%w: %s: the stream ended without %s", errdefs.ErrUnavailable, step, final)
}
