package statedir

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// The host's disk (threats 89 and 117). Sandboxes' disks are thin: a
// guest can fill its whole disk size. Work that can take disk on the host
// (a create or fork: up to the disk size; a pause or snapshot: the guest's
// memory) is refused while it would bring the state dir's filesystem below
// a free-space reserve, so the catalog, logs and running sandboxes keep
// room to write. The control plane checks it before such work; a shim
// checks it before an idle pause.

// DiskFigures are the state dir's filesystem, df-style, and the reserve.
type DiskFigures struct {
	Total, Free int64 // bytes; Free is what an unprivileged writer can use
	Reserve     int64 // bytes kept free
}

// DefaultDiskReserve is the reserve for a filesystem of total bytes: 5%,
// at least 2 GiB, at most half of it.
func DefaultDiskReserve(total int64) int64 {
	return min(max(total/20, 2<<30), total/2)
}

// Statfs returns a filesystem's total and available bytes.
func Statfs(path string) (total, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// NewDiskFigures is the figures of a filesystem of total bytes with free
// available, keeping reserve (0: DefaultDiskReserve; negative: none).
func NewDiskFigures(total, free, reserve int64) DiskFigures {
	switch {
	case reserve == 0:
		reserve = DefaultDiskReserve(total)
	case reserve < 0:
		reserve = 0
	}
	return DiskFigures{Total: total, Free: free, Reserve: reserve}
}

// Disk returns the figures of the state dir's filesystem, keeping reserve
// (as NewDiskFigures).
func (l Layout) Disk(reserve int64) (DiskFigures, error) {
	total, free, err := Statfs(l.Root)
	if err != nil {
		return DiskFigures{}, fmt.Errorf("state dir's filesystem: %w", err)
	}
	return NewDiskFigures(total, free, reserve), nil
}

// Check refuses work that may write need bytes into the state dir if that
// could leave less than the reserve free: a *SpaceError naming what.
func (d DiskFigures) Check(what string, need int64) error {
	if d.Free-need < d.Reserve {
		return &SpaceError{What: what, Need: need, Free: d.Free, Reserve: d.Reserve}
	}
	return nil
}

// CheckSpace is Check on the state dir's figures (Layout.Disk).
func (l Layout) CheckSpace(reserve int64, what string, need int64) error {
	d, err := l.Disk(reserve)
	if err != nil {
		return err
	}
	return d.Check(what, need)
}

// SpaceError is work refused because the state dir's filesystem would fall
// below its reserve. It is an errdefs.ErrInsufficientStorage.
type SpaceError struct {
	What                string // "this sandbox's disk (2048 MiB)"
	Need, Free, Reserve int64  // bytes
}

func (e *SpaceError) Error() string {
	return fmt.Sprintf("%s: %s needs up to %d MiB of the host's disk; it has %d MiB free and keeps %d MiB in reserve",
		errdefs.ErrInsufficientStorage, e.What, e.Need>>20, e.Free>>20, e.Reserve>>20)
}

// Is makes a SpaceError an errdefs.ErrInsufficientStorage.
func (e *SpaceError) Is(target error) bool { return target == errdefs.ErrInsufficientStorage }
