// Command airlock-agent is the guest agent: PID 1 of every airlock guest.
// See package internal/agent. Build it static:
//
//	CGO_ENABLED=0 go build -ldflags='-s -w -X main.version=...' ./cmd/airlock-agent
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/airlock-sandbox/airlock/internal/agent"
)

// version is set at build time with -ldflags '-X main.version=...'.
var version = "dev"

func main() {
	level := new(slog.LevelVar)
	// The console is the guest's serial port: the host keeps it as the
	// sandbox's boot log.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "agent")
	if err := agent.Main(log, level, version); err != nil {
		fmt.Fprintln(os.Stderr, "airlock-agent:", err)
		os.Exit(1)
	}
}
