// Package agent is airlock-agent, the guest's PID 1: it boots the guest
// (package boot), then serves the agentapi services (AgentService,
// ExecService, FileService) on the virtio-serial control channel (package
// vport), forever.
//
// Processes run in their own session and exec cgroup (package cgroup), and
// every child of the agent is reaped by one reaper (package reaper); the
// agent never calls wait itself.
//
// An exec's process lives apart from its stream (execState): the host can
// park it (a park request ends the stream, the process keeps running with
// its output held in its pipes) and a later stream adopts it by token, so
// a command survives the host disconnecting for a pause, snapshot or fork
// (park_linux.go; the contract is ExecService.Exec in the proto). Parked
// execs are capped and expire if nobody adopts them.
//
// A Server also runs outside a guest ("host mode"), which is how the unit
// tests drive it over net.Pipe: the reaper waits only for its own pids, no
// cgroups are used (timeouts kill the process group), and Sync and Shutdown
// leave the host's clock, RNG, hostname, network and power alone.
//
// Sync's network config (network.go) drives the virtio NIC over rtnetlink
// (netlink_linux.go) and edits resolv.conf, hosts and the CA bundle under
// an injectable root, idempotently: Sync runs after every boot and restore. The file service
// works on absolute paths of whatever root the agent runs in.
//
// Errors sent to the host are connect errors whose code follows the errno
// and whose short text never carries a path or argv.
package agent
