// Package gvisor is the gVisor (runsc) runtime: sandboxes on hosts without
// usable KVM, with the same guest agent and protocol as the qemu runtime.
//
// Each instance is one `runsc run` of an OCI bundle written into
// Spec.RunDir:
//
//   - init is the static airlock-agent, bind-mounted read-only from
//     Config.AgentPath at AgentPath and started in container mode
//     (internal/agent.ContainerArg);
//   - the root is Spec.RootDisk, which for this runtime is a directory:
//     the image's extracted tree (internal/image.Store.Dir), shared by
//     every sandbox of the image and never written. runsc's
//     --overlay2=root:dir=<RunDir>/upper puts each sandbox's writes in a
//     file it creates (and unlinks at once) in RunDir/upper; the default
//     root:self would write into the shared tree;
//   - the agent's channel: the sandbox's stdin is a control socket (a
//     unix socketpair, a host fd inside gVisor) on which the host sends
//     each session as a socketpair of its own (SCM_RIGHTS). AgentConn is
//     a session's host end; the agent writes agentapi.Banner and serves
//     HTTP/2 on it, as over virtio-serial, and says on the control
//     socket when it has closed it (state.go: a checkpoint cannot save a
//     socket received at run time);
//   - with Spec.Network, a network namespace (/run/netns/<container id>)
//     with lo up and a TAP named eth0 is named in the spec; runsc
//     (--network=sandbox) takes the TAP's address and route and serves
//     the sandbox's own stack on it. The host relays the TAP's frames as
//     QEMU's -netdev stream does (NetConn), so the shim's netstack works
//     unchanged;
//   - CPU and memory limits go in the spec's resources and runsc applies
//     them with host cgroups under Config.CgroupParent (unless
//     Config.IgnoreCgroups); Config.DiskBytes caps the writable layer.
//     There is no pids limit yet: this runsc has no cgroup v2 for the
//     agent's per-exec limits, and a host pids cgroup counts the sentry's
//     threads, not the sandbox's tasks.
//
// Spec.Kernel and Spec.Initrd are not used (Spec.Validate still wants them
// set). Instances save their whole state (runtime.StateSaver: `runsc
// checkpoint`, the overlay's upper layer included, as it lives in the
// sandbox's memory file) and Spec.RestoreFrom restores it (`runsc
// restore`): pause and resume. Templates are not (Capabilities.Snapshots
// is false: no Snapshotter).
//
// runsc must be static (CGO_ENABLED=0): it re-executes itself inside an
// empty chroot, where a dynamic binary's loader is missing. Linux only;
// needs root.
package gvisor
