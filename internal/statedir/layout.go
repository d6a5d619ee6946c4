package statedir

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Layout names every path in a state dir.
type Layout struct{ Root string }

func (l Layout) Catalog() string            { return filepath.Join(l.Root, "catalog.db") }
func (l Layout) Sandboxes() string          { return filepath.Join(l.Root, "sandboxes") }
func (l Layout) Dir(id string) string       { return filepath.Join(l.Root, "sandboxes", id) }
func (l Layout) Socket(id string) string    { return filepath.Join(l.Dir(id), "shim.sock") }
func (l Layout) ShimLock(id string) string  { return filepath.Join(l.Dir(id), "shim.lock") }
func (l Layout) ShimLog(id string) string   { return filepath.Join(l.Dir(id), "shim.log") }
func (l Layout) PortsSock(id string) string { return filepath.Join(l.Dir(id), "ports.sock") }
func (l Layout) PauseDir(id string) string  { return filepath.Join(l.Dir(id), "paused") }
func (l Layout) RootDisk(id string) string  { return filepath.Join(l.Dir(id), "root.qcow2") }
func (l Layout) RunDir(id string) string    { return filepath.Join(l.Dir(id), "run") }
func (l Layout) Console(id string) string   { return filepath.Join(l.RunDir(id), "console.log") }
func (l Layout) Templates() string          { return filepath.Join(l.Root, "templates") }
func (l Layout) BootConfig() string         { return filepath.Join(l.Root, "boot.json") }
func (l Layout) Agents() string             { return filepath.Join(l.Root, "agents") }
func (l Layout) RunscVersion() string       { return filepath.Join(l.Root, "runsc-version") }
func (l Layout) SnapshotsDir() string       { return filepath.Join(l.Root, "snapshots") }

// SnapshotDir is snapshot id's directory: its state, disk and manifest.
func (l Layout) SnapshotDir(id string) string { return filepath.Join(l.SnapshotsDir(), id) }

// ImagePath returns the blob path of an image digest ("sha256:<hex>").
func (l Layout) ImagePath(digest string) string {
	return l.Root + "/images/blobs/" + strings.Replace(digest, ":", "-", 1) + ".ext4"
}

// ShimLockFD is the descriptor a shim inherits its sandbox's shim lock
// (Layout.ShimLock) on, taken by the control plane before it claimed the
// generation.
const ShimLockFD = 5

// idRe matches sandbox IDs: 20 lowercase base32 characters (100 random
// bits), or 12 for sandboxes made before ids grew.
var idRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z2-7]{12}(?:[a-z2-7]{8})?$`) })

// NewID returns a fresh random sandbox ID: 100 bits, so an id cannot be
// guessed even where it is the only thing a request names.
func NewID() string { return RandomID(20) }

// RandomID returns n random characters of [a-z2-7] (5 bits each), for
// names that must not be guessed or collide: sandbox, exec and fork ids,
// temporary files.
func RandomID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	return string(b)
}

// ValidateID rejects anything that is not a sandbox ID, so user input never
// becomes a path component unchecked.
func ValidateID(id string) error {
	if !idRe().MatchString(id) {
		return fmt.Errorf("%w: %q is not a sandbox id (20 characters a-z, 2-7; see `airlock ls`)", errdefs.ErrInvalid, id)
	}
	return nil
}

// BootConfig is what `airlock setup` prepared: the guest kernel and the
// initramfs holding the agent. Stored as boot.json in the state dir so a
// create does not re-hash anything.
type BootConfig struct {
	Kernel        string `json:"kernel"`         // uncompressed PVH vmlinux
	KernelRelease string `json:"kernel_release"` // e.g. 6.1.0-NN-cloud-amd64
	Initrd        string `json:"initrd"`         // content-addressed cpio
}

// ErrNotSetUp means the state dir lacks the kernel, initramfs or image.
var ErrNotSetUp = errors.New("airlock is not set up on this host")

// LoadBootConfig reads boot.json.
func (l Layout) LoadBootConfig() (BootConfig, error) {
	var bc BootConfig
	b, err := os.ReadFile(l.BootConfig())
	if errors.Is(err, os.ErrNotExist) {
		return bc, fmt.Errorf("%w: no guest kernel prepared in %s (run `airlock setup`, or `make demo`)", ErrNotSetUp, l.Root)
	}
	if err != nil {
		return bc, fmt.Errorf("read boot config: %w", err)
	}
	if err := json.Unmarshal(b, &bc); err != nil {
		return bc, fmt.Errorf("read boot config %s: %w", l.BootConfig(), err)
	}
	for _, p := range []string{bc.Kernel, bc.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return bc, fmt.Errorf("%w: %s is missing (run `airlock setup`)", ErrNotSetUp, p)
		}
	}
	return bc, nil
}

// SaveBootConfig writes boot.json atomically.
func (l Layout) SaveBootConfig(bc BootConfig) error {
	b, err := json.MarshalIndent(bc, "", "  ")
	if err != nil {
		return err
	}
	tmp := l.BootConfig() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write boot config: %w", err)
	}
	return os.Rename(tmp, l.BootConfig())
}

// VolumesDir holds the volumes' images.
func (l Layout) VolumesDir() string { return filepath.Join(l.Root, "volumes") }

// VolumeImage is volume id's ext4 image.
func (l Layout) VolumeImage(id string) string { return filepath.Join(l.VolumesDir(), id+".img") }

// NewVolumeID returns a new volume id ("vol-" and 16 random characters).
func NewVolumeID() string { return "vol-" + RandomID(16) }

var volumeIDRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^vol-[a-z2-7]{16}$`) })

// ValidateVolumeID checks a volume id read back from the catalog before it
// names a file.
func ValidateVolumeID(id string) error {
	if !volumeIDRe().MatchString(id) {
		return fmt.Errorf("%w: %q is not a volume id", errdefs.ErrInvalid, id)
	}
	return nil
}

// CloneSetup makes dst, a new directory on l's filesystem, the state dir
// of a second node on this host: l's guest kernel, initramfs and image
// blobs as hard links, and a boot config naming them; world-traversable,
// as `airlock setup` leaves a state dir (the VMMs, unprivileged, open
// the disks' backing files by path). For tests and benchmarks that run a
// cluster's nodes on one host; a real node runs `airlock setup`.
func (l Layout) CloneSetup(dst Layout) error {
	bc, err := l.LoadBootConfig()
	if err != nil {
		return err
	}
	if err := os.Chmod(dst.Root, 0o755); err != nil {
		return err
	}
	link := func(from, to string) error {
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		return os.Link(from, to)
	}
	nb := bc
	nb.Kernel = filepath.Join(dst.Root, "kernels", bc.KernelRelease, "vmlinux")
	nb.Initrd = filepath.Join(dst.Root, "initramfs", filepath.Base(bc.Initrd))
	if err := errors.Join(link(bc.Kernel, nb.Kernel), link(bc.Initrd, nb.Initrd)); err != nil {
		return err
	}
	blobs, _ := filepath.Glob(filepath.Join(l.Root, "images", "blobs", "*.ext4"))
	for _, b := range blobs {
		if err := link(b, filepath.Join(dst.Root, "images", "blobs", filepath.Base(b))); err != nil {
			return err
		}
	}
	return dst.SaveBootConfig(nb)
}
