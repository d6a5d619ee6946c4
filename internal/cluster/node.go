// Package cluster runs airlock across many hosts on Kubernetes: each
// `airlock node` registers itself (a Lease renewed every few seconds for
// liveness, and an AirlockNode object with its address and capacity), and
// the control tier watches both to know which nodes are live, to place new
// sandboxes on them (Place, best of K) and to notice a node that stopped
// renewing its Lease.
package cluster

import (
	"slices"
	"time"
)

// Node is one airlock node as the control tier sees it: what it published
// in its AirlockNode object, and whether its Lease is being renewed.
type Node struct {
	Name string
	// Address is the node API's base URL (for the control tier only).
	Address  string
	Runtimes []string // runtimes it runs sandboxes with: "qemu", "gvisor"
	Arch     string   // GOARCH
	Accel    string   // "kvm" or "tcg" for qemu
	// Kernel is the guest kernel release: saved states restore only on a
	// node with the same one.
	Kernel  string
	Version string // airlock's version

	CPUs               int
	MemoryMiB          int64
	AllocatedCPUs      int   // the vCPUs of its live sandboxes
	AllocatedMemoryMiB int64 // their guest memory
	Sandboxes          int   // live sandboxes
	// Warm are its warm pools' sandboxes ready for a create to take, by
	// what they are (placement prefers a node with one that fits).
	Warm []WarmReady
	// Draining nodes take no new sandboxes.
	Draining bool

	// Live: the control tier saw its Lease renewed within the Lease's
	// duration (by its own clock, so the nodes' clocks do not matter).
	Live bool
	// RenewedAt is when the control tier last saw the Lease renewed.
	RenewedAt     time.Time
	LeaseDuration time.Duration
}

// WarmReady is how many started, unclaimed sandboxes of one kind a node
// holds in its warm pools.
type WarmReady struct {
	Image     string `json:"image"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memoryMiB"`
	Ready     int    `json:"ready"`
}

// Static is a fixed list of nodes, for a control tier whose nodes are
// known without a Registry (the cluster simulation, make bench).
type Static []Node

// Nodes returns a copy of the list.
func (s Static) Nodes() []Node { return slices.Clone(s) }
