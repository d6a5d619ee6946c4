// Package cgroup places the guest's user processes in cgroup v2 groups.
//
// Layout under the cgroup2 mount (normally /sys/fs/cgroup):
//
//	/                    the agent itself (never moved)
//	/airlock             all user work: memory.max = free RAM at boot minus a reserve,
//	                     pids.max = what the kernel can hold minus a reserve
//	/airlock/exec-<n>    one per exec, pids.max = the exec's limit
//
// The memory reserve makes the OOM killer pick user processes, never the
// agent; the pids reserve keeps the agent able to create threads while a fork
// bomb runs. The agent stays in the root cgroup, so for the CPU scheduler the
// whole airlock subtree weighs about as much as one of the agent's threads.
//
// Processes are started directly inside their exec cgroup (clone3 with
// CLONE_INTO_CGROUP via syscall.SysProcAttr.CgroupFD), so there is no window
// in which they run outside it.
package cgroup
