package agent

import (
	"errors"
	"log/slog"
	"time"
)

// errNoRootDisk means the guest runs from its initramfs (probe mode).
var errNoRootDisk = errors.New("the guest has no root disk")

// system is what Sync and Shutdown do to the machine. The guest uses
// guestSystem; host mode (tests, or an agent that is not PID 1) uses
// hostSystem, which leaves the host's clock, RNG, hostname, network and power alone.
type system interface {
	// SetClock sets the wall clock.
	SetClock(t time.Time) error
	// AddEntropy mixes b into the kernel RNG, credited, and forces a reseed.
	AddEntropy(b []byte) error
	// SetHostname sets the hostname (already validated).
	SetHostname(name string) error
	// GrowRoot grows the root filesystem to fill its block device.
	GrowRoot(want uint64) error
	// ConfigureNetwork applies a validated network config to the NIC, and
	// for an enabled one writes resolv.conf, hosts and the egress CA.
	// Idempotent. errNoNIC if the guest has no NIC.
	ConfigureNetwork(c netConfig) error
	// MountVolumes mounts checked volumes (block devices the host
	// attached). Only the guest has them.
	MountVolumes(vols []volumeMount) error
	// RootSize is the size of the root filesystem in bytes.
	RootSize() (uint64, error)
	// PowerOff stops every process and powers the machine off. In the guest
	// it does not return.
	PowerOff()
}

// hostSystem is the system of an agent that is not the guest's PID 1.
type hostSystem struct {
	log *slog.Logger
}

func (hostSystem) SetClock(time.Time) error         { return nil }
func (hostSystem) AddEntropy([]byte) error          { return nil }
func (hostSystem) SetHostname(string) error         { return nil }
func (hostSystem) GrowRoot(want uint64) error       { return nil }
func (hostSystem) ConfigureNetwork(netConfig) error { return nil }
func (hostSystem) MountVolumes([]volumeMount) error {
	return errors.New("volumes are mounted by the runtime here")
}
func (hostSystem) RootSize() (uint64, error) { return statfsSize("/") }
func (h hostSystem) PowerOff()               { h.log.Info("power off requested (host mode: ignored)") }
