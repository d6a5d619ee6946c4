// Package qemu runs airlock guests in QEMU `microvm` machines.
//
// Each instance is one qemu-system-x86_64 process, started from a goroutine
// that owns it (never under a request context), as a per-instance
// unprivileged uid allocated from Config.UIDBase..+UIDCount, in new mount,
// pid, net, ipc and uts namespaces, with no capabilities, QEMU's seccomp
// sandbox, and SIGKILL as its parent-death signal. QEMU never opens a host
// socket: the serial console, QMP, the agent channel (a listening socket,
// RunDir/agent.sock, that QEMU accepts on, so that the host can connect
// again after a live SaveState: QEMU 7.2's virtio-serial ports cannot
// swap chardev backends), the NIC's link (a "-netdev stream" socketpair,
// Spec.Network), the writable disks and snapshot files are all inherited
// or QMP-passed descriptors. Only world-readable inputs (kernel,
// initramfs, the qcow2 backing chain) are opened by path.
//
// The command line is built by a pure function (buildArgs) that is
// golden-tested in testdata/. Snapshots follow the "shared file RAM +
// x-ignore-shared" recipe: a Snapshottable instance keeps its RAM in a file,
// SaveSnapshot migrates the device state to state.bin, and restored
// instances map the RAM copy-on-write from a sealed memfd copy of mem.raw
// (QEMU 7.2 opens a memory-backend-file read-write even for share=off, so a
// root-owned 0444 mem.raw cannot be mapped directly by an unprivileged uid,
// and a writable one would let one clone's QEMU corrupt every later clone).
//
// Full-state snapshots (SaveState: pause, live snapshot, fork) stop the
// guest and migrate everything, RAM included, to state.bin (kind "full" in
// meta.json). Every RAM layout names its backend "mem" (anonymous
// memory-backend-ram for cold boots and full restores, a file for
// templates and their clones), so such a stream restores into any of them:
// anonymous RAM, or a share=on RAM file for a Snapshottable restore that
// then becomes a template. A live snapshot moves the root disk to a new
// qcow2 overlay (add-fd, blockdev-add, blockdev-snapshot) while the guest
// is stopped, so the old file is frozen with the state.
//
// See the package's testdata/*.golden for the exact argv, and
// shared/notes/qemu-microvm.md for the measurements behind each choice.
package qemu
