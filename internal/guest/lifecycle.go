package guest

import "time"

// PauseResult says what a pause saved.
type PauseResult struct {
	StateBytes int64
	// Save is how long the guest was stopped for the save.
	Save time.Duration
}

// Stats is what a sandbox's shim knows of it without asking the guest.
type Stats struct {
	// Runtime runs the guest ("qemu", "gvisor", ...); Accel is its
	// accelerator ("kvm", "tcg"; "" if none applies).
	Runtime string
	Accel   string
	// RunningSince is when the shim's guest started running (booted,
	// cloned or resumed).
	RunningSince time.Time
	// RunningExecs counts the execs the shim owns that still run.
	RunningExecs int
	// RequestsInFlight counts the other requests on the shim socket.
	RequestsInFlight int
	// InboundConnections counts open connections to published ports and
	// previews.
	InboundConnections int
	// LastActivity is when the last activity ended (the idle timer's
	// origin).
	LastActivity time.Time
}

// Usage is a sandbox's resource use: the guest's own account of CPU,
// memory and disk as its agent reports it (informational), and the host's
// account of its network.
type Usage struct {
	// CPUBusy and CPUTotal are the CPU time of all the guest's CPUs since
	// boot, busy and in all.
	CPUBusy, CPUTotal time.Duration
	CPUs              int
	// Memory in bytes: total, available (MemAvailable), page cache.
	MemTotal, MemAvailable, MemCached uint64
	// The root filesystem, in bytes.
	DiskTotal, DiskUsed uint64
	// Network is counted by the sandbox's shim on the guest's link; nil
	// when the sandbox has no network (mode none, or a runtime that gives
	// the guest no NIC).
	Network *NetworkUsage
}

// NetworkUsage is a sandbox's network as its shim counts it on the guest's
// link, since the shim started serving it (a resumed sandbox starts again
// from zero). Receive and transmit are the guest's point of view: receive
// is what reached the guest, transmit what it sent.
type NetworkUsage struct {
	// Bytes of the Ethernet frames the guest received and transmitted
	// (headers included), and the number of those frames.
	ReceiveBytes, TransmitBytes   uint64
	ReceiveFrames, TransmitFrames uint64
	// Connections counts TCP connections and UDP flows open now, dialling
	// or established.
	Connections int
	// Guest flows the host dialled for, refused (policy, upstream failure),
	// and dropped at its connection or dial caps.
	DialsAllowed, DialsDenied, DialsBusy uint64
	// EgressBytes is the payload the host sent upstream for the guest
	// (TCP and UDP, no headers; DNS the shim answers is not counted).
	EgressBytes uint64
	// Flows the outbound abuse limits refused, and UDP datagrams they
	// dropped.
	FlowsLimited, DatagramsLimited uint64
}
