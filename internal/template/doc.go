// Package template builds and finds templates: booted, snapshotted guests
// that sandboxes are cloned from (one per image, kernel, size and runtime,
// keyed by Key), snapshot templates (a snapshot's state restored and saved
// again, so its clones share its RAM), and the holder process that keeps a
// template's RAM for every clone to map. Template builds and the shim boot
// guests the same way (DialAgent, GuestNetwork). Collect is the one
// collector of disk chains: it frees the fork bases and stale templates
// that no catalog reference holds.
//
// The shim builds and clones templates; the control plane prunes them. This
// package imports neither.
package template
