package runtime

import (
	"errors"
	"fmt"

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
