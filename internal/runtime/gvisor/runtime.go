package gvisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// DefaultRunscPaths are searched, in order, when Config.RunscPath is empty
// and runsc is not on PATH. scripts/deps.sh installs to the first.
var DefaultRunscPaths = []string{"/usr/local/bin/runsc"}

// Config configures the gVisor runtime.
type Config struct {
	// RunscPath is the runsc binary. It must be statically linked (runsc
	// re-executes itself inside an empty chroot). Default: runsc on PATH,
	// else DefaultRunscPaths.
	RunscPath string
	// AgentPath is the static airlock-agent binary; it is bind-mounted
	// read-only into every sandbox at AgentPath and runs as its init.
	// Required.
	AgentPath string
	// AgentDir, if set, keeps content-addressed copies of the agent
	// binary (sha256-<hex>): sandboxes bind the copy of AgentPath, and a
	// restore binds the one its state was saved with, so a sandbox paused,
	// snapshotted or forked before airlock changed restores with the agent
	// it ran. Without it sandboxes bind AgentPath, and a restore of a state
	// saved with another agent is refused.
	AgentDir string
	// Platform is runsc's --platform (default "systrap").
	Platform string
	// DiskBytes caps each sandbox's writable layer unless its
	// Spec.WritableBytes does (runsc --overlay2
	// size=); 0 means no cap beyond the host's disk.
	DiskBytes int64
	// IgnoreCgroups runs sandboxes without host cgroups (--ignore-cgroups):
	// faster starts (~30 ms) but no CPU or memory limit. Use it on hosts
	// without writable cgroup controllers.
	IgnoreCgroups bool
	// CgroupParent is the cgroup under which each sandbox gets its own
	// (default "/airlock-gvisor").
	CgroupParent string
	// Debug keeps runsc's debug logs in Spec.RunDir/runsc-logs/.
	Debug bool
	// VersionCache, if set, is a file in which Probe keeps what it learnt
	// of runsc (its version; that it is static), for the same binary:
	// every shim probes, and `runsc --version` is a process start.
	VersionCache string
	// Logger receives the runtime's logs (nil: discard).
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Platform == "" {
		c.Platform = "systrap"
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "/airlock-gvisor"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RunscPath == "" {
		p, err := FindRunsc()
		if err != nil {
			return err
		}
		c.RunscPath = p
	}
	return nil
}

// Validate checks c after defaults.
func (c Config) Validate() error {
	switch {
	case c.AgentPath == "":
		return errors.New("gvisor: agent path is required")
	case !filepath.IsAbs(c.AgentPath) || !filepath.IsAbs(c.RunscPath):
		return errors.New("gvisor: runsc and agent paths must be absolute")
	case c.DiskBytes < 0:
		return errors.New("gvisor: disk bytes must not be negative")
	case !strings.HasPrefix(c.CgroupParent, "/"):
		return errors.New("gvisor: cgroup parent must start with /")
	}
	return nil
}

// FindRunsc returns the runsc binary on PATH or in DefaultRunscPaths.
func FindRunsc() (string, error) {
	if p, err := exec.LookPath("runsc"); err == nil {
		return filepath.Abs(p)
	}
	for _, p := range DefaultRunscPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("gvisor: runsc not found (run scripts/deps.sh, or make deps)")
}

// Runtime runs sandboxes with gVisor's runsc. Safe for concurrent use.
type Runtime struct {
	cfg Config
	log *slog.Logger

	// agent is the agent binary new sandboxes bind (AgentPath or its copy
	// in AgentDir) and agentSum its sha256, once ownAgent found them.
	agentMu         sync.Mutex
	agent, agentSum string

	// live counts instances started and not yet cleaned up.
	live atomic.Int64

	probeMu sync.Mutex
	probed  *runtime.Capabilities
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a Runtime for cfg. It runs nothing; see Probe.
func New(cfg Config) (*Runtime, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Runtime{cfg: cfg, log: cfg.Logger}, nil
}

// ownAgent returns the agent binary new sandboxes bind and its sha256,
// staging it into AgentDir on first use.
func (r *Runtime) ownAgent() (path, sum string, err error) {
	r.agentMu.Lock()
	defer r.agentMu.Unlock()
	if r.agentSum == "" {
		if r.agentSum, r.agent, err = stageAgent(r.cfg.AgentDir, r.cfg.AgentPath); err != nil {
			return "", "", err
		}
	}
	return r.agent, r.agentSum, nil
}

// Name returns "gvisor".
func (r *Runtime) Name() string { return "gvisor" }

// Probe runs `runsc --version` and checks that runsc is static and that the
// agent binary exists. The answer is cached once it succeeds, in the
// Runtime and in Config.VersionCache for the same runsc binary.
func (r *Runtime) Probe(ctx context.Context) (runtime.Capabilities, error) {
	r.probeMu.Lock()
	defer r.probeMu.Unlock()
	if r.probed != nil {
		return *r.probed, nil
	}
	version, err := runtime.CachedVersion(ctx, r.cfg.VersionCache, r.cfg.RunscPath, r.runscVersion)
	if err != nil {
		return runtime.Capabilities{}, err
	}
	if _, err := os.Stat(r.cfg.AgentPath); err != nil {
		return runtime.Capabilities{}, fmt.Errorf("probe agent: %w", err)
	}
	// A `go install` build says VERSION_MISSING; scripts/deps.sh records
	// the pinned version next to the binary.
	if b, err := os.ReadFile(r.cfg.RunscPath + ".version"); err == nil {
		version = "runsc " + strings.TrimSpace(string(b))
	}
	caps := runtime.Capabilities{
		Accel:       "none",
		AccelReason: "gVisor " + r.cfg.Platform + ": a user-space kernel, no hardware virtualization",
		VMMVersion:  version,
	}
	r.probed = &caps
	return caps, nil
}

// Create checks spec and returns an Instance that Start runs. spec.RootDisk
// is the image's root directory (shared, never written: every write goes
// to the instance's overlay in spec.RunDir); spec.Kernel and spec.Initrd
// are not used. With spec.RestoreFrom (a directory SaveState wrote) Start
// restores that sandbox, its writes to the root included, instead of
// running the agent afresh.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	switch {
	case !filepath.IsAbs(spec.RootDisk) || !filepath.IsAbs(spec.RunDir):
		return nil, errors.New("gvisor: root dir and run dir must be absolute")
	case spec.RestoreFrom != "" && !filepath.IsAbs(spec.RestoreFrom):
		return nil, errors.New("gvisor: the state to restore must be an absolute path")
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return newInstance(r, spec, "airlock-"+sanitizeID(spec.ID)+"-"+hex.EncodeToString(rnd[:])), nil
}

// InUse returns how many instances have been started and not yet fully
// cleaned up.
func (r *Runtime) InUse() int { return int(r.live.Load()) }

// sanitizeID keeps a container ID to runsc's alphabet and a short length.
func sanitizeID(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return string(b)
}

// runscVersion runs `runsc --version` and checks that runsc is static; it
// returns the first line of the answer.
func (r *Runtime) runscVersion(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, r.cfg.RunscPath, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("probe runsc: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := checkStatic(r.cfg.RunscPath); err != nil {
		return "", err
	}
	version, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return version, nil
}

// checkStatic fails if the ELF file at path has a program interpreter: a
// dynamic runsc cannot re-execute itself inside its empty chroot and fails
// with "fork/exec /proc/self/exe: no such file or directory".
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("probe runsc: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("probe runsc: the binary is dynamically linked; rebuild it with CGO_ENABLED=0 (scripts/deps.sh)")
		}
	}
	return nil
}

// Limits says which limits sandboxes get on this host, in one line for
// `airlock doctor`: CPU and memory from host cgroups (when the host lets
// runsc create them), pids from the cgroup2 tree inside the sandbox
// (enforced by gVisor's kernel), disk from the writable layer's size.
func (r *Runtime) Limits() string {
	const rest = "pids (in-sandbox cgroup2, one task per 3 MiB of memory), disk (overlay size)"
	if r.cfg.IgnoreCgroups {
		return "limits: " + rest + "; NOT enforced: CPU, memory (cgroups ignored)"
	}
	var missing []string
	for _, c := range []string{"cpu", "memory"} {
		if !hostController(c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return "limits: " + rest + "; NOT enforced: " + strings.Join(missing, ", ") + " (no writable host cgroup controller)"
	}
	return "limits: CPU and memory (host cgroups), " + rest
}

// hostController reports whether runsc can put a sandbox under the host
// cgroup controller c: a writable cgroup v1 hierarchy of it, or c in the
// cgroup v2 root's controllers.
func hostController(c string) bool {
	if unix.Access(filepath.Join("/sys/fs/cgroup", c), unix.W_OK) == nil {
		return true
	}
	b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	return err == nil && slices.Contains(strings.Fields(string(b)), c)
}
