// Package guest holds what the control plane sees of a sandbox's guest:
// exec specs, exec events and exit status, file information, code contexts
// and their events, and sandbox statistics. They are plain Go values owned
// by the control plane; the shim maps them to and from the guest protocol
// (internal/agentapi) and its own wire contract (proto/airlock/shim/v2).
// Nothing above the shim (the manager, the HTTP API, MCP, the CLI) sees a
// wire type.
package guest
