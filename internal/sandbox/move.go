package sandbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/bundle"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/qemu"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Moving a paused sandbox to another node of a cluster (package bundle).
// Export pauses a sandbox and writes its bundle to the node's bundle
// store (Manager.Bundles); Import, on another node, reads it back,
// checks it was paused with what this node has (architecture, runtime,
// guest kernel and initramfs, image), and records the sandbox here,
// paused: the next call resumes it as after any pause.
//
// A sandbox whose pause would leave something behind does not move:
// volumes and host directories (their data is not in the bundle) and
// secret values (sealed to their node's key, and never written anywhere
// else). A gVisor sandbox's bundle has no disk: its checkpoint holds the
// writes to its root.

// bundleVersion is bundleDoc's format.
const bundleVersion = 1

// bundleDoc is a bundle's bundle.json.
type bundleDoc struct {
	Version int           `json:"version"`
	Sandbox store.Sandbox `json:"sandbox"`
	Arch    string        `json:"arch"`
	// KernelSHA256 and InitrdSHA256 are the digests of the guest kernel
	// and initramfs it was paused with.
	KernelSHA256 string `json:"kernel_sha256"`
	InitrdSHA256 string `json:"initrd_sha256"`
}

// Files of a bundle, and how large each may be. state.bin is bounded by
// the bundle's size, which the store checks.
const (
	bundleDocFile = "bundle.json"
	bundleDisk    = "disk.qcow2"
)

var bundleLimits = bundle.Limits{
	bundleDocFile:                         1 << 20,
	statedir.PauseManifestFile:            64 << 10,
	statedir.PausedExecsFile:              16 << 20,
	statedir.PauseStateDir + "/meta.json": 1 << 20,
	statedir.PauseStateDir + "/state.bin": 1 << 40,
	bundleDisk:                            1 << 42,
	// runsc's checkpoint (gVisor).
	statedir.PauseStateDir + "/checkpoint.img":           1 << 32,
	statedir.PauseStateDir + "/pages_meta.img":           1 << 32,
	statedir.PauseStateDir + "/pages.img":                1 << 40,
	statedir.PauseStateDir + "/" + gvisor.AgentStateFile: 1 << 10,
}

// Exported is what an Export did.
type Exported struct {
	Pause PauseResult
	// Bundle is the bundle written; nil if the sandbox cannot move
	// (Unmovable says why) or this node has no bundle store.
	Bundle    *bundle.Ref
	Unmovable string
}

// Movable says why sb cannot move to another node ("" if it can).
func Movable(sb store.Sandbox) string {
	switch {
	case sb.Runtime != "" && sb.Runtime != "qemu" && sb.Runtime != "gvisor":
		return "only QEMU and gVisor sandboxes move between nodes"
	case len(sb.Mounts) > 0:
		return "its volumes and host directories are not part of its saved state"
	case len(sb.Network.Secrets) > 0:
		return "its secret values are sealed to its node"
	}
	return ""
}

// Export pauses c's sandbox id (as Pause does, force alike) and, if it can
// move and this node has a bundle store, writes its bundle there. Audited
// as sandbox.pause and sandbox.export.
func (m *Manager) Export(ctx context.Context, c Caller, id string, force bool) (Exported, error) {
	sb, err := m.lookup(ctx, c, id)
	if err != nil {
		return Exported{}, err
	}
	var out Exported
	if out.Pause, err = m.Pause(ctx, c, id, force); err != nil {
		return out, err
	}
	out.Bundle, out.Unmovable, err = m.bundlePaused(ctx, c, sb, "")
	return out, err
}

// bundlePaused writes paused sandbox sb's bundle, if it can move and this
// node has a bundle store, and keeps its ref (bundle.ref), holding its
// shim lock meanwhile so that a resume waits for it. It answers a nil ref
// and why when the sandbox cannot move or was resumed meanwhile. Audited
// as sandbox.export (with reason, if given).
func (m *Manager) bundlePaused(ctx context.Context, c Caller, sb store.Sandbox, reason string) (*bundle.Ref, string, error) {
	if why := Movable(sb); why != "" || m.Bundles == nil {
		return nil, why, nil
	}
	id := sb.ID
	lock, err := m.takeShimLock(id)
	if err != nil {
		return nil, "it was resumed while its bundle was being written", nil
	}
	defer lock.Close()
	if sb, err = m.get(ctx, id); err != nil {
		return nil, "", err
	}
	if sb.State != store.StatePaused {
		return nil, "it was resumed while its bundle was being written", nil
	}
	if err := m.CheckSpace(ctx, "this sandbox's disk", statedir.DirUsage(m.L.RootDisk(id))+statedir.DirUsage(m.L.PauseDir(id))); err != nil {
		return nil, "", err
	}
	t0 := time.Now()
	ref, err := m.writeBundle(ctx, sb)
	if err != nil {
		return nil, "", fmt.Errorf("export sandbox %s: %w", id, err)
	}
	if err := m.keepBundleRef(id, ref); err != nil {
		return nil, "", err
	}
	d := map[string]any{"digest": ref.Digest, "bytes": ref.Bytes, "store": m.Bundles.String(), "duration_ms": time.Since(t0).Milliseconds()}
	if reason != "" {
		d["reason"] = reason
	}
	m.audit(ctx, c, id, "sandbox.export", d)
	return &ref, "", nil
}

// SweepEvery is how often SweepBundles looks for paused sandboxes without
// a bundle.
const SweepEvery = 15 * time.Second

// SweepBundles writes, every SweepEvery until ctx ends, the bundles of
// this node's paused sandboxes that can move and have none: those their
// shim paused after an idle period, which no export wrote. The control
// tier reads them with Bundled, so that such a sandbox resumes on another
// node too if this one is lost.
func (m *Manager) SweepBundles(ctx context.Context) {
	if m.Bundles == nil {
		return
	}
	tick := time.NewTicker(SweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sbs, err := m.Store.ListSandboxes(ctx)
		if err != nil {
			continue
		}
		for _, sb := range sbs {
			if ctx.Err() != nil {
				return
			}
			if sb.State != store.StatePaused || Movable(sb) != "" || m.hasBundleRef(sb.ID) {
				continue
			}
			c := Caller{Tenant: sb.Tenant, Admin: true, Via: "node"}
			if _, _, err := m.bundlePaused(ctx, c, sb, "paused without one (an idle pause)"); err != nil && ctx.Err() == nil {
				m.log().Warn("bundles: a paused sandbox's bundle", "sandbox_id", sb.ID, "err", err)
			}
		}
	}
}

func (m *Manager) hasBundleRef(id string) bool {
	_, err := os.Stat(filepath.Join(m.L.Dir(id), bundleRefFile))
	return err == nil
}

// Bundled returns the bundles of this node's paused sandboxes (from each
// one's bundle.ref), for the control tier.
func (m *Manager) Bundled(ctx context.Context, c Caller) ([]bundle.Ref, error) {
	if !c.Admin {
		return nil, fmt.Errorf("%w: only the control tier lists bundles", errdefs.ErrPermissionDenied)
	}
	sbs, err := m.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := []bundle.Ref{}
	for _, sb := range sbs {
		if sb.State != store.StatePaused {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.L.Dir(sb.ID), bundleRefFile))
		var ref bundle.Ref
		if err == nil && json.Unmarshal(b, &ref) == nil && ref.Sandbox == sb.ID {
			out = append(out, ref)
		}
	}
	return out, nil
}

// writeBundle writes paused sb's bundle to m.Bundles.
func (m *Manager) writeBundle(ctx context.Context, sb store.Sandbox) (bundle.Ref, error) {
	pause := m.L.PauseDir(sb.ID)
	var man statedir.PauseManifest
	b, err := os.ReadFile(filepath.Join(pause, statedir.PauseManifestFile))
	if err != nil {
		return bundle.Ref{}, err
	}
	if err := json.Unmarshal(b, &man); err != nil {
		return bundle.Ref{}, fmt.Errorf("pause manifest: %w", err)
	}
	doc := bundleDoc{Version: bundleVersion, Sandbox: sb, Arch: goruntime.GOARCH}
	if doc.KernelSHA256, err = m.fileDigest(man.Kernel); err != nil {
		return bundle.Ref{}, err
	}
	if doc.InitrdSHA256, err = m.fileDigest(man.Initrd); err != nil {
		return bundle.Ref{}, err
	}
	work, err := os.MkdirTemp(m.L.Dir(sb.ID), "export-")
	if err != nil {
		return bundle.Ref{}, err
	}
	defer os.RemoveAll(work)
	disk := ""
	if !man.RootInState {
		// The disk, flattened onto its image: the template's and
		// snapshots' layers it is backed by are this node's.
		disk = filepath.Join(work, bundleDisk)
		if err := copyFile(m.L.RootDisk(sb.ID), disk); err != nil {
			return bundle.Ref{}, err
		}
		if err := qemuImg(ctx, "rebase", "-f", "qcow2", "-b", m.L.ImagePath(sb.ImageDigest), "-F", "raw", disk); err != nil {
			return bundle.Ref{}, err
		}
	}
	docPath := filepath.Join(work, bundleDocFile)
	db, _ := json.Marshal(doc)
	if err := os.WriteFile(docPath, db, 0o600); err != nil {
		return bundle.Ref{}, err
	}
	files := []bundle.File{{Name: bundleDocFile, Path: docPath}, {Name: statedir.PauseManifestFile, Path: filepath.Join(pause, statedir.PauseManifestFile)}}
	if _, err := os.Stat(filepath.Join(pause, statedir.PausedExecsFile)); err == nil {
		files = append(files, bundle.File{Name: statedir.PausedExecsFile, Path: filepath.Join(pause, statedir.PausedExecsFile)})
	}
	ents, err := os.ReadDir(filepath.Join(pause, statedir.PauseStateDir))
	if err != nil {
		return bundle.Ref{}, err
	}
	for _, e := range ents {
		name := statedir.PauseStateDir + "/" + e.Name()
		if _, ok := bundleLimits[name]; !ok {
			return bundle.Ref{}, fmt.Errorf("%w: its saved state has a file bundles do not carry (%s)", errdefs.ErrUnsupported, e.Name())
		}
		files = append(files, bundle.File{Name: name, Path: filepath.Join(pause, statedir.PauseStateDir, e.Name())})
	}
	if disk != "" {
		files = append(files, bundle.File{Name: bundleDisk, Path: disk})
	}
	return m.Bundles.Put(ctx, sb.ID, func(w io.Writer) error { return bundle.Write(w, files) })
}

// Import reads the bundle ref from this node's bundle store and records
// its sandbox here, paused, as c's (the bundle's tenant must be c's). It
// refuses, saying why, a bundle paused on another architecture or
// runtime, or with a guest kernel, initramfs or image this node lacks.
// Audited as sandbox.import.
func (m *Manager) Import(ctx context.Context, c Caller, ref bundle.Ref) (store.Sandbox, error) {
	if err := ref.Validate(); err != nil {
		return store.Sandbox{}, err
	}
	if m.Bundles == nil {
		return store.Sandbox{}, fmt.Errorf("%w: this node has no bundle store (airlock node --bundle-dir)", errdefs.ErrFailedPrecondition)
	}
	if _, err := m.Store.GetSandbox(ctx, ref.Sandbox); err == nil {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s is already on this node", errdefs.ErrConflict, ref.Sandbox)
	}
	if err := m.CheckSpace(ctx, "this sandbox's bundle", 2*ref.Bytes); err != nil {
		return store.Sandbox{}, err
	}
	t0 := time.Now()
	work := filepath.Join(m.L.Root, "imports")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return store.Sandbox{}, err
	}
	tmp, err := os.MkdirTemp(work, ref.Sandbox+"-")
	if err != nil {
		return store.Sandbox{}, err
	}
	defer os.RemoveAll(tmp)
	rc, err := m.Bundles.Open(ctx, ref)
	if err != nil {
		return store.Sandbox{}, err
	}
	_, err = bundle.Extract(rc, tmp, bundleLimits)
	rc.Close()
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("import sandbox %s: %w", ref.Sandbox, err)
	}
	sb, man, err := m.checkBundle(ctx, c, ref, tmp)
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s cannot resume on this node: %v", errdefs.ErrFailedPrecondition, ref.Sandbox, err)
	}
	disk := filepath.Join(tmp, bundleDisk)
	state := filepath.Join(tmp, statedir.PauseStateDir)
	if man.RootInState {
		// gVisor's checkpoint names no host path: it is resumed as it is.
		if _, err := os.Stat(disk); err == nil {
			return store.Sandbox{}, fmt.Errorf("%w: sandbox %s's bundle has a disk its runtime does not use", errdefs.ErrFailedPrecondition, ref.Sandbox)
		}
	} else {
		if err := qemuImg(ctx, "rebase", "-u", "-f", "qcow2", "-b", m.L.ImagePath(sb.ImageDigest), "-F", "raw", disk); err != nil {
			return store.Sandbox{}, err
		}
		// The runtime's saved state names the kernel and initramfs by
		// path: this node's, and the manifest's digest of the state
		// follows.
		if err := qemu.Relocate(state, man.Kernel, man.Initrd); err != nil {
			return store.Sandbox{}, fmt.Errorf("%w: sandbox %s cannot resume on this node: %v", errdefs.ErrFailedPrecondition, ref.Sandbox, err)
		}
		if err := os.Chmod(disk, 0o644); err != nil {
			return store.Sandbox{}, err
		}
	}
	if man.StateSHA256, man.StateBytes, err = statedir.HashDir(state); err != nil {
		return store.Sandbox{}, err
	}
	mb, _ := json.MarshalIndent(man, "", "  ")
	if err := errors.Join(os.Remove(filepath.Join(tmp, statedir.PauseManifestFile)),
		os.WriteFile(filepath.Join(tmp, statedir.PauseManifestFile), mb, 0o400)); err != nil {
		return store.Sandbox{}, err
	}
	// Into place: sandboxes/<id>/{root.qcow2, paused/{manifest.json, execs.json, state/}}.
	dir := m.L.Dir(sb.ID)
	if err := os.MkdirAll(m.L.Sandboxes(), 0o700); err != nil {
		return store.Sandbox{}, err
	}
	if err := os.Mkdir(dir, 0o700); errors.Is(err, os.ErrExist) {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox %s has files on this node already", errdefs.ErrConflict, sb.ID)
	} else if err != nil {
		return store.Sandbox{}, err
	}
	placed := func() error {
		if !man.RootInState {
			if err := os.Rename(disk, m.L.RootDisk(sb.ID)); err != nil {
				return err
			}
		}
		pause := m.L.PauseDir(sb.ID)
		if err := os.Mkdir(pause, 0o700); err != nil {
			return err
		}
		for _, name := range []string{statedir.PauseManifestFile, statedir.PausedExecsFile, statedir.PauseStateDir} {
			if err := os.Rename(filepath.Join(tmp, name), filepath.Join(pause, name)); err != nil && !(name == statedir.PausedExecsFile && errors.Is(err, os.ErrNotExist)) {
				return err
			}
		}
		// Its bundle is this node's copy's too: dropped when it resumes.
		if err := m.keepBundleRef(sb.ID, ref); err != nil {
			return err
		}
		sb.State, sb.Reason = store.StatePaused, ""
		return m.Store.CreateSandbox(ctx, sb)
	}()
	if placed != nil {
		_ = os.RemoveAll(dir)
		return store.Sandbox{}, fmt.Errorf("import sandbox %s: %w", sb.ID, placed)
	}
	m.audit(ctx, c, sb.ID, "sandbox.import", map[string]any{"digest": ref.Digest, "bytes": ref.Bytes, "duration_ms": time.Since(t0).Milliseconds()})
	return m.get(ctx, sb.ID)
}

// checkBundle reads the bundle extracted in dir and checks it against
// ref, c and this node; it returns the sandbox's row and its pause
// manifest with this node's kernel and initramfs paths.
func (m *Manager) checkBundle(ctx context.Context, c Caller, ref bundle.Ref, dir string) (store.Sandbox, statedir.PauseManifest, error) {
	var doc bundleDoc
	var man statedir.PauseManifest
	b, err := os.ReadFile(filepath.Join(dir, bundleDocFile))
	if err != nil {
		return doc.Sandbox, man, errors.New("the bundle has no " + bundleDocFile)
	}
	if err := json.Unmarshal(b, &doc); err != nil || doc.Version != bundleVersion {
		return doc.Sandbox, man, fmt.Errorf("%s is not a version %d bundle document", bundleDocFile, bundleVersion)
	}
	if b, err = os.ReadFile(filepath.Join(dir, statedir.PauseManifestFile)); err != nil || json.Unmarshal(b, &man) != nil {
		return doc.Sandbox, man, errors.New("the bundle's pause manifest is missing or unreadable")
	}
	sb := doc.Sandbox
	unmovable := Movable(sb)
	switch {
	case sb.ID != ref.Sandbox:
		return sb, man, fmt.Errorf("the bundle holds sandbox %q", sb.ID)
	case !c.Admin && sb.Tenant != c.Tenant:
		return sb, man, errors.New("the bundle is another tenant's")
	case doc.Arch != goruntime.GOARCH:
		return sb, man, fmt.Errorf("it was paused on %s; this node is %s", doc.Arch, goruntime.GOARCH)
	case unmovable != "":
		return sb, man, errors.New(unmovable)
	case cmp.Or(man.Runtime, "qemu") != cmp.Or(sb.Runtime, "qemu") || man.RootInState != (sb.Runtime == "gvisor"):
		return sb, man, fmt.Errorf("its saved state (%s) is not its runtime's (%s)", cmp.Or(man.Runtime, "qemu"), cmp.Or(sb.Runtime, "qemu"))
	}
	if m.Runtime != nil {
		if rt, err := m.Runtime(ctx); err == nil && rt != cmp.Or(sb.Runtime, "qemu") {
			return sb, man, fmt.Errorf("this node runs %s, and the sandbox needs %s", rt, cmp.Or(sb.Runtime, "qemu"))
		}
	}
	if _, err := os.Stat(m.L.ImagePath(sb.ImageDigest)); err != nil {
		return sb, man, fmt.Errorf("its image %s (%s) is not on this node (airlock image pull it here)", sb.Image, sb.ImageDigest)
	}
	bc, err := m.L.LoadBootConfig()
	if err != nil {
		return sb, man, err
	}
	if sum, err := m.fileDigest(bc.Kernel); err != nil || sum != doc.KernelSHA256 {
		return sb, man, fmt.Errorf("it was paused with guest kernel sha256:%.12s; this node's (%s) is sha256:%.12s", doc.KernelSHA256, bc.KernelRelease, sum)
	}
	if sum, err := m.fileDigest(bc.Initrd); err != nil || sum != doc.InitrdSHA256 {
		return sb, man, fmt.Errorf("it was paused with initramfs sha256:%.12s; this node's is sha256:%.12s (the nodes must run the same airlock version)", doc.InitrdSHA256, sum)
	}
	man.Kernel, man.Initrd = bc.Kernel, bc.Initrd
	return sb, man, nil
}

// fileDigest is the sha256 of a guest kernel's or initramfs' file (tens
// of MiB, read-only once written), hashed once per file version: every
// export and import asks for both.
func (m *Manager) fileDigest(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	type version struct {
		size  int64
		mtime time.Time
	}
	v := version{fi.Size(), fi.ModTime()}
	type cached struct {
		v   version
		sum string
	}
	if c, ok := m.digests.Load(path); ok && c.(cached).v == v {
		return c.(cached).sum, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	m.digests.Store(path, cached{v, sum})
	return sum, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

func qemuImg(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// bundleRefFile, in a sandbox's directory, names the bundle that holds
// what the sandbox is while it stays paused: the one this node wrote, or
// imported it from.
const bundleRefFile = "bundle.ref"

func (m *Manager) keepBundleRef(id string, ref bundle.Ref) error {
	b, _ := json.Marshal(ref)
	return os.WriteFile(filepath.Join(m.L.Dir(id), bundleRefFile), b, 0o600)
}

// dropBundle removes sandbox id's bundle (bundleRefFile's) from the
// bundle store: before it resumes, after which the bundle is stale, and
// when it is removed. Only that bundle goes: another node may have
// written a newer one of the same sandbox (this node's copy was then left
// behind when the sandbox moved).
func (m *Manager) dropBundle(ctx context.Context, id string) error {
	path := filepath.Join(m.L.Dir(id), bundleRefFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var ref bundle.Ref
	if json.Unmarshal(b, &ref) == nil && ref.Sandbox == id && m.Bundles != nil {
		if err := m.Bundles.Remove(ctx, ref); err != nil {
			return err
		}
	}
	return os.Remove(path)
}

// Forget removes this node's copy of c's sandbox id, which lives on
// another node now (it moved while this node was lost), and leaves its
// bundle in the bundle store: that bundle may be what the other node's
// copy resumes from. Audited as sandbox.forget.
func (m *Manager) Forget(ctx context.Context, c Caller, id string) error {
	if _, err := m.lookup(ctx, c, id); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(m.L.Dir(id), bundleRefFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := m.remove(ctx, id); err != nil {
		return err
	}
	m.audit(ctx, c, id, "sandbox.forget", nil)
	return nil
}

// DropBundle deletes the bundle ref from the bundle store, for the
// control tier (an admin caller) when the sandbox it holds was deleted
// while its node was lost: no node has it, so nothing else would.
func (m *Manager) DropBundle(ctx context.Context, c Caller, ref bundle.Ref) error {
	switch {
	case !c.Admin:
		return fmt.Errorf("%w: only the control tier drops bundles", errdefs.ErrPermissionDenied)
	case m.Bundles == nil:
		return fmt.Errorf("%w: this node has no bundle store (--bundle-dir)", errdefs.ErrFailedPrecondition)
	}
	if err := ref.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
	}
	if err := m.Bundles.Remove(ctx, ref); err != nil {
		return err
	}
	m.audit(ctx, c, ref.Sandbox, "bundle.drop", map[string]any{"digest": ref.Digest})
	return nil
}
