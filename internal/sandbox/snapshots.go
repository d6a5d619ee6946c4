package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// ErrHasMounts refuses a snapshot or fork of a sandbox with volumes or host
// mounts. It is an ErrFailedPrecondition.
var ErrHasMounts = fmt.Errorf("%w: snapshots and forks of sandboxes with volumes or host mounts are refused (their data is not part of a snapshot)", errdefs.ErrFailedPrecondition)

// MaxForks bounds one Fork call.
const MaxForks = 16

var snapshotName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) })

// ValidateSnapshotName checks a user-given snapshot name.
func ValidateSnapshotName(name string) error {
	if !snapshotName().MatchString(name) {
		return fmt.Errorf("%w: snapshot name %q: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", errdefs.ErrInvalid, name)
	}
	return nil
}

// Snapshot saves a running (or paused) sandbox's memory, devices and disk
// as a named snapshot that new sandboxes start from; the sandbox keeps
// running (saved while it runs: its guest stops only for the save and keeps
// its TCP connections; a shim from before live snapshots pauses and resumes
// it instead). The snapshot is the sandbox's tenant's; it is audited as
// snapshot.create.
func (m *Manager) Snapshot(ctx context.Context, c Caller, id, name string, force bool) (store.Snapshot, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return store.Snapshot{}, err
	}
	if err := ValidateSnapshotName(name); err != nil {
		return store.Snapshot{}, err
	}
	if err := m.spaceForState(ctx, c, sb, "this snapshot"); err != nil {
		return store.Snapshot{}, err
	}
	if err := m.snapshotCount(ctx, c, sb.Tenant); err != nil {
		return store.Snapshot{}, err
	}
	start := time.Now()
	sn, err := m.snapshot(ctx, id, name, force)
	if err != nil {
		return sn, err
	}
	m.audit(ctx, c, id, "snapshot.create", map[string]any{"name": sn.Name, "snapshot_id": sn.ID, "force": force,
		"size_bytes": sn.Size, "duration_ms": time.Since(start).Milliseconds()})
	return sn, nil
}

func (m *Manager) snapshot(ctx context.Context, id, name string, force bool) (store.Snapshot, error) {
	sb, err := m.get(ctx, id)
	if err != nil {
		return store.Snapshot{}, err
	}
	if _, err := m.Store.GetSnapshot(ctx, sb.Tenant, name); err == nil {
		return store.Snapshot{}, fmt.Errorf("%w: snapshot %q exists (remove it first)", errdefs.ErrConflict, name)
	}
	if len(sb.Mounts) > 0 {
		// A snapshot holds memory and the root disk. Its sandboxes would
		// need the same devices, and a volume's data would be shared by
		// reference with a guest whose page cache disagrees with it.
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s has %s mounted at %s; copy the data into the root disk or snapshot a sandbox without mounts",
			ErrHasMounts, id, mountWhat(sb.Mounts[0]), sb.Mounts[0].Path)
	}
	if sb.State == store.StateRunning {
		sn, err := m.liveSnapshot(ctx, sb, name, force)
		if !errors.Is(err, errdefs.ErrUnsupported) {
			return sn, err
		}
		// A shim from before live snapshots: pause, freeze, resume.
		if m.Log != nil {
			m.Log.Info("live snapshot unsupported; pausing for it", "sandbox_id", id, "err", err)
		}
	}
	wasRunning := sb.State != store.StatePaused
	if wasRunning {
		if _, err := m.pause(ctx, id, force); err != nil {
			if errors.Is(err, errdefs.ErrFailedPrecondition) {
				// Say what was asked for: a snapshot (which pauses the
				// sandbox for a moment), not a pause.
				_, why, _ := strings.Cut(err.Error(), "pause: ")
				return store.Snapshot{}, fmt.Errorf("%w: a snapshot of sandbox %s pauses it for a moment, and %s", errdefs.ErrFailedPrecondition, id, cmp.Or(why, err.Error()))
			}
			return store.Snapshot{}, err
		}
	}
	sn, err := m.freeze(ctx, sb, name)
	if wasRunning {
		if _, rerr := m.resume(ctx, id); rerr != nil {
			err = errors.Join(err, fmt.Errorf("resume after snapshot: %w", rerr))
		}
	}
	return sn, err
}

// liveSnapshot has sb's shim save it into a new snapshot directory while it
// runs (shimclient.Snapshot), then completes and records the snapshot.
// ErrUnsupported: the shim or its runtime cannot (the caller pauses
// instead); nothing was changed then.
func (m *Manager) liveSnapshot(ctx context.Context, sb store.Sandbox, name string, force bool) (store.Snapshot, error) {
	// See freeze for the modes. The id is random, not a content address:
	// the sandbox's new disk overlay names the snapshot's disk as its
	// backing file before the disk's digest is known.
	_ = os.MkdirAll(m.L.SnapshotsDir(), 0o711)
	_ = os.Chmod(m.L.SnapshotsDir(), 0o711)
	var rb [16]byte
	_, _ = rand.Read(rb[:])
	sid := hex.EncodeToString(rb[:])
	dir := m.L.SnapshotDir(sid)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return store.Snapshot{}, err
	}
	_, err := m.shims().Get(m.L.Socket(sb.ID)).Snapshot(ctx, dir, force)
	if err != nil {
		if _, serr := os.Stat(filepath.Join(dir, statedir.SnapshotDisk)); serr != nil {
			// The shim undid what it made (or never began): nothing uses dir.
			_ = os.RemoveAll(dir)
			return store.Snapshot{}, err
		}
	}
	// The sandbox's disk may now be backed by dir's (or the shim failed
	// the sandbox): dir stays, recorded under name or, failing that, as an
	// unlisted snapshot that the collector frees with the sandbox.
	var sn store.Snapshot
	if err == nil {
		if sn, err = m.completeLive(ctx, sb, name, sid, dir); err == nil {
			return sn, nil
		}
	}
	sn = liveSnapshotRow(sb, template.ForkPrefix+statedir.RandomID(12), sid)
	sn.Size = statedir.DirUsage(dir)
	if rerr := m.Store.RecordSnapshot(context.WithoutCancel(ctx), sn); rerr != nil {
		m.log().Error("record a live snapshot's disk", "sandbox_id", sb.ID, "snapshot_id", sid, "err", rerr)
	}
	return store.Snapshot{}, err
}

// liveSnapshotRow is the catalog row of sid, a live snapshot of sb named
// name.
func liveSnapshotRow(sb store.Sandbox, name, sid string) store.Snapshot {
	return store.Snapshot{
		Tenant: sb.Tenant, Name: name, ID: sid, SandboxID: sb.ID, Image: sb.Image, ImageDigest: sb.ImageDigest,
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Network: sb.Network, Env: sb.Env,
		Created: time.Now(), ExecDefaults: sb.ExecDefaults,
	}
}

// completeLive adds the frozen disk's digest to the manifest the shim
// wrote in dir and records the snapshot.
func (m *Manager) completeLive(ctx context.Context, sb store.Sandbox, name, sid, dir string) (store.Snapshot, error) {
	sn := liveSnapshotRow(sb, name, sid)
	mpath := filepath.Join(dir, statedir.PauseManifestFile)
	var man statedir.PauseManifest
	b, err := os.ReadFile(mpath)
	if err != nil || json.Unmarshal(b, &man) != nil {
		return sn, fmt.Errorf("%w: the live snapshot of %s has no readable manifest", errdefs.ErrFailedPrecondition, sb.ID)
	}
	disk := ""
	if !man.RootInState {
		disk = filepath.Join(dir, statedir.SnapshotDisk)
		if err := os.Chmod(disk, 0o444); err != nil {
			return sn, fmt.Errorf("snapshot disk: %w", err)
		}
	}
	if err := completeManifest(&man, disk, sb); err != nil {
		return sn, err
	}
	mb, _ := json.MarshalIndent(man, "", "  ")
	if err := errors.Join(os.Remove(mpath), os.WriteFile(mpath, mb, 0o400)); err != nil {
		return sn, err
	}
	sn.Size = statedir.DirUsage(dir)
	return sn, m.Store.RecordSnapshot(ctx, sn)
}

// completeManifest adds the frozen disk's digest, the snapshot's digest
// (over the state's and the disk's) and what it was taken of to man. disk
// is empty for a snapshot without one (man.RootInState).
func completeManifest(man *statedir.PauseManifest, disk string, sb store.Sandbox) error {
	if disk != "" {
		h := sha256.New()
		if _, err := statedir.HashFile(h, disk, statedir.SnapshotDisk); err != nil {
			return err
		}
		man.DiskSHA256 = hex.EncodeToString(h.Sum(nil))
	}
	sum := sha256.Sum256([]byte(man.StateSHA256 + "\n" + man.DiskSHA256 + "\n"))
	man.Digest = "sha256:" + hex.EncodeToString(sum[:])
	man.ImageDigest, man.CPUs, man.MemoryMiB, man.DiskMiB = sb.ImageDigest, sb.CPUs, sb.MemoryMiB, sb.DiskMiB
	return nil
}

// freeze turns a paused sandbox's state into a snapshot: the saved state
// is hard-linked (the sandbox's resume reads it too), the disk overlay
// moves into the snapshot and the sandbox gets a new overlay on top of it.
func (m *Manager) freeze(ctx context.Context, sb store.Sandbox, name string) (store.Snapshot, error) {
	// Built under a temporary name, then renamed to its content address:
	// the digest of its state and disk.
	// VMMs open a snapshot's disk by path as their own uids: the
	// directories are traversable (0711) but not listable, and snapshot
	// ids are 128-bit digests, so other local users cannot find the disks.
	_ = os.MkdirAll(m.L.SnapshotsDir(), 0o711)
	_ = os.Chmod(m.L.SnapshotsDir(), 0o711)
	tmp := filepath.Join(m.L.SnapshotsDir(), ".tmp-"+statedir.RandomID(12))
	if err := os.Mkdir(tmp, 0o711); err != nil {
		return store.Snapshot{}, err
	}
	if err := os.Mkdir(filepath.Join(tmp, statedir.PauseStateDir), 0o700); err != nil {
		_ = os.RemoveAll(tmp)
		return store.Snapshot{}, err
	}
	dir := tmp
	ok := false
	root := m.L.RootDisk(sb.ID)
	movedDisk := ""
	rootMode := os.FileMode(0o600)
	if fi, err := os.Stat(root); err == nil {
		rootMode = fi.Mode().Perm()
	}
	defer func() {
		if !ok {
			// The sandbox is paused (no VMM has its disk open): its disk
			// goes back, replacing the overlay made on top of it.
			if movedDisk != "" && os.Rename(movedDisk, root) == nil {
				_ = os.Chmod(root, rootMode)
			}
			_ = os.RemoveAll(dir)
		}
	}()
	pdir := m.L.PauseDir(sb.ID)
	var man statedir.PauseManifest
	b, err := os.ReadFile(filepath.Join(pdir, statedir.PauseManifestFile))
	if err != nil || json.Unmarshal(b, &man) != nil {
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s has no readable paused state", errdefs.ErrFailedPrecondition, sb.ID)
	}
	states, _ := os.ReadDir(filepath.Join(pdir, statedir.PauseStateDir))
	for _, e := range states {
		if err := os.Link(filepath.Join(pdir, statedir.PauseStateDir, e.Name()), filepath.Join(dir, statedir.PauseStateDir, e.Name())); err != nil {
			return store.Snapshot{}, fmt.Errorf("snapshot state: %w", err)
		}
	}
	// The execs the pause parked (they are in the snapshot's memory): its
	// sandboxes adopt them with their output.
	if err := os.Link(filepath.Join(pdir, statedir.PausedExecsFile), filepath.Join(dir, statedir.PausedExecsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return store.Snapshot{}, fmt.Errorf("snapshot execs: %w", err)
	}
	// The overlay becomes the snapshot's frozen disk; the sandbox continues
	// on a new overlay backed by it. (A state that holds the root's
	// writes, gVisor's, is the whole snapshot.)
	if !man.RootInState {
		if err := os.Rename(root, filepath.Join(dir, statedir.SnapshotDisk)); err != nil {
			return store.Snapshot{}, fmt.Errorf("snapshot disk: %w", err)
		}
		movedDisk = filepath.Join(dir, statedir.SnapshotDisk)
		_ = os.Chmod(movedDisk, 0o444)
	}
	if err := completeManifest(&man, movedDisk, sb); err != nil {
		return store.Snapshot{}, err
	}
	// The content address: the first 128 bits of the digest.
	sid := strings.TrimPrefix(man.Digest, "sha256:")[:32]
	final := m.L.SnapshotDir(sid)
	if err := os.Rename(dir, final); err != nil {
		return store.Snapshot{}, fmt.Errorf("%w: snapshot %s: %v", errdefs.ErrConflict, sid, err)
	}
	dir = final
	if !man.RootInState {
		movedDisk = filepath.Join(final, statedir.SnapshotDisk)
		if err := statedir.CreateOverlay(ctx, root, movedDisk, "qcow2", 0); err != nil {
			return store.Snapshot{}, err
		}
	}
	mb, _ := json.MarshalIndent(man, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, statedir.PauseManifestFile), mb, 0o400); err != nil {
		return store.Snapshot{}, err
	}
	sn := store.Snapshot{
		Tenant: sb.Tenant, Name: name, ID: sid, SandboxID: sb.ID, Image: sb.Image, ImageDigest: sb.ImageDigest,
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Network: sb.Network, Env: sb.Env,
		Size: statedir.DirUsage(dir), Created: time.Now(), ExecDefaults: sb.ExecDefaults,
	}
	// Disk chains: the snapshot is backed by whatever the sandbox's disk
	// was; the sandbox now by the snapshot too. On failure (a name taken
	// meanwhile) the deferred undo puts the sandbox's disk back.
	if err := m.Store.RecordSnapshot(ctx, sn); err != nil {
		return store.Snapshot{}, err
	}
	ok = true
	return sn, nil
}

// CreateFromSnapshot starts a sandbox from a snapshot: its memory,
// processes and disk as they were, with a fresh clock and RNG seed and its
// own network stack. It is c's tenant's snapshot and sandbox, within c's
// quota (a *QuotaError), audited as sandbox.create. o may set Timeout,
// Metadata and IdlePause; the size, image, env and network come from the
// snapshot. Fork bases are not found here.
func (m *Manager) CreateFromSnapshot(ctx context.Context, c Caller, name string, o CreateOptions) (store.Sandbox, error) {
	o.Tenant = c.Tenant
	if strings.HasPrefix(name, unlisted) {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	sn, err := m.Store.GetSnapshot(ctx, o.Tenant, name)
	if err != nil {
		return store.Sandbox{}, err
	}
	if sizeDiffers(o, sn) {
		return store.Sandbox{}, fmt.Errorf("%w: a sandbox from snapshot %q has its size (%d cpus, %d MiB memory, %d MiB disk)", errdefs.ErrInvalid, name, sn.CPUs, sn.MemoryMiB, sn.DiskMiB)
	}
	if o.Image != "" && o.Image != sn.Image {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q is of image %q", errdefs.ErrInvalid, name, sn.Image)
	}
	if len(o.Secrets) > 0 || len(o.Network.Secrets) > 0 {
		return store.Sandbox{}, fmt.Errorf("%w: a sandbox from a snapshot cannot have secrets", errdefs.ErrInvalid)
	}
	if len(o.Volumes) > 0 || len(o.HostMounts) > 0 {
		return store.Sandbox{}, fmt.Errorf("%w: a sandbox from a snapshot cannot have volumes or host mounts (the snapshot's devices are fixed)", errdefs.ErrInvalid)
	}
	return m.createFromSnapshot(ctx, c, sn, "snapshot:"+name, o)
}

// sizeDiffers reports whether o asks for a size other than sn's (0 in o:
// whatever sn has).
func sizeDiffers(o CreateOptions, sn store.Snapshot) bool {
	return (o.CPUs != 0 && o.CPUs != sn.CPUs) || (o.MemoryMiB != 0 && o.MemoryMiB != sn.MemoryMiB) || (o.DiskMiB != 0 && o.DiskMiB != sn.DiskMiB)
}

// createFromSnapshot starts a sandbox of c's tenant from sn, already found
// (unlisted ones included) and checked, within c's quota, audited as
// sandbox.create; source is the new sandbox's Source.
func (m *Manager) createFromSnapshot(ctx context.Context, c Caller, sn store.Snapshot, source string, o CreateOptions) (store.Sandbox, error) {
	o.Tenant = c.Tenant
	release, err := m.reserve(ctx, c, c.Tenant, 1, sn.CPUs, sn.MemoryMiB, sn.DiskMiB)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	o.limits = c.Limits
	sb, err := m.materialize(ctx, sn, source, o)
	if err != nil {
		return sb, err
	}
	m.auditCreate(ctx, c, sb)
	return sb, nil
}

// Fork makes count running copies of c's sandbox id: a snapshot of it
// (kept, unlisted, while the forks exist; see PruneSnapshots) and count
// sandboxes from it. The copies are the source's tenant's and count
// against its quota with c's limits (a *QuotaError). All or nothing: on
// an error the copies made so far are removed. Each copy is audited as
// sandbox.create, the source as sandbox.fork.
// ForkOptions say how to fork a sandbox.
type ForkOptions struct {
	Count int  // 1 to MaxForks
	Force bool // end running code (and commands) rather than refuse
	// Secrets binds the source's secret values in each fork (the caller
	// may see the source, so the values are its tenant's already).
	// Without it a fork has none: its guest still holds the placeholders,
	// which then reach no one.
	Secrets bool
}

func (m *Manager) Fork(ctx context.Context, c Caller, id string, o ForkOptions) ([]store.Sandbox, error) {
	count, force := o.Count, o.Force
	if count < 1 || count > MaxForks {
		return nil, fmt.Errorf("%w: fork count must be 1 to %d", errdefs.ErrInvalid, MaxForks)
	}
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return nil, err
	}
	release, err := m.reserve(ctx, c, sb.Tenant, count, sb.CPUs, sb.MemoryMiB, sb.DiskMiB)
	if err != nil {
		return nil, err
	}
	defer release()
	// The fork snapshots the sandbox (its memory), then each fork can grow
	// to its disk size.
	if err := m.CheckSpace(ctx, fmt.Sprintf("%d forks of a %d MiB disk and a %d MiB memory snapshot", count, sb.DiskMiB, sb.MemoryMiB),
		int64(count*sb.DiskMiB+sb.MemoryMiB)<<20); err != nil {
		return nil, err
	}
	var secrets netconf.Values
	if o.Secrets && len(sb.Network.Secrets) > 0 {
		if secrets, err = m.openSecrets(id); err != nil {
			return nil, fmt.Errorf("%w: %v", errdefs.ErrFailedPrecondition, err)
		}
	}
	sn, err := m.snapshot(ctx, id, template.ForkPrefix+statedir.RandomID(12), force)
	if err != nil {
		return nil, err
	}
	// The copies start side by side (the first to come builds the
	// snapshot's template; the others wait for it), up to forkParallel at
	// a time.
	out := make([]store.Sandbox, count)
	errs := make([]error, count)
	sem := make(chan struct{}, forkParallel())
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i], errs[i] = m.materialize(ctx, sn, "fork:"+id, CreateOptions{Tenant: sb.Tenant, Timeout: time.Duration(sb.TimeoutSec) * time.Second, IdlePause: sb.IdlePause, Metadata: sb.Metadata, Secrets: secrets, limits: c.Limits})
		})
	}
	wg.Wait()
	if err := firstErr(errs); err != nil {
		for i, f := range out {
			if errs[i] != nil || f.ID == "" {
				continue
			}
			if rerr := m.remove(context.WithoutCancel(ctx), f.ID); rerr != nil && m.Log != nil {
				m.Log.Error("remove partial fork", "sandbox_id", f.ID, "err", rerr)
			}
		}
		return nil, err
	}
	ids := make([]string, 0, len(out))
	for _, f := range out {
		m.auditCreate(ctx, c, f)
		ids = append(ids, f.ID)
	}
	m.audit(ctx, c, id, "sandbox.fork", map[string]any{"count": count, "force": force, "forks": ids, "secrets": len(secrets) > 0})
	return out, nil
}

// forkParallel is how many copies of one Fork start at once: two per host
// CPU, at least 4 (all of them wait for the first one's template build,
// then a start is mostly CPU work).
func forkParallel() int { return max(4, 2*goruntime.NumCPU()) }

// firstErr returns the first non-nil error of errs, if any.
func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// materialize creates a sandbox from snapshot sn: its shim clones the
// snapshot's template (built on first use), so sandboxes from one snapshot
// share the memory pages none of them changed.
func (m *Manager) materialize(ctx context.Context, sn store.Snapshot, source string, o CreateOptions) (store.Sandbox, error) {
	sdir := m.L.SnapshotDir(sn.ID)
	var man statedir.PauseManifest
	b, err := os.ReadFile(filepath.Join(sdir, statedir.PauseManifestFile))
	if err != nil || json.Unmarshal(b, &man) != nil {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q has no readable manifest", errdefs.ErrFailedPrecondition, sn.Name)
	}
	// The disk backs every sandbox from the snapshot: check it each time
	// (the state is checked when the snapshot's template is built, or on
	// gVisor, whose snapshots have no disk, at each restore).
	if !man.RootInState {
		h := sha256.New()
		if _, err := statedir.HashFile(h, filepath.Join(sdir, statedir.SnapshotDisk), statedir.SnapshotDisk); err != nil || hex.EncodeToString(h.Sum(nil)) != man.DiskSHA256 {
			return store.Sandbox{}, fmt.Errorf("%w: snapshot %q is corrupt: its disk does not match its digest", errdefs.ErrFailedPrecondition, sn.Name)
		}
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout < time.Second || o.Timeout > MaxTimeout {
		return store.Sandbox{}, fmt.Errorf("%w: --timeout must be between 1s and %s", errdefs.ErrInvalid, MaxTimeout)
	}
	if o.IdlePause < 0 || o.IdlePause > MaxIdlePause {
		return store.Sandbox{}, fmt.Errorf("%w: --idle-pause must be between 0 (never) and %s", errdefs.ErrInvalid, MaxIdlePause)
	}
	// Published host ports belong to the source (they would collide);
	// a sandbox from a snapshot publishes none.
	network := o.limits.withNetLimits(sn.Network)
	network.Ports = nil
	if len(o.Secrets) == 0 {
		// The snapshot holds no values: without the source's (a fork that
		// asked for them), the guest's placeholders reach no one.
		network.Secrets = nil
	}
	now := time.Now()
	sb := store.Sandbox{
		ID: statedir.NewID(), State: store.StateCreating, Image: sn.Image, ImageDigest: sn.ImageDigest,
		CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB, DiskMiB: sn.DiskMiB, TimeoutSec: int(o.Timeout / time.Second),
		CreatedAt: now, ExpiresAt: now.Add(o.Timeout), Metadata: o.Metadata, Tenant: o.Tenant, Env: sn.Env,
		Network: network, IdlePause: o.IdlePause, Source: source, ExecDefaults: sn.ExecDefaults,
	}
	if man.RootInState {
		sb.Runtime = man.Runtime // a restore needs the runtime that saved it (qemu's is the default)
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
	// The sandbox starts from the snapshot and its disk will be backed by
	// the snapshot's (the snapshot holds the rest of the chain). Refused
	// if the collector freed the snapshot meanwhile.
	ho := store.SandboxObj(sb.ID)
	err = m.Store.AddRefs(ctx, ho, store.RoleOrigin, store.SnapshotObj(sn.ID))
	if !man.RootInState {
		err = errors.Join(err, m.Store.AddRefs(ctx, ho, store.RoleDisk, store.SnapshotObj(sn.ID)))
	}
	if err != nil {
		lock.Close()
		_ = m.remove(context.WithoutCancel(ctx), sb.ID)
		return sb, err
	}
	if err := m.launch(ctx, sb, o.Secrets, "", lock); err != nil {
		return sb, err
	}
	return m.get(ctx, sb.ID)
}

// unlisted starts the names of the snapshots airlock keeps for itself:
// fork bases (template.ForkPrefix), saved build steps and templates
// (templates.go). ListSnapshots shows them only with all; callers cannot
// start from or remove them by name.
const unlisted = "_"

// ErrNeedsAdmin refuses a caller that is not an admin an action across
// tenants (PruneSnapshots). It is an ErrFailedPrecondition.
var ErrNeedsAdmin = fmt.Errorf("%w: this needs an admin", errdefs.ErrFailedPrecondition)

// snapshotTenant is whose snapshots c acts on: c's tenant, or for an
// admin the tenant asked for, if any.
func (c Caller) snapshotTenant(tenant string) string {
	if c.Admin && tenant != "" {
		return tenant
	}
	return c.Tenant
}

// ListSnapshots returns the snapshots of c's tenant (of tenant if c is an
// admin and tenant is not ""), or with all (admins only) every tenant's;
// fork bases are listed only with all.
func (m *Manager) ListSnapshots(ctx context.Context, c Caller, tenant string, all bool) ([]store.Snapshot, error) {
	all = all && c.Admin
	sns, err := m.Store.ListSnapshots(ctx, c.snapshotTenant(tenant), all)
	if err != nil {
		return nil, err
	}
	out := sns[:0]
	for _, sn := range sns {
		if all || !strings.HasPrefix(sn.Name, unlisted) {
			out = append(out, sn)
		}
	}
	return out, nil
}

// GetSnapshot returns snapshot name of c's tenant (of tenant for an
// admin who names one); ErrNotFound if there is none.
func (m *Manager) GetSnapshot(ctx context.Context, c Caller, tenant, name string) (store.Snapshot, error) {
	return m.Store.GetSnapshot(ctx, c.snapshotTenant(tenant), name)
}

// RemoveSnapshot deletes snapshot name of c's tenant (of tenant for an
// admin who names one) unless sandboxes or snapshots still start from it
// (ErrFailedPrecondition), and audits snapshot.delete.
func (m *Manager) RemoveSnapshot(ctx context.Context, c Caller, tenant, name string) error {
	tenant = c.snapshotTenant(tenant)
	if strings.HasPrefix(name, unlisted) {
		// Fork bases, build steps and templates' snapshots go with what
		// holds them (airlock template rm|prune).
		return fmt.Errorf("%w: snapshot %q is airlock's own (a fork's base, a template's or a build step's): remove the template, or prune", errdefs.ErrFailedPrecondition, name)
	}
	sn, err := m.Store.GetSnapshot(ctx, tenant, name)
	if err != nil {
		return err
	}
	if err := m.removeSnapshot(ctx, tenant, name); err != nil {
		return err
	}
	m.audit(ctx, c, sn.SandboxID, "snapshot.delete", map[string]any{"name": sn.Name, "snapshot_id": sn.ID, "size_bytes": sn.Size})
	return nil
}

// removeSnapshot deletes a snapshot unless sandboxes or snapshots still
// hold it (their disks are backed by its disk, or they start from it);
// then fork bases only it held go too.
func (m *Manager) removeSnapshot(ctx context.Context, tenant, name string) error {
	sn, err := m.Store.DeleteSnapshot(ctx, tenant, name)
	if err != nil {
		return err
	}
	err = errors.Join(template.RemoveSnapshot(m.L, sn.ID), os.RemoveAll(m.L.SnapshotDir(sn.ID)))
	if _, _, cerr := m.collect(ctx); cerr != nil {
		m.log().Warn("collect after snapshot rm", "err", cerr)
	}
	return err
}

// PruneSnapshots removes the unlisted snapshots forks started from once no
// sandbox uses them any more, and files of snapshots with no catalog row,
// of every tenant: admins only (ErrNeedsAdmin). It returns the bytes freed
// and audits snapshot.prune.
func (m *Manager) PruneSnapshots(ctx context.Context, c Caller) (int64, error) {
	if !c.Admin {
		return 0, ErrNeedsAdmin
	}
	freed, err := m.pruneSnapshots(ctx)
	if err != nil {
		return freed, err
	}
	m.audit(ctx, c, "", "snapshot.prune", map[string]any{"freed_bytes": freed})
	return freed, nil
}

func (m *Manager) pruneSnapshots(ctx context.Context) (int64, error) {
	freed, _, err := m.collect(ctx)
	errs := []error{err}
	all, err := m.Store.ListSnapshots(ctx, "", true)
	if err != nil {
		return freed, errors.Join(append(errs, err)...)
	}
	known := map[string]bool{}
	for _, sn := range all {
		known[sn.ID] = true
	}
	dirs, _ := os.ReadDir(m.L.SnapshotsDir())
	for _, d := range dirs {
		if known[d.Name()] {
			continue
		}
		if holders, err := m.Store.Holders(ctx, store.SnapshotObj(d.Name())); err != nil || len(holders) > 0 {
			errs = append(errs, err)
			continue
		}
		p := m.L.SnapshotDir(d.Name())
		if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) < time.Minute {
			continue // being written
		}
		freed += statedir.DirUsage(p)
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, m.Store.DropHolder(ctx, store.SnapshotObj(d.Name())))
	}
	n, err := m.pruneAgents()
	return freed + n, errors.Join(append(errs, err)...)
}

// pruneAgents removes the copies of the guest agent gVisor sandboxes bind
// (the state dir's agents/, one per airlock build that started one) that
// no saved state names and no sandbox runs, staged over an hour ago.
func (m *Manager) pruneAgents() (int64, error) {
	var states, runs []string
	sbs, _ := os.ReadDir(m.L.Sandboxes())
	for _, d := range sbs {
		states = append(states, filepath.Join(m.L.PauseDir(d.Name()), statedir.PauseStateDir))
		runs = append(runs, m.L.RunDir(d.Name()))
	}
	snaps, _ := os.ReadDir(m.L.SnapshotsDir())
	for _, d := range snaps {
		states = append(states, filepath.Join(m.L.SnapshotDir(d.Name()), statedir.PauseStateDir))
	}
	return gvisor.PruneAgents(m.L.Agents(), gvisor.AgentsInUse(states, runs), time.Hour)
}

// DiskUsage is the bytes a sandbox's files take on the host (its disk
// overlay, paused state, logs), counting allocated blocks.
func (m *Manager) DiskUsage(id string) int64 { return statedir.DirUsage(m.L.Dir(id)) }

// snapshotCount refuses a new named snapshot of tenant past c's
// max_snapshots (the local user has no quota).
func (m *Manager) snapshotCount(ctx context.Context, c Caller, tenant string) error {
	if c.Tenant == "" {
		return nil
	}
	snaps, err := m.Store.ListSnapshots(ctx, tenant, false)
	if err != nil {
		return err
	}
	n := 0
	for _, sn := range snaps {
		if sn.Name != "" {
			n++
		}
	}
	if lim := c.Limits.Or(DefaultLimits).MaxSnapshots; n+1 > lim {
		return &QuotaError{Quota: "max_snapshots", Used: n, Need: 1, Max: lim, What: "this snapshot"}
	}
	return nil
}
