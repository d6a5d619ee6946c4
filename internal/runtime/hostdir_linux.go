package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// OpenDirNoSymlinks opens directory p (absolute) as an O_PATH descriptor,
// refusing a symlink in any component of p, the last included (threat 11:
// the directory shared is the one named, and a link swapped in later does
// not move it). The caller closes the descriptor.
func OpenDirNoSymlinks(p string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ELOOP):
		return -1, errors.New("a component of the path is a symbolic link (name the real directory)")
	case errors.Is(err, unix.ENOTDIR):
		return -1, errors.New("not a directory")
	case errors.Is(err, unix.ENOENT):
		return -1, errors.New("no such directory")
	default:
		return -1, fmt.Errorf("open: %w", err)
	}
}

// CheckWritableHostDir refuses a read-write host mount of the directory
// open at fd unless its mount on the host is nosuid and nodev: a guest's
// root can give files it writes there any mode, set-id bits included, and
// those must never take effect on the host (threat 9).
func CheckWritableHostDir(fd int) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		return errors.New("a read-write host mount must be on a host mount that is nosuid and nodev (a guest can set set-id bits on files it writes); " +
			"mount it read-only, or make the directory such a mount first: mount --bind DIR DIR && mount -o remount,bind,nosuid,nodev DIR")
	}
	return nil
}

// ReleaseMountPoints unmounts the mount points in dir (a runtime's own
// directory of them) and removes them and dir. It never removes anything
// recursively: a point still mounted stays.
func ReleaseMountPoints(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		// Detach: the sandbox's processes are gone, and an image's loop
		// device is freed (autoclear) once the last reference goes.
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// BindHostDir bind-mounts host directory dir at point, from a descriptor opened
// without following symlinks, then makes the bind nosuid, nodev and, for
// ro, read-only.
func BindHostDir(dir, point string, ro bool) error {
	fd, err := OpenDirNoSymlinks(dir)
	if err != nil {
		return fmt.Errorf("host directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if !ro {
		if err := CheckWritableHostDir(fd); err != nil {
			return fmt.Errorf("host directory %s: %w", dir, err)
		}
	}
	src := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(src, point, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", point, "", flags, ""); err != nil {
		_ = unix.Unmount(point, unix.MNT_DETACH)
		return fmt.Errorf("remount %s: %w", dir, err)
	}
	return nil
}
