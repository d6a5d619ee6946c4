package shim

import (
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/guest"
)

// Host-side limits applied by the relay whatever the guest does.
const (
	// DefaultMaxOutputBytes caps stdout+stderr forwarded for one exec.
	DefaultMaxOutputBytes = 64 << 20
	maxPathLen            = guest.MaxPathLen
)

// timeoutGrace is how long past an exec's timeout the host waits for the
// agent to report it before it gives up on the agent (sessions.grace and
// contextRelay.grace: tests shorten it).
const timeoutGrace = 5 * time.Second

// ValidateGuestPath checks a path the host is about to send to the guest.
func ValidateGuestPath(p string) error { return guest.CheckPath(p) }

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
