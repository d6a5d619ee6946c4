//go:build !linux

package image

import (
	"context"
	"errors"
	"io"
)

// unpack needs openat2 (Linux 5.6+); images are built on Linux hosts only.
func unpack(ctx context.Context, r io.Reader, dir string, opt unpackOptions) (unpackStats, error) {
	return unpackStats{}, errors.New("unpacking images is supported on Linux only")
}
