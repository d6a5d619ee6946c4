package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// CachedVersion returns what run says of binary (its version line), from
// cache when the file there was written for the same binary: the same
// path, size, modification time and inode. Every shim probes its runtime,
// and running a VMM or runsc just to ask its version costs a process start
// (10-30 ms) on every sandbox start. run is called, and its answer cached,
// when there is no such entry; an error is never cached. An empty cache
// path caches nothing.
func CachedVersion(ctx context.Context, cache, binary string, run func(context.Context) (string, error)) (string, error) {
	key := binaryIdentity(binary)
	if cache != "" && key != "" {
		if b, err := os.ReadFile(cache); err == nil {
			if k, v, ok := strings.Cut(string(b), "\n"); ok && k == key && v != "" {
				return v, nil
			}
		}
	}
	v, err := run(ctx)
	if err != nil || cache == "" || key == "" || strings.Contains(v, "\n") {
		return v, err
	}
	_ = WriteFileAtomic(cache, []byte(key+"\n"+v), 0o600)
	return v, nil
}

// binaryIdentity names the file binary (looked up on PATH) by path, size,
// modification time and inode; "" when it cannot be found.
func binaryIdentity(binary string) string {
	p, err := exec.LookPath(binary)
	if err != nil {
		return ""
	}
	if p, err = filepath.Abs(p); err != nil {
		return ""
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("%s %d %d %d", p, fi.Size(), fi.ModTime().UnixNano(), st.Ino)
}

// WriteFileAtomic writes path through a temporary file and a rename.
func WriteFileAtomic(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
