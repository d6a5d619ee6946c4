package e2b

import (
	"context"
	"errors"
	"io"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The E2B adapter never copies directories as archives.

func (f *fakeFiles) WriteArchive(context.Context, sandbox.Caller, string, string, io.Reader) (guest.ArchiveResult, error) {
	return guest.ArchiveResult{}, errors.New("not used by the E2B adapter")
}

func (f *fakeFiles) ReadArchive(context.Context, sandbox.Caller, string, string, io.Writer) (int64, error) {
	return 0, errors.New("not used by the E2B adapter")
}
