// Package shimclient is the control plane's typed client for one sandbox's
// shim (proto/airlock/shim/v2 on sandboxes/<id>/shim.sock). Its methods
// take and return internal/guest values; no wire type leaves the package.
//
// Connections are pooled: a Pool keeps one HTTP/2 connection per shim
// socket, shared by every call and stream to that shim (HTTP/2 multiplexes
// them), and redials after the shim went away. Drop closes a sandbox's
// connection (after it was removed or paused).
package shimclient
