// Package boot does what an init system does before the agent can serve:
// it runs only as the guest's PID 1 (see Guest).
//
// The initramfs holds /init (the agent), /mods/*.ko with /mods/order, and
// empty /dev /proc /sys /tmp /newroot. Guest mounts proc, sysfs and devtmpfs,
// loads the modules in order, reads the airlock.* options from the kernel
// command line, waits for the root disk, mounts it and switches root to it,
// then sets up the rest of the runtime environment (devpts, shm, tmp, run,
// cgroup2, /dev symlinks, hostname, loopback, rlimits, oom_score_adj).
//
// Every step after the first mounts is best effort: a failure is logged and
// boot continues, because PID 1 must never exit (the kernel panics) and a
// guest that answers with a clear error beats one that is silent.
package boot
