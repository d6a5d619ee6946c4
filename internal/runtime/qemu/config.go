package qemu

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Defaults for Config fields left zero.
const (
	DefaultQEMUPath = "qemu-system-x86_64"
	// DefaultUIDBase starts the instance uid range far above ordinary
	// users, /etc/subuid ranges (100000+) and nobody (65534).
	DefaultUIDBase = 1_900_000_000
	// DefaultUIDCount bounds how many instances can run at once on a host.
	DefaultUIDCount = 65536
	// DefaultConsoleLimit is how many bytes of the head of the serial
	// console are kept in RunDir/console.log (a tail ring of
	// consoleTailBytes is appended at exit).
	DefaultConsoleLimit = 1 << 20
	// DefaultProbeTimeout bounds how long the KVM probe guest may take to
	// announce its agent.
	DefaultProbeTimeout = 3 * time.Second
)

// Config configures a qemu Runtime. Zero fields take the defaults above.
type Config struct {
	// QEMUPath is the qemu-system-x86_64 binary (looked up in PATH if it
	// has no slash).
	QEMUPath string
	// StateDir holds the runtime's caches (probe verdict, TSC frequency)
	// and run/uids/ lock files. Required, absolute; created 0700.
	StateDir string
	// Accel is "auto" (default: KVM if a probe guest boots under it, else
	// TCG), "kvm" or "tcg".
	Accel string
	// ProbeKernel and ProbeInitrd boot the KVM probe guest (kernel arg
	// airlock.probe=1; the agent then serves from the initramfs without a
	// root disk). Without them "auto" cannot test KVM, so it chooses TCG
	// and says why.
	ProbeKernel string
	ProbeInitrd string
	// ProbeTimeout bounds the probe guest's boot (default 3 s).
	ProbeTimeout time.Duration
	// UIDBase and UIDCount give the range of host uids (and gids, same
	// numbers) that QEMU processes run as, one per live instance, so that
	// two sandboxes' VMMs cannot signal, ptrace or read each other. The
	// range must be used by nothing else on the host.
	UIDBase  uint32
	UIDCount uint32
	// TSCkHz is the host TSC frequency passed to TCG guests as
	// tsc_early_khz (0: read or measure it once and cache it in StateDir).
	TSCkHz int64
	// ConsoleLimit caps RunDir/console.log's head (default 1 MiB).
	ConsoleLimit int64
	// Logger receives the runtime's logs (nil: discard).
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.QEMUPath == "" {
		c.QEMUPath = DefaultQEMUPath
	}
	if c.Accel == "" {
		c.Accel = "auto"
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if c.UIDBase == 0 && c.UIDCount == 0 {
		c.UIDBase, c.UIDCount = DefaultUIDBase, DefaultUIDCount
	}
	if c.ConsoleLimit == 0 {
		c.ConsoleLimit = DefaultConsoleLimit
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate checks c after defaults are applied (New applies them).
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		errs = append(errs, errors.New("state dir must be an absolute path"))
	}
	switch c.Accel {
	case "auto", "kvm", "tcg":
	default:
		errs = append(errs, fmt.Errorf("accel %q: want auto, kvm or tcg", c.Accel))
	}
	if (c.ProbeKernel == "") != (c.ProbeInitrd == "") {
		errs = append(errs, errors.New("probe kernel and probe initrd go together"))
	}
	if c.ProbeTimeout < 0 {
		errs = append(errs, errors.New("probe timeout must be positive"))
	}
	end := uint64(c.UIDBase) + uint64(c.UIDCount)
	switch {
	case c.UIDCount == 0:
		errs = append(errs, errors.New("uid count must be at least 1"))
	case c.UIDBase < 1000:
		errs = append(errs, errors.New("uid base must be at least 1000 (system uids are not for VMMs)"))
	case end > 1<<32-1:
		errs = append(errs, errors.New("uid range goes past the largest uid"))
	case uint64(c.UIDBase) <= 65534 && end > 65534:
		errs = append(errs, errors.New("uid range must not contain nobody (65534)"))
	}
	if c.TSCkHz < 0 || c.TSCkHz > 100_000_000 {
		errs = append(errs, errors.New("TSC kHz out of range"))
	}
	if c.ConsoleLimit < 0 {
		errs = append(errs, errors.New("console limit must be positive"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: qemu config: %w", errdefs.ErrInvalid, err)
	}
	return nil
}
