// Package vport opens the agent's virtio-serial port and turns it into a
// sequence of net.Conn sessions, one per host connection.
//
// virtio_console semantics this package is built around:
//   - read() returns 0 while no host is connected to the port's chardev;
//   - write() blocks until a host connects;
//   - the port stays open across host connections.
//
// The fd is opened in blocking mode and never handed to the Go netpoller (the
// port reports POLLHUP whenever no host is connected, which would make a
// poller spin on writes). A session (Port.Conn) ends when the host
// disconnects (Read returns io.EOF) or when it is closed; the next session
// reuses the fd.
//
// Reads wait in poll(2) on the port and on an eventfd, so closing a session
// (for example when the HTTP/2 server gives up on a host that stopped
// answering pings) makes its pending Read return. A write blocked because no
// host is connected cannot be interrupted, so writes are serialized per Port
// and issued in chunks of at most 32 KiB (virtio_console's own per-call
// limit) with the session checked between chunks: at most one stale chunk
// can precede the next banner (the host skips up to agentapi.MaxPreBanner
// bytes before it). Bytes that a closed session's read still got are handed
// to the next session.
//
// Known limit: when a host disconnects and the next one connects within the
// same QEMU main-loop iteration (a connect queued while the old host was still
// there, or one issued microseconds after the close), the kernel reports the
// port closed and reopened in one batch, so the old session's read never sees
// EOF and the new host gets no banner. Only an HTTP/2 keepalive on the old
// session (http2.Server ReadIdleTimeout and PingTimeout, set by
// agentapi.Serve) can notice; hosts should leave a gap between connections
// and retry when no banner comes.
package vport
