// Package sandbox is the control plane: its Manager creates sandboxes by
// starting a shim per sandbox, finds and reconciles them through the
// catalog, decides what each caller may see and use (tenants, quotas) and
// writes the audit trail, and talks to shims through internal/shimclient.
// The state dir's files are internal/statedir's; the booted templates
// clones start from are internal/template's. Neither, nor the shim,
// imports this package.
//
// No daemon: every CLI command is a short-lived manager over the state dir.
// A shim holds an exclusive flock on its sandbox's shim.lock for its whole
// life, so "is the shim alive" is answered without PIDs (no reuse races):
// if the lock can be taken, the shim is gone.
package sandbox
