package bootfiles

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Kernel flavors.
const (
	// FlavorCloud is Debian's cloud kernel (linux-image-cloud-amd64): small,
	// LZ4-compressed, no 9p. The default.
	FlavorCloud = "cloud"
	// FlavorGeneric is Debian's generic kernel (linux-image-amd64): larger,
	// XZ-compressed, has 9p.
	FlavorGeneric = "generic"
)

// ErrNotInstalled means no kernel of the requested flavor is installed in
// the state dir. The fix is `airlock setup` (or `make deps`). It also
// matches errdefs.ErrFailedPrecondition.
var ErrNotInstalled error = &categorized{"guest kernel not installed", errdefs.ErrFailedPrecondition}

// categorized is a sentinel error that also matches a category.
type categorized struct {
	msg string
	cat error
}

func (e *categorized) Error() string { return e.msg }
func (e *categorized) Unwrap() error { return e.cat }

// Kernel is an installed guest kernel.
type Kernel struct {
	// Flavor is FlavorCloud or FlavorGeneric.
	Flavor string `json:"flavor"`
	// Release is the kernel release, e.g. "6.1.0-56-cloud-amd64".
	Release string `json:"release"`
	// Package and Version name the Debian package it came from.
	Package string `json:"package"`
	Version string `json:"version"`
	// Vmlinux is the absolute path of the uncompressed x86-64 ELF kernel with
	// a PVH entry note (mode 0444).
	Vmlinux string `json:"-"`
	// ModulesDir is the absolute path of its lib/modules/<release> tree.
	ModulesDir string `json:"-"`
}

// metaPackage returns the Debian meta package that tracks the newest
// kernel of a flavor.
func metaPackage(flavor string) (string, error) {
	switch flavor {
	case "", FlavorCloud:
		return "linux-image-cloud-amd64", nil
	case FlavorGeneric:
		return "linux-image-amd64", nil
	}
	return "", fmt.Errorf("%w: unknown kernel flavor %q (want %q or %q)", errdefs.ErrInvalid, flavor, FlavorCloud, FlavorGeneric)
}

func normFlavor(flavor string) string {
	if flavor == "" {
		return FlavorCloud
	}
	return flavor
}

// Layout under stateDir.
const (
	kernelsDir   = "kernels"
	metaFile     = "kernel.json"
	vmlinuxFile  = "vmlinux"
	currentFile  = "current-" // + flavor: holds the release in use
	kernelsLock  = ".lock"
	tmpDirPrefix = ".tmp-"
)

func releaseDir(stateDir, release string) string {
	return filepath.Join(stateDir, kernelsDir, release)
}

// load reads an installed kernel's metadata and checks its files exist.
func load(stateDir, release string) (Kernel, error) {
	dir, err := filepath.Abs(releaseDir(stateDir, release))
	if err != nil {
		return Kernel{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return Kernel{}, err
	}
	var k Kernel
	if err := json.Unmarshal(b, &k); err != nil {
		return Kernel{}, fmt.Errorf("parse %s: %w", metaFile, err)
	}
	if k.Release != release {
		return Kernel{}, fmt.Errorf("%s names release %q, want %q", metaFile, k.Release, release)
	}
	k.Vmlinux = filepath.Join(dir, vmlinuxFile)
	k.ModulesDir = filepath.Join(dir, "lib", "modules", release)
	for _, p := range []string{k.Vmlinux, k.ModulesDir} {
		if _, err := os.Stat(p); err != nil {
			return Kernel{}, err
		}
	}
	return k, nil
}

// FindKernel returns the installed kernel of flavor ("" means cloud)
// without using the network or apt. If none is installed the error wraps
// ErrNotInstalled. Safe for concurrent use.
func FindKernel(stateDir, flavor string) (Kernel, error) {
	if _, err := metaPackage(flavor); err != nil {
		return Kernel{}, err
	}
	flavor = normFlavor(flavor)
	notInstalled := fmt.Errorf("%w: no %s kernel in %s; run `airlock setup` (or `make deps`)",
		ErrNotInstalled, flavor, filepath.Join(stateDir, kernelsDir))
	b, err := os.ReadFile(filepath.Join(stateDir, kernelsDir, currentFile+flavor))
	if errors.Is(err, fs.ErrNotExist) {
		return Kernel{}, notInstalled
	}
	if err != nil {
		return Kernel{}, fmt.Errorf("find kernel: %w", err)
	}
	release := strings.TrimSpace(string(b))
	if release == "" || strings.ContainsAny(release, "/\x00") || release == "." || release == ".." {
		return Kernel{}, fmt.Errorf("find kernel: bad release %q in %s%s", release, currentFile, flavor)
	}
	k, err := load(stateDir, release)
	if errors.Is(err, fs.ErrNotExist) {
		return Kernel{}, notInstalled
	}
	if err != nil {
		return Kernel{}, fmt.Errorf("find kernel %s: %w", release, err)
	}
	return k, nil
}

// EnsureKernel makes sure the newest kernel of flavor ("" means cloud)
// that apt knows about is installed in stateDir/kernels/<release>/ and
// returns it. It asks apt-cache which package the flavor's meta package
// depends on (running `apt-get update` only if that lookup fails),
// downloads it with `apt-get download`, unpacks it with `dpkg-deb -x`,
// extracts the uncompressed vmlinux from the bzImage and checks it is an
// x86-64 ELF with a PVH note. The release directory appears atomically
// (built in a temp dir, then renamed); a failed run leaves nothing behind.
// An installed release is not downloaded again.
//
// Progress lines go to progress, which may be nil. EnsureKernel holds a
// lock file so that concurrent calls (also from other processes) install
// once. It needs apt and dpkg-deb, and root for `apt-get update`.
func EnsureKernel(ctx context.Context, stateDir, flavor string, progress io.Writer) (Kernel, error) {
	meta, err := metaPackage(flavor)
	if err != nil {
		return Kernel{}, err
	}
	flavor = normFlavor(flavor)
	if progress == nil {
		progress = io.Discard
	}
	start := time.Now()
	root := filepath.Join(stateDir, kernelsDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return Kernel{}, fmt.Errorf("ensure kernel: %w", err)
	}
	unlock, err := lockFile(filepath.Join(root, kernelsLock))
	if err != nil {
		return Kernel{}, fmt.Errorf("ensure kernel: %w", err)
	}
	defer unlock()

	fmt.Fprintf(progress, "kernel: resolving %s\n", meta)
	pkg, version, updated, err := resolvePackage(ctx, meta, progress)
	if err != nil {
		return Kernel{}, fmt.Errorf("ensure kernel: resolve %s: %w", meta, err)
	}
	release := strings.TrimPrefix(pkg, "linux-image-")
	if k, err := load(stateDir, release); err == nil {
		if err := setCurrent(root, flavor, release); err != nil {
			return Kernel{}, fmt.Errorf("ensure kernel: %w", err)
		}
		fmt.Fprintf(progress, "kernel: %s already installed\n", release)
		return k, nil
	}

	err = install(ctx, root, flavor, pkg, version, release, progress)
	if errors.Is(err, errDownload) && !updated {
		// Stale package lists name a version the mirror no longer has.
		fmt.Fprintf(progress, "kernel: %v; running apt-get update\n", err)
		if _, uerr := run(ctx, "", "apt-get", "update", "-q"); uerr != nil {
			return Kernel{}, fmt.Errorf("ensure kernel: %w", errors.Join(err, fmt.Errorf("apt-get update: %w", uerr)))
		}
		if pkg, version, err = lookupPackage(ctx, meta); err != nil {
			return Kernel{}, fmt.Errorf("ensure kernel: resolve %s: %w", meta, err)
		}
		release = strings.TrimPrefix(pkg, "linux-image-")
		if _, lerr := load(stateDir, release); lerr == nil {
			err = nil
		} else {
			err = install(ctx, root, flavor, pkg, version, release, progress)
		}
	}
	if err != nil {
		return Kernel{}, fmt.Errorf("ensure kernel %s: %w", release, err)
	}
	if err := setCurrent(root, flavor, release); err != nil {
		return Kernel{}, fmt.Errorf("ensure kernel: %w", err)
	}
	k, err := load(stateDir, release)
	if err != nil {
		return Kernel{}, fmt.Errorf("ensure kernel %s: %w", release, err)
	}
	fmt.Fprintf(progress, "kernel: installed %s in %.1fs\n", release, time.Since(start).Seconds())
	return k, nil
}

// install downloads pkg and installs it as root/<release>.
func install(ctx context.Context, root, flavor, pkg, version, release string, progress io.Writer) (err error) {
	tmp, err := os.MkdirTemp(root, tmpDirPrefix)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := os.RemoveAll(tmp); rerr != nil && err == nil {
			err = rerr
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	dl := filepath.Join(tmp, "dl")
	if err := os.Mkdir(dl, 0o755); err != nil {
		return err
	}
	allowAptSandbox(dl)

	fmt.Fprintf(progress, "kernel: downloading %s %s\n", pkg, version)
	if _, err := run(ctx, dl, "apt-get", "download", pkg+"="+version); err != nil {
		return fmt.Errorf("%w: %w", errDownload, err)
	}
	debs, err := filepath.Glob(filepath.Join(dl, "*.deb"))
	if err != nil || len(debs) != 1 {
		return fmt.Errorf("download: expected one .deb, found %d", len(debs))
	}
	x := filepath.Join(tmp, "x")
	fmt.Fprintf(progress, "kernel: unpacking %s\n", filepath.Base(debs[0]))
	if _, err := run(ctx, "", "dpkg-deb", "-x", debs[0], x); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}

	out := filepath.Join(tmp, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return err
	}
	bz, err := os.ReadFile(filepath.Join(x, "boot", "vmlinuz-"+release))
	if err != nil {
		return fmt.Errorf("package has no kernel for release %s: %w", release, err)
	}
	format, err := writeVmlinux(ctx, bz, filepath.Join(out, vmlinuxFile))
	if err != nil {
		return err
	}
	fi, err := os.Stat(filepath.Join(out, vmlinuxFile))
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "kernel: extracted vmlinux from %s payload (%d bytes)\n", format, fi.Size())

	mods := filepath.Join(out, "lib", "modules")
	if err := os.MkdirAll(mods, 0o755); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(x, "lib", "modules", release), filepath.Join(mods, release)); err != nil {
		return fmt.Errorf("package has no modules for release %s: %w", release, err)
	}
	if cfg, err := os.ReadFile(filepath.Join(x, "boot", "config-"+release)); err == nil {
		if err := os.WriteFile(filepath.Join(out, "config"), cfg, 0o444); err != nil {
			return err
		}
	}
	meta, err := json.MarshalIndent(Kernel{Flavor: flavor, Release: release, Package: pkg, Version: version}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, metaFile), append(meta, '\n'), 0o444); err != nil {
		return err
	}
	if err := syncDir(out); err != nil {
		return err
	}
	dst := filepath.Join(root, release)
	if err := os.Rename(out, dst); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return syncDir(root)
}

// writeVmlinux extracts the kernel from bz into path (0444) and verifies it.
func writeVmlinux(ctx context.Context, bz []byte, path string) (string, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	format, err := extractVmlinux(ctx, bz, bw)
	if err != nil {
		return format, fmt.Errorf("extract vmlinux: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return format, err
	}
	if err := checkVmlinux(f); err != nil {
		return format, fmt.Errorf("check vmlinux: %w", err)
	}
	if err := f.Chmod(0o444); err != nil {
		return format, err
	}
	if err := f.Sync(); err != nil {
		return format, err
	}
	return format, f.Close()
}

// errDownload marks a failed `apt-get download`.
var errDownload = errors.New("apt-get download failed")

// resolvePackage returns the kernel package (and its candidate version)
// that meta depends on. If apt-cache cannot answer (no package lists yet),
// it runs `apt-get update` once, asks again and reports updated.
func resolvePackage(ctx context.Context, meta string, progress io.Writer) (pkg, version string, updated bool, err error) {
	pkg, version, err = lookupPackage(ctx, meta)
	if err == nil {
		return pkg, version, false, nil
	}
	fmt.Fprintf(progress, "kernel: %v; running apt-get update\n", err)
	if _, uerr := run(ctx, "", "apt-get", "update", "-q"); uerr != nil {
		return "", "", true, errors.Join(err, fmt.Errorf("apt-get update: %w", uerr))
	}
	pkg, version, err = lookupPackage(ctx, meta)
	return pkg, version, true, err
}

func lookupPackage(ctx context.Context, meta string) (pkg, version string, err error) {
	out, err := run(ctx, "", "apt-cache", "depends", meta)
	if err != nil {
		return "", "", err
	}
	pkg, err = parseDepends(out, meta)
	if err != nil {
		return "", "", err
	}
	out, err = run(ctx, "", "apt-cache", "policy", pkg)
	if err != nil {
		return "", "", err
	}
	version, err = parseCandidate(out)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", pkg, err)
	}
	return pkg, version, nil
}

// parseDepends picks the versioned kernel image package out of
// `apt-cache depends <meta>` output.
func parseDepends(out []byte, meta string) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimLeft(strings.TrimSpace(sc.Text()), "|")
		dep, ok := strings.CutPrefix(line, "Depends:")
		if !ok {
			continue
		}
		dep = strings.TrimSpace(dep)
		if strings.HasPrefix(dep, "<") || dep == meta || !strings.HasPrefix(dep, "linux-image-") {
			continue
		}
		if !validRelease(strings.TrimPrefix(dep, "linux-image-")) {
			continue
		}
		return dep, nil
	}
	return "", fmt.Errorf("apt-cache knows no kernel package that %s depends on", meta)
}

// parseCandidate reads the "Candidate:" version from `apt-cache policy`.
func parseCandidate(out []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "Candidate:"); ok {
			v = strings.TrimSpace(v)
			if v == "" || v == "(none)" {
				break
			}
			return v, nil
		}
	}
	return "", errors.New("no installable candidate version")
}

// validRelease accepts kernel release strings like "6.1.0-56-cloud-amd64".
func validRelease(r string) bool {
	if r == "" || len(r) > 64 || r[0] < '0' || r[0] > '9' {
		return false
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' || c == '+') {
			return false
		}
	}
	return true
}

// setCurrent records release as the kernel in use for flavor.
func setCurrent(root, flavor, release string) error {
	return writeFileAtomic(filepath.Join(root, currentFile+flavor), []byte(release+"\n"), 0o644)
}

// writeFileAtomic writes data to a temp file next to path, syncs it and
// renames it over path.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), tmpDirPrefix+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// lockFile takes an exclusive flock on path and returns its release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// allowAptSandbox lets apt's unprivileged download user (_apt) write into
// dir, so apt does not fall back to an unsandboxed download. Best effort.
func allowAptSandbox(dir string) {
	u, err := user.Lookup("_apt")
	if err != nil {
		return
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return
	}
	_ = os.Chown(dir, uid, -1)
}

// run runs a short-lived setup command and returns its stdout. The error
// carries the tail of stderr.
func run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 512 {
			msg = "..." + msg[len(msg)-512:]
		}
		return nil, fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return stdout.Bytes(), nil
}
