// Package monitor receives gVisor's Runtime Monitoring stream for one
// sandbox: the Sentry (gVisor's kernel, a host process outside the
// sandbox) reports every execve and process exit of the guest to a
// "remote" sink, a SOCK_SEQPACKET unix socket that this package serves.
// It turns those trace points into runtime.ProcEvent values; no gVisor
// type crosses its API. It is the only package besides internal/netstack
// that imports gvisor.dev/gvisor, for the trace points' protobuf types
// (pkg/sentry/seccheck/points) and the sink's wire header
// (pkg/sentry/seccheck/sinks/remote/wire): the protocol is gVisor's, and
// its own types keep this end in step with the pinned runsc.
//
// The session (InitConfig, runsc --pod-init-config) enables three
// points:
//
//   - container/start, sent once when the sandbox's init is created,
//     before it runs: the proof that the session is live (runsc only logs
//     a warning when it cannot set one up);
//   - sentry/execve, with the context fields time, group_id,
//     parent_thread_group_id, credentials and cwd, after the new image is
//     loaded (failed execs are not reported);
//   - sentry/exit_notify_parent (time, group_id), once per process.
//
// The connection is made by `runsc run` (the host-side runsc process,
// before the sandbox starts), which hands it to the Sentry: Accept takes
// one connection, only from the process the caller names (SO_PEERCRED),
// answers gVisor's handshake, and the listener is closed and its file
// removed at once. The socket sits in a directory of the caller's that
// only root can enter; nothing in the sandbox can reach host paths.
//
// Bounds: a message is read into a MaxMessage buffer (a longer one is
// counted lost); exits are reported only for processes whose exec was,
// at most maxTracked at once; the environment of an exec is never kept.
// The Sentry drops points it cannot write at once (it does not block the
// guest beyond its retries) and counts them in the next message's
// header: Next reports that count as lost.
package monitor
