// Package statedir is the schema of airlock's state dir: where every file
// lives (Layout), the sandbox ids that name sandbox directories, the boot
// config `airlock setup` writes, the manifests and digests of paused
// sandboxes and snapshots, the qcow2 overlays disks are made of, and the
// free-space reserve kept on the state dir's filesystem.
//
// Both the control plane (internal/sandbox) and the per-sandbox shim
// (internal/shim) read and write the state dir through it; it imports
// neither.
package statedir
