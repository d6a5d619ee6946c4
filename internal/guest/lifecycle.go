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

// Usage is a guest's resource use as its agent reports it: the guest's own
// account, informational.
type Usage struct {
	// CPUBusy and CPUTotal are the CPU time of all the guest's CPUs since
	// boot, busy and in all.
	CPUBusy, CPUTotal time.Duration
	CPUs              int
	// Memory in bytes: total, available (MemAvailable), page cache.
	MemTotal, MemAvailable, MemCached uint64
	// The root filesystem, in bytes.
	DiskTotal, DiskUsed uint64
}
