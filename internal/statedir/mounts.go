package statedir

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// MountsUnder lists the mount points at or below dir (deepest first), from
// this process's mountinfo.
func MountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if p := unescapeMountPath(f[4]); p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	return points
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + c - '0'
			}
			if ok {
				out = append(out, v)
				i += 3
				continue
			}
		}
		out = append(out, s[i])
	}
	return string(out)
}

// DetachMounts lazily unmounts every mount at or below dir, deepest first.
func DetachMounts(dir string) {
	for _, p := range MountsUnder(dir) {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}

// RemoveAllNoMounts is os.RemoveAll for a directory of airlock's own that
// a runtime may have mounted things under (a volume, a host directory,
// runsc's state): it takes those mounts off first and refuses to remove
// anything while one is still there, so that it never deletes what a
// mount shows.
func RemoveAllNoMounts(dir string) error {
	DetachMounts(dir)
	if left := MountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("not removing %s: %s is still mounted", dir, left[0])
	}
	return os.RemoveAll(dir)
}
