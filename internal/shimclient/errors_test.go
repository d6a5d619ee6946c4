package shimclient

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestSessionErrCategories(t *testing.T) {
	ctx := context.Background()
	for code, want := range map[connect.Code]error{
		connect.CodeNotFound:           errdefs.ErrNotFound,
		connect.CodeInvalidArgument:    errdefs.ErrInvalid,
		connect.CodeFailedPrecondition: errdefs.ErrFailedPrecondition,
		connect.CodeResourceExhausted:  errdefs.ErrResourceExhausted,
		connect.CodeUnavailable:        errdefs.ErrUnavailable,
		connect.CodeInternal:           errdefs.ErrUnavailable,
	} {
		err := wireErr(ctx, "step", connect.NewError(code, errors.New("msg")))
		if !errors.Is(err, want) || err.Error() != want.Error()+": step: msg" {
			t.Errorf("%v: %v", code, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := wireErr(cctx, "step", connect.NewError(connect.CodeCanceled, errors.New("x"))); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}
