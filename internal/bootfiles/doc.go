// Package bootfiles installs the guest kernel and builds the initramfs that
// boots airlock's guests.
//
// The guest kernel is Debian's cloud kernel (linux-image-cloud-amd64), or
// the generic one (linux-image-amd64) when 9p is needed. EnsureKernel
// downloads the package with apt, extracts the uncompressed PVH vmlinux from
// its bzImage (QEMU's microvm boots it directly, and its pages are shared
// between VMs through the page cache) and keeps the modules tree next to it,
// under stateDir/kernels/<release>/. FindKernel locates an installed kernel
// without touching the network.
//
// The kernel's virtio drivers are modules, so BuildInitramfs packs the agent
// (as /init) together with the modules it must load, in dependency order,
// into an uncompressed newc cpio cached by content hash under
// stateDir/initramfs/.
//
// Everything written here is world-readable (vmlinux and initramfs 0444,
// directories 0755): QEMU runs as an unprivileged uid and must read them.
package bootfiles
