package shimclient

import (
	"errors"
	"math"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
)

func TestCodeEventMapping(t *testing.T) {
	if _, ok := codeEvent(&shimv2.CodeEvent{}); ok {
		t.Fatal("an empty event was mapped")
	}
	ev, ok := codeEvent(&shimv2.CodeEvent{Event: &shimv2.CodeEvent_Result{Result: &shimv2.CodeResult{Main: true}}})
	if !ok || ev.Kind != guest.EventResult || ev.Result.Data == nil || !ev.Result.Main {
		t.Fatalf("result: %+v", ev)
	}
	for ms, want := range map[int64]time.Duration{
		7:                 7 * time.Millisecond,
		-5:                0,
		math.MaxInt64:     time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond,
		math.MaxInt64 / 2: time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond,
	} {
		ev, ok := codeEvent(&shimv2.CodeEvent{Event: &shimv2.CodeEvent_End{End: &shimv2.CodeEnd{DurationMs: ms, ContextId: "c"}}})
		if !ok || ev.Kind != guest.EventEnd || ev.End.Duration != want || ev.End.ContextID != "c" {
			t.Fatalf("duration %d ms: %+v", ms, ev.End)
		}
	}
}

func TestFileErrCategories(t *testing.T) {
	for code, want := range map[connect.Code]error{
		connect.CodeNotFound:           errdefs.ErrNotFound,
		connect.CodeInvalidArgument:    errdefs.ErrInvalid,
		connect.CodeFailedPrecondition: errdefs.ErrFailedPrecondition,
		connect.CodeUnavailable:        errdefs.ErrUnavailable,
	} {
		err := fileErr("stat", "/x", connect.NewError(code, errors.New("guest says no")))
		if !errors.Is(err, want) {
			t.Errorf("%v: %v", code, err)
		}
	}
	// No better category than the guest's own failure: uncategorized.
	err := fileErr("read", "/x", connect.NewError(connect.CodeInternal, errors.New("boom")))
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrUnavailable} {
		if errors.Is(err, c) {
			t.Fatalf("internal error categorized as %v", c)
		}
	}
}
