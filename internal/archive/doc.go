// Package archive turns a directory tree into a tar stream and a tar stream
// back into a tree, for `airlock cp -r` and the file API's archive routes.
// The same code runs in the guest agent (extracting what the host sends,
// archiving what it asks for) and on the host (the CLI extracting what a
// guest sends), so both treat every archive as hostile:
//
//   - names are relative: an absolute name, a ".." component, a NUL, a
//     name over MaxNameBytes, a component over 255 bytes or a name more
//     than MaxDepth directories deep is refused;
//   - every path is resolved through an os.Root on the destination, so
//     nothing is created, written or changed outside it: a symlink (from
//     the archive or already there) that points outside the destination,
//     or is absolute, cannot be written through, and the last component of
//     a name is never followed (files, symlinks and links are made under a
//     temporary name and renamed over it);
//   - symlinks are made verbatim and stay inert for later entries that
//     would leave the destination through them;
//   - a hard link must name a regular file that this archive made;
//   - device nodes, FIFOs and other special entries are refused;
//   - modes keep the permission bits (and the sticky bit of directories),
//     never setuid or setgid: owners are not kept (ExtractOptions.Chown
//     sets one owner for everything), so the bits would grant another
//     user's rights;
//   - Limits cap the entries and the bytes of file data.
//
// Write archives without following symlinks below the top, skips sockets,
// FIFOs and devices, and keeps hard links within the tree as tar links.
//
// Only the standard library is used: the guest agent links this package.
package archive
