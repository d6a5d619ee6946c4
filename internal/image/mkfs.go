package image

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Label is the ext4 volume label of every image.
const Label = "airlock-root"

const (
	mkfsBlockSize  = 4096
	mkfsInodeSize  = 256
	mkfsBytesPerIn = 16384 // mke2fs's default inode ratio
	mkfsSlackBytes = 128 << 20
)

// treeUsage is what a directory tree needs on ext4.
type treeUsage struct {
	bytes  int64 // data blocks, rounded to the block size
	inodes int64
}

// measureTree walks dir without following symlinks and estimates the space
// and inodes it needs. Hard links count once.
func measureTree(dir string) (treeUsage, error) {
	var u treeUsage
	seen := map[uint64]bool{}
	round := func(n int64) int64 { return (n + mkfsBlockSize - 1) / mkfsBlockSize * mkfsBlockSize }
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		u.inodes++
		switch {
		case fi.Mode().IsRegular():
			u.bytes += round(fi.Size())
		case fi.IsDir():
			u.bytes += mkfsBlockSize
		case fi.Mode()&fs.ModeSymlink != 0 && fi.Size() >= 60: // longer targets need a block
			u.bytes += mkfsBlockSize
		}
		return nil
	})
	return u, err
}

// mkfsSize returns the file size and inode count for an image of content u:
// content * 1.15 + 128 MiB, rounded up to a MiB, and enough inodes for the
// tree plus room for the guest to create files.
func mkfsSize(u treeUsage) (size, inodes int64) {
	size = u.bytes + u.bytes*15/100 + mkfsSlackBytes
	size = (size + (1<<20 - 1)) &^ (1<<20 - 1)
	inodes = max(size/mkfsBytesPerIn, u.inodes+u.inodes/4+4096)
	return size, inodes
}

// mkfsExt4 builds an ext4 image of srcDir at dst with mkfs.ext4 -d: label
// Label, no reserved blocks, root owned by 0:0. It returns the image size.
func mkfsExt4(ctx context.Context, srcDir, dst string) (int64, error) {
	u, err := measureTree(srcDir)
	if err != nil {
		return 0, fmt.Errorf("measure tree: %w", err)
	}
	size, inodes := mkfsSize(u)
	args := []string{
		"-q", "-F", "-t", "ext4",
		"-L", Label,
		"-m", "0",
		"-b", strconv.Itoa(mkfsBlockSize),
		"-I", strconv.Itoa(mkfsInodeSize),
		"-N", strconv.FormatInt(inodes, 10),
		"-E", "root_owner=0:0",
		"-d", srcDir,
		dst, strconv.FormatInt(size/1024, 10) + "k",
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "mkfs.ext4", args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("mkfs.ext4: %w: %s", err, tail(out.String(), 1024))
	}
	return size, nil
}

// tail returns the last n bytes of s, trimmed.
func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
