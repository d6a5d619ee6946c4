// Package image manages airlock's read-only root filesystem images.
//
// An image is an ext4 file, content-addressed by the sha256 of its bytes and
// stored once at stateDir/images/blobs/sha256-<hex>.ext4 (mode 0444). A blob
// is never written after it is renamed into place: sandboxes boot from a
// per-sandbox qcow2 overlay backed by it. Names ("base", "python-3.12")
// map to digests through an Index, which the daemon backs with its SQLite
// catalog; MemIndex is an in-memory Index for tests.
//
// Images come from three places:
//   - BuildBase: Debian bookworm built locally with mmdebstrap;
//   - Import: a `docker save` or OCI-layout tarball;
//   - Pull: any OCI registry, through go-containerregistry.
//
// Imported and pulled images are untrusted input. Every layer's content is
// checked against the config's diff ids; for OCI layouts and pulls the
// manifest, config and compressed blobs are also checked against their
// digests. Layers are flattened with whiteouts applied, and the result is
// unpacked into a staging directory
// where no entry can land outside the root: parent paths resolve inside the
// root (openat2 RESOLVE_IN_ROOT), symlinks are created but never followed,
// hard links must point inside the root, device nodes and FIFOs are
// skipped, and the total size and entry count are capped (Limits).
//
// Building an image needs root (to keep file ownership), mkfs.ext4 and,
// for BuildBase, mmdebstrap.
package image
