package vport

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Find polls sysClass (normally /sys/class/virtio-ports) for the port whose
// name file says name, and returns its device path under devDir (normally
// /dev), e.g. /dev/vport0p1. There is no udev in the guest, so the
// /dev/virtio-ports/<name> symlink does not exist. It gives up when ctx is
// done.
func Find(ctx context.Context, sysClass, devDir, name string) (string, error) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if dev := lookup(sysClass, devDir, name); dev != "" {
			return dev, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("virtio port %q: %w", name, context.Cause(ctx))
		case <-t.C:
		}
	}
}

func lookup(sysClass, devDir, name string) string {
	ents, err := os.ReadDir(sysClass)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysClass, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		dev := filepath.Join(devDir, e.Name())
		if _, err := os.Stat(dev); err == nil {
			return dev
		}
	}
	return ""
}
