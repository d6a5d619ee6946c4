//go:build !linux

package agent

import (
	"errors"
	"log/slog"
)

// Main runs the agent as the guest's PID 1. The agent exists only for Linux.
func Main(*slog.Logger, *slog.LevelVar, string) error {
	return errors.New("airlock-agent runs only on Linux")
}
