package shim

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/guest"
)

// Host-side limits applied by the relay whatever the guest does.
const (
	// DefaultMaxOutputBytes caps stdout+stderr forwarded for one exec.
	DefaultMaxOutputBytes = 64 << 20
	// maxPathLen is the longest guest path the host will send.
	maxPathLen = 4096
)

// timeoutGrace is how long past an exec's timeout the host waits for the
// agent to report it before it gives up on the agent (a var for tests).
var timeoutGrace = 5 * time.Second

// ValidateGuestPath checks a path the host is about to send to the guest.
func ValidateGuestPath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case len(p) > maxPathLen:
		return fmt.Errorf("path is longer than %d bytes", maxPathLen)
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path contains a NUL byte")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is not absolute", p)
	case path.Clean(p) != p:
		return fmt.Errorf("path %q is not clean (want %q)", p, path.Clean(p))
	}
	return nil
}

// maxGuestMessage bounds an error message the guest wrote.
const maxGuestMessage = 1024

func invalid(err error) error { return connect.NewError(connect.CodeInvalidArgument, err) }

func relayErr(step string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		// Guest errors are data: keep the code, bound and escape the
		// message (it reaches terminals, logs and HTTP bodies as ours).
		return connect.NewError(ce.Code(), errors.New(guest.Text(ce.Message(), maxGuestMessage)))
	}
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s: %w", step, err))
}
