// Package fake is an in-memory runtime.Runtime for tests of the manager,
// API and CLI: no VMM, no kernel, no root.
//
// Each started instance serves the real agent protocol (agentapi.Serve on
// one end of a net.Pipe) with a fake agent: Info, Sync and Shutdown; Exec
// with a tiny command set (true, false, echo, exit N, cat, sleep, and
// sh -c 'exit N'); Files over an in-memory filesystem; and ContextService over a tiny
// integer language (documented on codeContexts in contexts.go). Instances
// implement runtime.Snapshotter and runtime.StateSaver: a snapshot is a
// copy of the filesystem (there is no RAM), kept by the Runtime under the
// snapshot directory's path; Instance.Saves lists SaveState calls. Hooks let tests
// make Start fail or a running "VMM" crash with a reason.
//
// Spec.Network is accepted but has no NIC behind it: instances do not
// implement runtime.Networker, so callers that find it by type assertion
// simply have no link to serve, and the fake agent ignores
// SyncRequest.network.
package fake
