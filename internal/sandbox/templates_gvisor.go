package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/dockerfile"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// Templates on gVisor. A runsc sandbox cannot be saved with its memory,
// so a gVisor template is an image, and its start command and ready check
// run when each of its sandboxes is created.
//
// Each step that changes the filesystem runs in a sandbox of its own whose
// root is a host overlay mount, written in place (runtime.Spec.RootInPlace):
// the lower layers are the base image's tree and the earlier steps'
// results, the upper layer on a filesystem of the build's disk size (a
// sparse file, loop-mounted: the step's cap on what it writes). When the step ends its sandbox is removed and
// the upper layer, checked (no device nodes but overlayfs whiteouts), is
// copied into the tenant's layer cache under the step's key. The template's
// image is the merged tree of every layer, made an ext4 blob
// (image.Store.CommitTree) that no image name refers to: the template
// keeps its digest. A rebuild starts after the last step whose layer (and
// every earlier one) is cached; an unchanged Dockerfile reuses the image.
const (
	layersDir    = "template-layers"
	buildWorkDir = "template-work"
	// maxLayerSteps bounds the steps that change files in a gVisor build:
	// each is one lower layer of the overlay, and the mount's options
	// (one page) must name them all.
	maxLayerSteps = 40
)

// tenantKey names tenant's directories (tenant names are not path-safe
// by contract).
func tenantKey(tenant string) string {
	return keyName("tenant:" + tenant)[:16]
}

func (m *Manager) layerPath(tenant, key string) string {
	return filepath.Join(m.L.Root, layersDir, tenantKey(tenant), keyName(key))
}

// imageRefPath records the digest of the image built for a template key.
func (m *Manager) imageRefPath(tenant, tplKey string) string {
	return filepath.Join(m.L.Root, layersDir, tenantKey(tenant), tplKey+".image")
}

func (m *Manager) images() *image.Store { return image.NewStore(m.L.Root, nil, m.log()) }

// gvisorBase resolves a build's base ("image:NAME", or "digest:DIGEST":
// a gVisor template's image or a pulled one, blobs without a name) to its
// image.
func (m *Manager) gvisorBase(ctx context.Context, base string) (store.ImageRecord, error) {
	if d, ok := strings.CutPrefix(base, "digest:"); ok {
		img := image.Image{Digest: d}
		fi, err := os.Stat(m.images().Path(img))
		if err != nil {
			return store.ImageRecord{}, fmt.Errorf("the FROM image: %w", err)
		}
		return store.ImageRecord{Name: "from-" + strings.TrimPrefix(d, "sha256:")[:12], Digest: d, Size: fi.Size()}, nil
	}
	return m.Store.GetImage(ctx, strings.TrimPrefix(base, "image:"))
}

// buildGVisor builds o's template on the gvisor runtime (see above).
func (m *Manager) buildGVisor(ctx context.Context, c Caller, o BuildOptions, plan *dockerfile.Plan, bctx *dockerfile.Context, base string, cfg TemplateConfig, lastKey string, progress func(BuildEvent)) (string, int, error) {
	changing := 0
	for _, s := range plan.Steps {
		if s.Changes {
			changing++
		}
	}
	if changing > maxLayerSteps {
		return "", 0, &BuildError{err: fmt.Errorf("%w: %d steps change files; a template built on gvisor can have at most %d (join RUN steps with &&)", errdefs.ErrInvalid, changing, maxLayerSteps)}
	}
	baseImg, err := m.gvisorBase(ctx, base)
	if err != nil {
		return "", 0, &BuildError{Line: plan.FromLine, err: atLine(plan.FromLine, err)}
	}
	if o.DiskMiB == 0 {
		o.DiskMiB = template.DiskMiB(baseImg.Size)
	}
	tplKey := keyName(lastKey, "start", cfg.Start, "ready", cfg.Ready, "env", strings.Join(plan.Config.Env, "\x00"), "runtime", "gvisor")
	refPath := m.imageRefPath(c.Tenant, tplKey)

	// The last step whose layer, and every earlier step's, is cached.
	from := -1
	if !o.NoCache {
		for i, s := range plan.Steps {
			if s.Changes && !isDir(m.layerPath(c.Tenant, s.Key)) {
				break
			}
			from = i
		}
	}
	allCached := from == len(plan.Steps)-1
	// Steps that only set configuration after the last cached layer are
	// applied again (reported as such), as on qemu.
	for from >= 0 && !plan.Steps[from].Changes {
		from--
	}
	if allCached && !o.NoCache {
		if d, err := os.ReadFile(refPath); err == nil {
			if _, err := os.Stat(m.images().Path(image.Image{Digest: string(d)})); err == nil {
				for i, s := range plan.Steps {
					progress(BuildEvent{Kind: "cached", Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text})
				}
				return string(d), len(plan.Steps), nil
			}
		}
	}
	baseDir, err := m.images().Dir(ctx, image.Image{Name: baseImg.Name, Digest: baseImg.Digest}, gvisor.PrepareRoot)
	if err != nil {
		return "", 0, fmt.Errorf("the base image's tree: %w", err)
	}
	var layers []string
	for i, s := range plan.Steps[:from+1] {
		progress(BuildEvent{Kind: "cached", Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text})
		if s.Changes {
			layers = append(layers, m.layerPath(c.Tenant, s.Key))
		}
	}
	for i := from + 1; i < len(plan.Steps); i++ {
		s := plan.Steps[i]
		ev := BuildEvent{Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text}
		if !s.Changes {
			ev.Kind = "config"
			progress(ev)
			continue
		}
		t0 := time.Now()
		ev.Kind = "step"
		progress(ev)
		err := m.gvisorStep(ctx, c, o, baseImg, append([]string{baseDir}, layers...), m.layerPath(c.Tenant, s.Key), func(id string) error {
			return m.runStep(ctx, c, id, bctx, plan, i, ev, progress)
		})
		if err != nil {
			if _, ok := errors.AsType[*BuildError](err); ok {
				return "", 0, err
			}
			return "", 0, &BuildError{Step: i + 1, Steps: len(plan.Steps), Line: s.Line, Text: s.Text, err: atLine(s.Line, err)}
		}
		layers = append(layers, m.layerPath(c.Tenant, s.Key))
		ev.Kind, ev.ElapsedMS = "done", time.Since(t0).Milliseconds()
		progress(ev)
	}
	lower := append([]string{baseDir}, layers...)
	if cfg.Start != "" {
		// The start command and ready check run at every create; the
		// build proves once that they work.
		progress(BuildEvent{Kind: "status", Message: "trying the start command and ready check (they run when each sandbox is created)"})
		err := m.gvisorStep(ctx, c, o, baseImg, lower, "", func(id string) error {
			return m.startApp(ctx, c, id, cfg, o.ReadyTimeout, progress)
		})
		if err != nil {
			return "", 0, &BuildError{err: err}
		}
	}
	digest := baseImg.Digest
	if len(layers) > 0 {
		progress(BuildEvent{Kind: "status", Message: "making the template's image"})
		if digest, err = m.commitLayers(ctx, lower); err != nil {
			return "", 0, fmt.Errorf("make the template's image: %w", err)
		}
	}
	if err := os.WriteFile(refPath+".tmp", []byte(digest), 0o600); err == nil {
		_ = os.Rename(refPath+".tmp", refPath)
	}
	return digest, from + 1, nil
}

func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// buildRoot is one step's root: a filesystem of its own for the step's
// upper layer and overlayfs's work dir, and the overlay mount on the lower
// layers.
type buildRoot struct {
	dir, tmp, upper, merged string
	mounted                 []string // to unmount, last first
	lock                    *os.File // dir/lock, flocked while in use (cleanBuildWork)
}

// newWorkDir makes a work dir of a gvisor build (prefix "step-" or
// "image-") with its lock taken.
func (m *Manager) newWorkDir(prefix string) (*buildRoot, error) {
	parent := filepath.Join(m.L.Root, buildWorkDir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, err
	}
	m.cleanBuildWork(parent)
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		return nil, err
	}
	r := &buildRoot{dir: dir, merged: filepath.Join(dir, "root")}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("template build work dir: %w", err)
	}
	r.lock = f
	if err := os.Mkdir(r.merged, 0o755); err != nil {
		r.close(m)
		return nil, err
	}
	return r, nil
}

// cleanBuildWork removes the work dirs of builds that ended without
// cleaning up (a crash: their mounts and files stay), those whose lock
// no process holds; it unmounts what is mounted under them first.
func (m *Manager) cleanBuildWork(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		dir := filepath.Join(parent, e.Name())
		f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			if err := statedir.RemoveAllNoMounts(dir); err != nil {
				m.log().Warn("template build: remove a stale work dir", "err", err)
			}
		}
		f.Close()
	}
}

// gvisorStep runs step in a sandbox of c's tenant whose root is lower
// (bottom first) under a fresh upper layer, removes the sandbox, and
// (save not "") saves the upper layer there.
func (m *Manager) gvisorStep(ctx context.Context, c Caller, o BuildOptions, baseImg store.ImageRecord, lower []string, save string, step func(id string) error) error {
	root, err := m.mountBuildRoot(lower, int64(o.DiskMiB)<<20)
	if err != nil {
		return err
	}
	defer root.close(m)
	sb, err := m.Create(ctx, c, CreateOptions{Image: baseImg.Name, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskMiB: o.DiskMiB,
		Timeout: time.Hour, Metadata: map[string]string{"airlock.template-build": o.Name},
		imageDigest: baseImg.Digest, imageSize: baseImg.Size, buildRoot: root.merged})
	if err != nil {
		return err
	}
	stepErr := step(sb.ID)
	// Powered off before the layer is read: what the guest wrote is on
	// the host once runsc has ended.
	if err := m.Remove(context.WithoutCancel(ctx), c, sb.ID); err != nil {
		return errors.Join(stepErr, fmt.Errorf("remove the step's sandbox: %w", err))
	}
	if stepErr != nil || save == "" {
		return stepErr
	}
	if err := unmount(root.merged); err != nil {
		return err
	}
	root.mounted = root.mounted[:1]
	return m.saveLayer(ctx, root.upper, save)
}

// mountBuildRoot mounts a new ext4 filesystem of size bytes and an overlay
// of lower (bottom first) under its upper dir, in a new work dir of the
// state dir.
func (m *Manager) mountBuildRoot(lower []string, size int64) (*buildRoot, error) {
	r, err := m.newWorkDir("step-")
	if err != nil {
		return nil, err
	}
	r.tmp = filepath.Join(r.dir, "t")
	r.upper = filepath.Join(r.tmp, "upper")
	ok := false
	defer func() {
		if !ok {
			r.close(m)
		}
	}()
	if err := os.Mkdir(r.tmp, 0o700); err != nil {
		return nil, err
	}
	// The upper layer's own filesystem, a sparse file of the build's disk
	// size: on disk (under the disk quota and the host's reserve), not in
	// memory, and the step cannot write more.
	fsFile := filepath.Join(r.dir, "upper.ext4")
	f, err := os.OpenFile(fsFile, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("the step's filesystem: %w", err)
	}
	for _, argv := range [][]string{
		{"mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "lazy_itable_init=1,root_owner=0:0", "-m", "0", fsFile},
		{"mount", "-t", "ext4", "-o", "loop,nosuid,nodev", fsFile, r.tmp},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("the step's filesystem: %s: %v: %s", argv[0], err, strings.TrimSpace(string(out)))
		}
		if argv[0] == "mount" {
			r.mounted = append(r.mounted, r.tmp)
		}
	}
	work := filepath.Join(r.tmp, "work")
	if err := os.Mkdir(r.upper, 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, err
	}
	opts, err := overlayOptions(lower, r.upper, work)
	if err != nil {
		return nil, err
	}
	if err := unix.Mount("overlay", r.merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return nil, fmt.Errorf("mount the step's root (overlay of %d layers): %w", len(lower), err)
	}
	r.mounted = append(r.mounted, r.merged)
	ok = true
	return r, nil
}

// close unmounts what r mounted and removes its work dir.
func (r *buildRoot) close(m *Manager) {
	for i := len(r.mounted) - 1; i >= 0; i-- {
		if err := unmount(r.mounted[i]); err != nil {
			m.log().Warn("template build: unmount", "path", r.mounted[i], "err", err)
		}
	}
	r.mounted = nil
	if err := statedir.RemoveAllNoMounts(r.dir); err != nil {
		m.log().Warn("template build: remove work dir", "err", err)
	}
	if r.lock != nil {
		r.lock.Close()
		r.lock = nil
	}
}

// unmount unmounts p, lazily if it is still busy.
func unmount(p string) error {
	err := unix.Unmount(p, 0)
	if err == nil || errors.Is(err, unix.EINVAL) {
		return nil
	}
	if derr := unix.Unmount(p, unix.MNT_DETACH); derr == nil {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", p, err)
}

// overlayOptions are the overlay mount's options for lower (bottom first)
// and, with upper set, a writable upper layer. Features that let what a
// layer holds point elsewhere (redirects, metacopy, the index) are off.
func overlayOptions(lower []string, upper, work string) (string, error) {
	for _, p := range append(slices.Clone(lower), upper, work) {
		if strings.ContainsAny(p, ",:\\\n") {
			return "", fmt.Errorf("%w: the state dir's path %q has a character overlay mounts cannot take (, : \\)", errdefs.ErrFailedPrecondition, p)
		}
	}
	top := slices.Clone(lower)
	slices.Reverse(top)
	opts := "lowerdir=" + strings.Join(top, ":")
	if upper != "" {
		opts += ",upperdir=" + upper + ",workdir=" + work
	}
	opts += ",redirect_dir=off,index=off,metacopy=off,xino=off"
	if len(opts) >= 4000 {
		return "", fmt.Errorf("%w: %d layers do not fit in an overlay mount's options (use a state dir with a shorter path, or fewer steps that change files)", errdefs.ErrInvalid, len(lower))
	}
	return opts, nil
}

// saveLayer checks a step's upper layer and copies it to final (the
// cache).
func (m *Manager) saveLayer(ctx context.Context, upper, final string) error {
	if err := checkLayer(upper); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return err
	}
	_ = os.Chmod(filepath.Join(m.L.Root, layersDir), 0o700)
	tmp := final + ".tmp-" + rand.Text()
	// cp -a keeps owners, modes, times, hard links, xattrs (overlayfs's
	// opaque directories) and the whiteouts (0/0 character devices).
	cmd := exec.CommandContext(ctx, "cp", "-a", "--", upper, tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("save the step's layer: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, final); err != nil {
		// Another build saved the same key first: same inputs, same layer.
		_ = os.RemoveAll(tmp)
		if !isDir(final) {
			return fmt.Errorf("save the step's layer: %w", err)
		}
	}
	return nil
}

// checkLayer refuses device nodes in a step's upper layer (the guest's
// writes): only overlayfs's whiteouts, 0/0 character devices, may be
// there.
func checkLayer(upper string) error {
	return filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeDevice == 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok && d.Type()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
			return nil
		}
		rel, _ := filepath.Rel(upper, p)
		return fmt.Errorf("%w: the step made a device node, /%s: a template cannot hold one", errdefs.ErrInvalid, rel)
	})
}

// commitLayers makes the merged tree of lower (bottom first) an image
// blob and returns its digest.
func (m *Manager) commitLayers(ctx context.Context, lower []string) (string, error) {
	r, err := m.newWorkDir("image-")
	if err != nil {
		return "", err
	}
	defer r.close(m)
	opts, err := overlayOptions(lower, "", "")
	if err != nil {
		return "", err
	}
	if err := unix.Mount("overlay", r.merged, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("mount the template's layers: %w", err)
	}
	r.mounted = []string{r.merged}
	img, err := m.images().CommitTree(ctx, r.merged, "template")
	if err != nil {
		return "", err
	}
	return img.Digest, nil
}

// createFromImageTemplate starts a sandbox of gvisor template t: a fresh
// sandbox of its image with its ENV as the default environment (under
// o.Env) and its WORKDIR and USER as exec defaults; its start command
// runs and its ready check passes before the sandbox is returned.
func (m *Manager) createFromImageTemplate(ctx context.Context, c Caller, t store.Template, o CreateOptions) (store.Sandbox, error) {
	rt, err := m.runtimeName(ctx)
	if err != nil {
		return store.Sandbox{}, err
	}
	if rt != "gvisor" {
		return store.Sandbox{}, fmt.Errorf("%w: template %q was built on gvisor and this server's runtime is %s: rebuild it here", errdefs.ErrFailedPrecondition, t.Name, rt)
	}
	fi, err := os.Stat(m.images().Path(image.Image{Digest: t.ImageDigest}))
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("template %q: its image: %w", t.Name, err)
	}
	cfg := viewTemplate(t).TemplateConfig
	env := envMap(cfg.Env)
	for k, v := range o.Env {
		env[k] = v
	}
	o.Env = env
	o.Image, o.imageDigest, o.imageSize = t.Name, t.ImageDigest, fi.Size()
	o.execDefaults = store.ExecDefaults{Cwd: cfg.WorkDir, User: cfg.User}
	sb, err := m.Create(ctx, c, o)
	if err != nil {
		return sb, err
	}
	if err := m.startApp(ctx, c, sb.ID, cfg, 0, func(BuildEvent) {}); err != nil {
		_ = m.Remove(context.WithoutCancel(ctx), c, sb.ID)
		return store.Sandbox{}, fmt.Errorf("template %q: %w", t.Name, err)
	}
	return sb, nil
}

// pruneLayers removes tenant's cached gVisor build layers and image
// records; it returns how many layers it removed.
func (m *Manager) pruneLayers(tenant string) (int, error) {
	dir := filepath.Join(m.L.Root, layersDir, tenantKey(tenant))
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if e.IsDir() && !strings.Contains(e.Name(), ".tmp-") {
			n++
		}
	}
	return n, os.RemoveAll(dir)
}
