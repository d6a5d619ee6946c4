package statedir

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
)

// CreateOverlay creates a qcow2 overlay at path backed by backing (format
// "raw" or "qcow2"). sizeMiB 0 keeps the backing file's size.
func CreateOverlay(ctx context.Context, path, backing, backingFmt string, sizeMiB int) error {
	args := []string{"create", "-q", "-f", "qcow2", "-o", "backing_file=" + backing + ",backing_fmt=" + backingFmt, path}
	if sizeMiB > 0 {
		args = append(args, strconv.Itoa(sizeMiB)+"M")
	}
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %w: %s", err, bytesTrim(out))
	}
	return nil
}

func bytesTrim(b []byte) string {
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}
