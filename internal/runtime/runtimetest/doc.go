// Package runtimetest is the conformance suite every runtime.Runtime must
// pass: the fake one in the unit tier, qemu (and later gvisor) in the vm
// tier. It checks the contracts documented on runtime.Instance: start and
// agent handshake, idempotent Stop and Kill, Wait from many goroutines,
// Stop before Start, resource release on a failed Start, and (when the
// runtime reports Capabilities.Snapshots) snapshot and restore.
package runtimetest
