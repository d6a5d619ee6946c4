package sandbox

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/envknob"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/hostcg"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shimclient"
	"github.com/airlock-sandbox/airlock/internal/shimconf"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// Limits on create options.
const (
	MinMemoryMiB   = 128
	MaxMemoryMiB   = 64 << 10
	MaxCPUs        = 32
	MaxDiskMiB     = 1 << 20
	MaxTimeout     = 24 * time.Hour
	DefaultTimeout = 15 * time.Minute
)

// CreateOptions are the user's choices for a new sandbox.
type CreateOptions struct {
	Image     string
	CPUs      int
	MemoryMiB int
	DiskMiB   int // 0: template.DiskMiB (the image size plus 512 MiB, at least 2 GiB)
	Timeout   time.Duration
	Metadata  map[string]string
	Tenant    string            // owner: set by the manager to the caller's tenant
	Env       map[string]string // default environment of every exec
	// Volumes and HostMounts are mounted for the sandbox's life
	// (volumes.go).
	Volumes    []VolumeMount
	HostMounts []HostMount
	// Network is the egress policy, secrets, published ports and limits.
	Network netconf.Spec
	// IdlePause pauses the sandbox after this long without activity (0:
	// never; at most MaxIdlePause).
	IdlePause time.Duration
	// Secrets holds the values of Network.Secrets. They go to the shim
	// through a pipe and are never stored.
	Secrets netconf.Values

	// mounts are Volumes and HostMounts as checked by Create.
	mounts []store.Mount
	// limits are the caller's, for the network's abuse limits of a
	// sandbox made from a snapshot (materialize).
	limits Limits
	// imageDigest and imageSize, for a gvisor template's sandbox, are its
	// image blob (Image is then the template's name, not a catalog image).
	imageDigest string
	imageSize   int64
	// buildRoot is a gvisor template build step's root (shimconf.Doc).
	buildRoot string
	// execDefaults are a gvisor template's WORKDIR and USER.
	execDefaults store.ExecDefaults
}

// Manager creates and finds sandboxes in one state dir.
type Manager struct {
	L     statedir.Layout
	Store *store.Store
	Log   *slog.Logger
	// Exe is the airlock binary the shim is started from (default: this
	// process's executable).
	Exe string
	// Shim are the settings every shim this manager starts gets in its
	// configuration document (shimconf.Doc), beside the sandbox's own: the
	// command's flags and environment knobs, read by the command (cmd/),
	// never here.
	Shim shimconf.Options
	// Runtime picks the runtime of a new sandbox ("qemu" or "gvisor");
	// nil means qemu. A sandbox keeps its runtime for its lifetime.
	Runtime func(context.Context) (string, error)
	// RuntimeWhy says in one line why Runtime picks what it does (the
	// server page shows it to admins); nil: not known.
	RuntimeWhy func(context.Context) string
	// DiskReserve is the free space, in bytes, kept on the state dir's
	// filesystem: creates, forks, pauses and snapshots that could use it
	// are refused (disk.go). 0: DefaultDiskReserve; negative: none.
	DiskReserve int64
	// HostMountRoots are the host directories under which API callers
	// may mount host paths (`serve --allow-host-mount`); absolute and
	// clean. The local user may mount any directory.
	HostMountRoots []string
	// TemplateRegistries are the OCI registry hosts (NormalizeRegistry)
	// a template build may pull its FROM image from (serve
	// --template-registry); none by default: the server's own network
	// access is an admin's choice.
	TemplateRegistries []string
	// ContextProgress times the status events of a code run that waits
	// for its context's interpreter to start (zero: the defaults).
	ContextProgress ContextProgress
	// StartShim, if set, starts each shim instead of the exec of `airlock
	// shim` (Exe). It gets what that process would: the checked
	// configuration document, the readiness writer (its fd 3) and the shim
	// lock, taken by this manager (its fd 5). It returns once the shim is
	// started (not ready); from then on the shim owns ready and lock and
	// closes both when it ends, and the manager waits for its readiness
	// line as for a process. If it fails, the manager closes both. Tests set it, when they build the manager, to
	// run shims in-process on the fake runtime (shimtest.Env.Starter);
	// nothing sets it from the environment.
	StartShim func(doc shimconf.Doc, ready io.WriteCloser, lock *os.File) error
	// Bundles, on a cluster's node, is where Export writes the bundles of
	// paused sandboxes and Import reads them (move.go); nil: sandboxes
	// stay on this host.
	Bundles bundle.Store

	statfs   func(path string) (total, free int64, err error) // nil: statfs (tests replace it)
	meminfo  func() ([]byte, error)                           // nil: read /proc/meminfo (tests replace it)
	clock    func() time.Time                                 // nil: time.Now (the overview's; tests replace it)
	poolOnce sync.Once
	pool     *shimclient.Pool // see shims
	quota    Quotas           // creates in flight (see reserve)
	netMu    sync.Mutex       // serializes live network changes (SetNetwork)
	digests  sync.Map         // path -> the sha256 of a boot file (fileDigest)
	warmOnce sync.Once
	warm     *warmPools // see warmState
}

func (o *CreateOptions) validate(imageSize int64) error {
	if o.Image == "" {
		o.Image = "base"
	}
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	imgMiB := int((imageSize + (1<<20 - 1)) >> 20)
	if o.DiskMiB == 0 {
		o.DiskMiB = template.DiskMiB(imageSize)
	}
	switch {
	case o.CPUs < 1 || o.CPUs > MaxCPUs:
		return fmt.Errorf("%w: --cpus must be between 1 and %d", errdefs.ErrInvalid, MaxCPUs)
	case o.MemoryMiB < MinMemoryMiB || o.MemoryMiB > MaxMemoryMiB:
		return fmt.Errorf("%w: --memory must be between %d MiB and %d GiB", errdefs.ErrInvalid, MinMemoryMiB, MaxMemoryMiB>>10)
	case o.DiskMiB < imgMiB:
		return fmt.Errorf("%w: --disk %dM is smaller than image %q (%d MiB)", errdefs.ErrInvalid, o.DiskMiB, o.Image, imgMiB)
	case o.DiskMiB > MaxDiskMiB:
		return fmt.Errorf("%w: --disk must be at most 1 TiB", errdefs.ErrInvalid)
	case o.Timeout < time.Second || o.Timeout > MaxTimeout:
		return fmt.Errorf("%w: --timeout must be between 1s and %s", errdefs.ErrInvalid, MaxTimeout)
	}
	for k, v := range o.Metadata {
		if k == "" || len(k) > 64 || len(v) > 1024 {
			return fmt.Errorf("%w: metadata keys must be 1-64 bytes and values at most 1024", errdefs.ErrInvalid)
		}
	}
	if len(o.Env) > 256 {
		return fmt.Errorf("%w: at most 256 environment variables", errdefs.ErrInvalid)
	}
	for k, v := range o.Env {
		if k == "" || len(k) > 256 || len(v) > 32<<10 || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%w: environment names must be 1-256 bytes without '=' or NUL, values at most 32 KiB without NUL", errdefs.ErrInvalid)
		}
	}
	if o.IdlePause < 0 || o.IdlePause > MaxIdlePause {
		return fmt.Errorf("%w: --idle-pause must be between 0 (never) and %s", errdefs.ErrInvalid, MaxIdlePause)
	}
	n, err := o.Network.Normalize(o.Secrets)
	if err != nil {
		return err
	}
	o.Network = n
	if add := n.Env(); len(add) > 0 {
		env := maps.Clone(o.Env)
		if env == nil {
			env = map[string]string{}
		}
		for k, v := range add {
			if _, dup := env[k]; dup {
				return fmt.Errorf("%w: %s is both an environment variable and a secret", errdefs.ErrInvalid, k)
			}
			env[k] = v
		}
		// Clients that do not read the system trust store find the
		// interception CA through these.
		for k, v := range caEnv {
			if _, set := env[k]; !set {
				env[k] = v
			}
		}
		o.Env = env
	}
	return nil
}

// caEnv points common TLS clients at the guest's trust store, which holds
// the interception CA of a sandbox with secrets.
var caEnv = map[string]string{
	"NODE_EXTRA_CA_CERTS": "/usr/local/share/ca-certificates/airlock-egress.crt",
	"REQUESTS_CA_BUNDLE":  "/etc/ssl/certs/ca-certificates.crt",
	"SSL_CERT_FILE":       "/etc/ssl/certs/ca-certificates.crt",
}

// ErrPortsNeedAdmin refuses published ports to a caller that is not an
// admin.
var ErrPortsNeedAdmin = fmt.Errorf("%w: published ports open ports on the server's host and need an admin key; use the preview route /v1/sandboxes/{id}/ports/{port}/ instead", errdefs.ErrPermissionDenied)

// Create makes a sandbox owned by c's tenant within c's quota: it records
// it, starts its shim and waits until the guest answers, then audits
// sandbox.create. On failure nothing is left behind. A create over quota
// is a *QuotaError; an allow rule that opens the platform floor, from a
// caller that is not an admin, a *FloorError.
func (m *Manager) Create(ctx context.Context, c Caller, o CreateOptions) (store.Sandbox, error) {
	if !c.Admin {
		// Threat 62 on every surface (the API checked it before; MCP
		// and E2B did not): only an operator opens the platform floor.
		if err := CheckFloor(o.Network); err != nil {
			return store.Sandbox{}, err
		}
		// Likewise a port on the server's host (the API refused it
		// before; MCP takes ports now): tenants use the preview route.
		if len(o.Network.Ports) > 0 {
			return store.Sandbox{}, ErrPortsNeedAdmin
		}
	}
	o.Tenant = c.Tenant
	if o.Image != "" && o.imageDigest == "" {
		// A template of the caller's tenant goes before an image of that
		// name.
		if t, err := m.Store.GetTemplate(ctx, c.Tenant, o.Image); err == nil {
			return m.createFromTemplate(ctx, c, t, o)
		}
	}
	o.Network.Secrets = slices.Clone(o.Network.Secrets)
	secrets, err := m.resolveVault(ctx, c.Tenant, o.Network.Secrets, o.Secrets)
	if err != nil {
		return store.Sandbox{}, err
	}
	o.Secrets = secrets
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	img, imgErr := m.Store.GetImage(ctx, cmp.Or(o.Image, "base"))
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
		if imgErr == nil && image.IsBrowser(img.Source) {
			o.MemoryMiB = BrowserMemoryMiB
		}
	}
	// The disk size the create will get (0: the image's default), for the
	// quota and the host's reserve; m.create validates the rest.
	if o.DiskMiB == 0 && imgErr == nil {
		o.DiskMiB = template.DiskMiB(img.Size)
	}
	mounts, err := m.resolveMounts(ctx, c, o.Volumes, o.HostMounts)
	if err != nil {
		return store.Sandbox{}, err
	}
	release, err := m.reserve(ctx, c, c.Tenant, 1, o.CPUs, o.MemoryMiB, o.DiskMiB)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	if err := m.CheckSpace(ctx, fmt.Sprintf("this sandbox's disk (%d MiB)", o.DiskMiB), int64(o.DiskMiB)<<20); err != nil {
		return store.Sandbox{}, err
	}
	o.mounts = mounts
	o.Network = c.Limits.withNetLimits(o.Network)
	if sb, ok := m.claimWarm(ctx, c, o); ok {
		m.auditCreate(ctx, c, sb)
		return sb, nil
	}
	sb, err := m.create(ctx, o)
	if err != nil {
		return sb, err
	}
	m.auditCreate(ctx, c, sb)
	return sb, nil
}

// create is Create for o.Tenant, without quota or audit.
func (m *Manager) create(ctx context.Context, o CreateOptions) (store.Sandbox, error) {
	if o.Image == "" {
		o.Image = "base"
	}
	img, err := m.Store.GetImage(ctx, o.Image)
	if o.imageDigest != "" {
		// A gvisor template's image: its own blob, under the template's
		// name (no catalog entry).
		img, err = store.ImageRecord{Name: o.Image, Digest: o.imageDigest, Size: o.imageSize}, nil
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return store.Sandbox{}, fmt.Errorf("%w: unknown image %q (see `airlock image ls`; build the default with `airlock image build base`)", errdefs.ErrNotFound, o.Image)
		}
		return store.Sandbox{}, err
	}
	if err := o.validate(img.Size); err != nil {
		return store.Sandbox{}, err
	}
	if _, err := m.L.LoadBootConfig(); err != nil {
		return store.Sandbox{}, err
	}
	rt, err := m.runtimeName(ctx)
	if err != nil {
		return store.Sandbox{}, err
	}
	if err := m.checkMountsFor(ctx, rt, o); err != nil {
		return store.Sandbox{}, err
	}
	now := time.Now()
	sb := store.Sandbox{
		ID: statedir.NewID(), State: store.StateCreating, Image: o.Image, ImageDigest: img.Digest,
		CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskMiB: o.DiskMiB, TimeoutSec: int(o.Timeout / time.Second),
		CreatedAt: now, ExpiresAt: now.Add(o.Timeout), Metadata: o.Metadata, Tenant: o.Tenant, Env: o.Env,
		Network: o.Network, IdlePause: o.IdlePause, Runtime: rt, Mounts: o.mounts, ExecDefaults: o.execDefaults,
	}
	lock, err := m.newSandboxDir(sb.ID)
	if err != nil {
		return sb, err
	}
	if err := m.Store.CreateSandbox(ctx, sb); err != nil {
		lock.Close()
		_ = os.RemoveAll(m.L.Dir(sb.ID))
		return sb, err
	}
	if err := m.launch(ctx, sb, o.Secrets, o.buildRoot, lock); err != nil {
		return sb, err
	}
	return m.Store.GetSandbox(ctx, sb.ID)
}

// runtimeName is the runtime a new sandbox gets (Runtime; nil: qemu).
func (m *Manager) runtimeName(ctx context.Context) (string, error) {
	if m.Runtime == nil {
		return "qemu", nil
	}
	return m.Runtime(ctx)
}

// launch starts new sandbox sb's shim (its catalog row and directory
// exist; lock is its shim lock), with its secret values sealed first so
// that the shim of a resume binds them again. On failure the sandbox is
// removed.
func (m *Manager) launch(ctx context.Context, sb store.Sandbox, secrets netconf.Values, buildRoot string, lock *os.File) error {
	if len(secrets) > 0 {
		if err := m.sealSecrets(sb.ID, secrets); err != nil {
			lock.Close()
			_ = m.remove(context.WithoutCancel(ctx), sb.ID)
			return err
		}
	}
	if err := m.startShim(ctx, sb, secrets, buildRoot, lock); err != nil {
		_ = m.remove(context.WithoutCancel(ctx), sb.ID)
		return err
	}
	return nil
}

// errShim marks a failure reported by a shim; its text is the shim's reason.
var errShim = fmt.Errorf("%w", shimError{})

type shimError struct{}

func (shimError) Error() string        { return "" }
func (shimError) Is(target error) bool { return target == errdefs.ErrUnavailable }

// newSandboxDir creates sandbox id's directory and takes its shim lock,
// for the shim that the caller starts after inserting the row.
func (m *Manager) newSandboxDir(id string) (*os.File, error) {
	if err := os.MkdirAll(m.L.Dir(id), 0o700); err != nil {
		return nil, fmt.Errorf("create sandbox dir: %w", err)
	}
	lock, err := m.takeShimLock(id)
	if err != nil {
		_ = os.RemoveAll(m.L.Dir(id))
	}
	return lock, err
}

// takeShimLock takes sandbox id's shim lock (see store.Transition: a
// generation is claimed only while holding it, and the lock goes to the
// shim that startShim starts). It fails with ErrConflict while a shim
// holds it.
func (m *Manager) takeShimLock(id string) (*os.File, error) {
	f, err := os.OpenFile(m.L.ShimLock(id), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shim lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: a shim of sandbox %s is running", errdefs.ErrConflict, id)
	}
	return f, nil
}

// startShim starts `airlock shim` for sb (on sb's runtime) detached, or
// has m.StartShim start it, and waits for its verdict on a pipe: "ok" once
// the guest answers, or "error: ..." with the reason. lock is sb's shim
// lock, held by the caller since it claimed sb's generation: the shim
// inherits it (fd ShimLockFD), so the lock stays held for as long as the
// owner of that generation lives. startShim closes the caller's copy.
func (m *Manager) startShim(ctx context.Context, sb store.Sandbox, secrets netconf.Values, buildRoot string, lock *os.File) error {
	defer lock.Close()
	id := sb.ID
	root, err := filepath.Abs(m.L.Root)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	doc := shimconf.Doc{
		Version: shimconf.Version, StateDir: root, ID: id, Runtime: cmp.Or(sb.Runtime, "qemu"),
		DiskReserve: m.DiskReserve, Options: m.Shim.WithDefaults(), Secrets: secrets, BuildRoot: buildRoot,
	}
	if err := doc.Validate(); err != nil {
		return err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	var kill func()
	if m.StartShim != nil {
		err = m.startInProcess(doc, pw, lock)
	} else {
		kill, err = m.execShim(doc, pw, lock)
	}
	if err != nil {
		return err
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(io.LimitReader(pr, 4096)).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		switch {
		case s == "ok":
			return nil
		case strings.HasPrefix(s, "error: "):
			// The shim's reason is already a sentence for the user.
			return fmt.Errorf("%w%s", errShim, strings.TrimPrefix(s, "error: "))
		default:
			return fmt.Errorf("%w: the sandbox's shim exited before it was ready (see %s)", errdefs.ErrUnavailable, m.L.ShimLog(id))
		}
	case <-ctx.Done():
		if kill != nil {
			kill()
		}
		return fmt.Errorf("wait for sandbox: %w", ctx.Err())
	}
}

// startInProcess hands doc, ready and a new descriptor of lock (the same
// open file: the lock stays held once the caller closes its own) to
// m.StartShim. If that fails, it closes ready and the new descriptor.
func (m *Manager) startInProcess(doc shimconf.Doc, ready *os.File, lock *os.File) error {
	fd, err := unix.FcntlInt(lock.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		ready.Close()
		return fmt.Errorf("shim lock: %w", err)
	}
	held := os.NewFile(uintptr(fd), lock.Name())
	if err := m.StartShim(doc, ready, held); err != nil {
		ready.Close()
		held.Close()
		return fmt.Errorf("start shim: %w", err)
	}
	return nil
}

// execShim starts `airlock shim --id ID` detached, with ready on its fd 3,
// doc on a pipe at fd 4 and lock on fd 5, and closes this process's
// copies of ready and lock. kill kills it; it is reaped when it exits.
func (m *Manager) execShim(doc shimconf.Doc, ready *os.File, lock *os.File) (kill func(), err error) {
	defer ready.Close()
	id := doc.ID
	exe := m.Exe
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find airlock binary: %w", err)
		}
	}
	logf, err := os.OpenFile(m.L.ShimLog(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shim log: %w", err)
	}
	defer logf.Close()
	// The configuration, secret values included, reaches the shim through
	// a pipe: never argv, env or disk.
	cr, cw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer cr.Close()
	// argv names the sandbox for ps; the shim checks it against the
	// document.
	cmd := exec.Command(exe, "shim", "--id", id)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{ready, cr, lock} // fd 3: readiness, fd 4 (shimconf.FD): config, fd 5: shim lock
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Env = shimEnv(os.Environ(), doc.Secrets)
	if err := cmd.Start(); err != nil {
		cw.Close()
		return nil, fmt.Errorf("start shim: %w", err)
	}
	lock.Close() // the shim holds it now
	go func() {
		defer cw.Close()
		if err := shimconf.Write(cw, doc); err != nil {
			m.log().Warn("write shim config", "sandbox_id", id, "err", err)
		}
	}()
	go func() { _ = cmd.Wait() }() // reaps it if it dies while we wait
	return func() { _ = cmd.Process.Kill() }, nil
}

// shimEnv is the environment a shim starts with: this process's, less the
// caller's own copies of the secret values (`--secret NAME@host` reads
// $NAME; the shim gets the values in its document) and the environment
// knobs (the command read them into Manager.Shim: the shim reads its
// settings from its document only).
func shimEnv(environ []string, secrets netconf.Values) []string {
	knobs := map[string]bool{}
	for _, k := range envknob.All() {
		knobs[k.Name] = true
	}
	return slices.DeleteFunc(slices.Clone(environ), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, isSecret := secrets[k]
		return isSecret || knobs[k]
	})
}

// shimAlive reports whether the shim of id holds its lock.
func (m *Manager) shimAlive(id string) bool {
	f, err := os.OpenFile(m.L.ShimLock(id), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// Reconcile settles a sandbox whose owner is gone and returns the fresh
// row. An alive sandbox (creating, resuming, running, pausing, stopping)
// is owned by the shim of its generation, which holds the shim lock from
// the claim on (store.Transition explains the protocol): a free lock is
// proof that the owner is gone. Then a sandbox that died resuming or
// pausing with its saved state whole is paused again (the next resume
// checks the state), and any other is failed. The verdict is a
// compare-and-set on the state and generation read: a row that moved on
// meanwhile (a new owner) is returned as it is now.
func (m *Manager) Reconcile(ctx context.Context, sb store.Sandbox) store.Sandbox {
	if !sb.State.Alive() || m.shimAlive(sb.ID) {
		return sb
	}
	c := store.Change{To: store.StateFailed, From: sb.State, Gen: sb.Gen,
		Reason: "the sandbox's supervisor (shim) exited unexpectedly; its VM was stopped"}
	oom := false
	if env, err := hostcg.Open(hostcg.DefaultParent, sb.ID); err == nil {
		if st, err := env.Stats(); err == nil && st.OOMKills > 0 {
			oom = true
			c.Reason = "out of memory: the host killed the sandbox's supervisor (shim) at its host memory envelope; its VM was stopped"
		}
	}
	if sb.State == store.StateResuming || sb.State == store.StatePausing {
		if _, err := os.Stat(filepath.Join(m.L.PauseDir(sb.ID), statedir.PauseManifestFile)); err == nil {
			c = store.Change{To: store.StatePaused, From: sb.State, Gen: sb.Gen, LifetimeLeft: time.Until(sb.ExpiresAt)}
		}
	}
	cur, err := m.Store.Transition(ctx, sb.ID, c)
	if err != nil {
		if fresh, gerr := m.Store.GetSandbox(ctx, sb.ID); gerr == nil {
			return fresh
		}
		return sb
	}
	// Recorded as the sandbox's tenant: nobody asked for it.
	owner := Caller{Tenant: sb.Tenant}
	if c.To == store.StateFailed {
		d := map[string]any{"reason": c.Reason, "was": string(sb.State), "reaped": true}
		if oom {
			d["oom_killed"] = true
		}
		m.audit(ctx, owner, sb.ID, "sandbox.fail", d)
	} else {
		m.audit(ctx, owner, sb.ID, "sandbox.pause", map[string]any{"reason": "its supervisor exited while " + string(sb.State) + "; the saved state is whole", "was": string(sb.State), "reaped": true})
	}
	return cur
}

// SetTimeout moves the end of life of c's sandbox id to now + d (the shim
// watches the catalog and stops the sandbox then) and audits
// sandbox.timeout. d is between 1s and MaxTimeout.
func (m *Manager) SetTimeout(ctx context.Context, c Caller, id string, d time.Duration) error {
	if _, err := m.lookup(ctx, c, id); err != nil {
		return err
	}
	if err := m.setTimeout(ctx, id, d); err != nil {
		return err
	}
	m.audit(ctx, c, id, "sandbox.timeout", map[string]any{"timeout_s": int(d / time.Second)})
	return nil
}

func (m *Manager) setTimeout(ctx context.Context, id string, d time.Duration) error {
	if d < time.Second || d > MaxTimeout {
		return fmt.Errorf("%w: timeout must be between 1s and %s", errdefs.ErrInvalid, MaxTimeout)
	}
	// A paused sandbox's lifetime counts running time: set what is left.
	if ok, err := m.Store.SetLifetimeLeft(ctx, id, d); err != nil || ok {
		return err
	}
	if err := m.Store.SetExpiry(ctx, id, time.Now().Add(d)); err != nil {
		return err
	}
	// A running shim moves its lifetime timer now; one that misses this
	// (starting, or gone) reads the row itself within lifetimePoll.
	if err := m.shims().Get(m.L.Socket(id)).Refresh(ctx); err != nil {
		m.Log.Debug("lifetime refresh", "sandbox_id", id, "err", err)
	}
	return nil
}

// Get returns sandbox id, reconciled, if c may see it (see lookup for
// the errors).
func (m *Manager) Get(ctx context.Context, c Caller, id string) (store.Sandbox, error) {
	return m.lookup(ctx, c, id)
}

// get returns a reconciled sandbox, whoever owns it.
func (m *Manager) get(ctx context.Context, id string) (store.Sandbox, error) {
	if err := statedir.ValidateID(id); err != nil {
		return store.Sandbox{}, err
	}
	sb, err := m.Store.GetSandbox(ctx, id)
	if err != nil {
		return sb, err
	}
	return m.Reconcile(ctx, sb), nil
}

// List returns the reconciled sandboxes c may see: its tenant's, or every
// tenant's for an admin.
func (m *Manager) List(ctx context.Context, c Caller) ([]store.Sandbox, error) {
	sbs, err := m.list(ctx)
	if err != nil {
		return nil, err
	}
	out := sbs[:0]
	for _, sb := range sbs {
		if c.Sees(sb) {
			out = append(out, sb)
		}
	}
	return out, nil
}

// list returns every tenant's reconciled sandboxes.
func (m *Manager) list(ctx context.Context) ([]store.Sandbox, error) {
	sbs, err := m.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range sbs {
		sbs[i] = m.Reconcile(ctx, sbs[i])
	}
	return sbs, nil
}

// Remove stops c's sandbox id (through its shim when alive), deletes every
// trace of it (shim, VMM, files, catalog row) and audits sandbox.delete.
// An admin may also remove what is left of a sandbox with no catalog row
// (its files).
func (m *Manager) Remove(ctx context.Context, c Caller, id string) error {
	if _, err := m.lookup(ctx, c, id); err != nil && (!c.Admin || !errors.Is(err, errdefs.ErrNotFound)) {
		return err
	}
	if err := m.remove(ctx, id); err != nil {
		return err
	}
	m.audit(ctx, c, id, "sandbox.delete", nil)
	return nil
}

// remove is Remove for the manager's own use: whoever owns id, no audit.
// Removing twice is fine.
func (m *Manager) remove(ctx context.Context, id string) error {
	if err := statedir.ValidateID(id); err != nil {
		return err
	}
	if _, err := m.Store.GetSandbox(ctx, id); err != nil {
		if _, serr := os.Stat(m.L.Dir(id)); serr != nil {
			return err
		}
	}
	if m.shimAlive(id) {
		sock := m.L.Socket(id)
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := m.shims().Get(sock).Shutdown(sctx)
		cancel()
		// The shim exits: streams still open on its connection end.
		m.shims().Drop(sock)
		if err != nil {
			m.log().Warn("shim shutdown failed; killing it", "sandbox_id", id, "err", err)
		}
		if err := m.waitShimGone(ctx, id, 10*time.Second); err != nil {
			return err
		}
	}
	// A supervisor that died (killed, host crash) cannot have cleaned up
	// what its runtime mounted: runsc's state and network namespaces.
	detachNetns(id)
	// Its host cgroup, which a shim removes on its way out unless it died.
	if err := hostcg.Remove(hostcg.DefaultParent, id); err != nil {
		m.log().Warn("host cgroup left behind", "sandbox_id", id, "err", err)
	}
	if err := m.dropBundle(ctx, id); err != nil {
		m.log().Warn("its bundle was left in the bundle store", "sandbox_id", id, "err", err)
	}
	if err := statedir.RemoveAllNoMounts(m.L.Dir(id)); err != nil {
		return fmt.Errorf("remove sandbox files: %w", err)
	}
	// The row goes with the disk references it holds; the collector then
	// frees what only it held (the unlisted base of a fork goes with the
	// last sandbox on it).
	if err := m.Store.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	if _, _, err := m.collect(ctx); err != nil {
		m.log().Warn("collect after rm", "sandbox_id", id, "err", err)
	}
	return nil
}

// waitShimGone waits until the shim's lock is free, killing the shim (and
// with it, by parent-death signal, its VMM) if it lingers.
func (m *Manager) waitShimGone(ctx context.Context, id string, grace time.Duration) error {
	deadline := time.Now().Add(grace)
	for m.shimAlive(id) {
		if time.Now().After(deadline) {
			if pid := m.shimPID(id); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			deadline = time.Now().Add(5 * time.Second)
			grace = 0
			if !m.shimAlive(id) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if grace == 0 && time.Now().After(deadline) {
			return fmt.Errorf("%w: the shim of %s did not exit", errdefs.ErrUnavailable, id)
		}
	}
	return nil
}

// shimPID reads the PID the shim wrote into its lock file.
// ShimPID is the pid of the sandbox's shim if it runs, else 0.
func (m *Manager) ShimPID(id string) int {
	if !m.shimAlive(id) {
		return 0
	}
	return m.shimPID(id)
}

func (m *Manager) shimPID(id string) int {
	b, err := os.ReadFile(m.L.ShimLock(id))
	if err != nil {
		return 0
	}
	var pid int
	_, _ = fmt.Sscanf(string(b), "%d", &pid)
	return pid
}

// detachNetns removes network namespaces the gvisor runtime created for
// sandbox id (named airlock-<id>-<suffix> under /run/netns).
func detachNetns(id string) {
	nss, _ := filepath.Glob("/run/netns/airlock-" + id + "-*")
	for _, ns := range nss {
		_ = unix.Unmount(ns, unix.MNT_DETACH)
		_ = os.Remove(ns)
	}
}
