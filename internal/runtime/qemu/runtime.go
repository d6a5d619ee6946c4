package qemu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Runtime runs guests in QEMU microvm machines. Safe for concurrent use.
type Runtime struct {
	cfg  Config
	qemu string // resolved QEMUPath
	log  *slog.Logger

	// bootProbe boots the KVM probe guest; a field so tests can fake it.
	bootProbe func(ctx context.Context) error
	// kvmDevice is /dev/kvm (tests point it elsewhere).
	kvmDevice string

	// probeMu serialises probing; the fields below are set once it succeeds.
	probeMu sync.Mutex
	caps    *runtime.Capabilities
	kvmGID  int // supplementary group for /dev/kvm, or -1
	tscKHz  int64

	mems memCache // sealed memfd copies of snapshot RAM, shared by clones
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a Runtime for cfg (after defaults). It resolves QEMUPath and
// creates StateDir, and does nothing slow: the KVM probe and the TSC
// measurement happen on the first Probe or Create.
func New(cfg Config) (*Runtime, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	path, err := exec.LookPath(cfg.QEMUPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not installed (run `make deps`, or apt-get install qemu-system-x86 qemu-utils)", errdefs.ErrFailedPrecondition, cfg.QEMUPath)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu state dir: %w", err)
	}
	r := &Runtime{
		cfg:       cfg,
		qemu:      path,
		log:       cfg.Logger.With("runtime", "qemu"),
		kvmDevice: "/dev/kvm",
		kvmGID:    -1,
	}
	r.bootProbe = r.bootProbeGuest
	return r, nil
}

// Name returns "qemu".
func (r *Runtime) Name() string { return "qemu" }

// Close releases the runtime's caches (the memfd copies of snapshot RAM).
// Running instances keep their own references and are not affected.
func (r *Runtime) Close() error {
	r.mems.closeAll()
	return nil
}

// Probe reports the accelerator and QEMU version. The first call may boot a
// probe guest under KVM (Config.ProbeTimeout at most); the verdict is cached
// in memory and, keyed by host boot, QEMU version and probe kernel, in
// StateDir. Safe for concurrent use; concurrent first calls wait for one
// probe.
func (r *Runtime) Probe(ctx context.Context) (runtime.Capabilities, error) {
	r.probeMu.Lock()
	defer r.probeMu.Unlock()
	if r.caps != nil {
		return *r.caps, nil
	}
	version, err := r.version(ctx)
	if err != nil {
		return runtime.Capabilities{}, err
	}
	caps := runtime.Capabilities{VMMVersion: version, Snapshots: true}
	switch r.cfg.Accel {
	case "kvm":
		gid, err := kvmGroup(r.kvmDevice)
		if err != nil {
			return runtime.Capabilities{}, fmt.Errorf("%w: accel kvm: %w", errdefs.ErrUnavailable, err)
		}
		r.kvmGID = gid
		caps.Accel, caps.AccelReason = "kvm", "KVM configured"
	case "tcg":
		caps.Accel, caps.AccelReason = "tcg", "TCG configured"
	default:
		caps.Accel, caps.AccelReason = r.probeKVM(ctx, version)
	}
	if caps.Accel == "tcg" {
		khz := r.cfg.TSCkHz
		src := "configured"
		if khz == 0 {
			if khz, src, err = hostTSCkHz(r.cfg.StateDir); err != nil {
				return runtime.Capabilities{}, fmt.Errorf("host TSC frequency: %w", err)
			}
		}
		r.tscKHz = khz
		r.log.Info("host TSC", "khz", khz, "source", src)
	}
	r.log.Info("qemu probe", "accel", caps.Accel, "reason", caps.AccelReason, "version", version)
	r.caps = &caps
	return caps, nil
}

// version returns QEMU's version, e.g. "7.2.22 (Debian 1:7.2+dfsg-7)",
// from a cache in StateDir keyed by the binary's identity (every shim calls
// this, and running the binary costs ~10 ms), else by running it.
func (r *Runtime) version(ctx context.Context) (string, error) {
	cache := ""
	if r.cfg.StateDir != "" {
		cache = filepath.Join(r.cfg.StateDir, "qemu-version")
	}
	return runtime.CachedVersion(ctx, cache, r.qemu, r.runVersion)
}

func (r *Runtime) runVersion(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.qemu, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%w: qemu --version: %w", errdefs.ErrUnavailable, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	v := strings.TrimPrefix(strings.TrimSpace(line), "QEMU emulator version ")
	if v == "" {
		return "", errors.New("qemu --version: empty output")
	}
	return v, nil
}

// Create prepares an instance for spec. It probes first if Probe has not
// run (the accelerator decides the command line). Nothing is started and
// nothing needs releasing until Start.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	caps, err := r.Probe(ctx)
	if err != nil {
		return nil, err
	}
	var meta snapshotMeta
	if spec.RestoreFrom != "" {
		if meta, err = checkSnapshotMeta(spec, caps.Accel); err != nil {
			return nil, err
		}
	}
	in := r.newInstance(spec, caps.Accel, false)
	in.restoreKind = meta.Kind
	if spec.RestoreFrom != "" {
		in.machine = meta.Machine // a guest keeps the machine it booted on
	}
	return in, nil
}

// validateSpec adds the qemu runtime's rules to Spec.Validate.
func validateSpec(spec runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
	}
	for _, a := range spec.KernelArgs {
		if a == "" || strings.ContainsFunc(a, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return fmt.Errorf("%w: spec: kernel argument %q has spaces or control characters", errdefs.ErrInvalid, a)
		}
	}
	return nil
}
