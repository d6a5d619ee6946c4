package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/image"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// bareBench measures the start baselines #18's targets are stated
// against, alternating each with airlock's own create until the first
// exec answers (two CLI processes, as the start rows), so that the ratio
// comes from the same minutes: a bare QEMU cold boot of the same kernel
// (qemu: at most 1/25) and a bare `runsc run` of `true` on the same image
// tree (gvisor: at most half, or 60 ms).
func bareBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error), bc statedir.BootConfig, stateDir, rtName string, runs int) ([][3]string, error) {
	rcli := func(args ...string) (string, error) { return cli(append([]string{"--runtime", rtName}, args...)...) }
	// Warm-up, and the image tree the gvisor baseline runs on.
	id, err := rcli("create")
	if err != nil {
		return nil, fmt.Errorf("warm-up create: %w", err)
	}
	sb, err := m.Get(ctx, sandbox.Local(), id)
	_, _ = cli("rm", id)
	if err != nil {
		return nil, err
	}
	var baseline func() (time.Duration, error)
	switch rtName {
	case "qemu":
		baseline = func() (time.Duration, error) { return bareBoot(ctx, bc, stateDir) }
	case "gvisor":
		tree := image.NewStore(stateDir, nil, nil).DirPath(image.Image{Name: sb.Image, Digest: sb.ImageDigest})
		if _, err := os.Stat(filepath.Join(tree, "bin", "true")); err != nil {
			return nil, fmt.Errorf("the image tree of %s: %w", sb.Image, err)
		}
		runsc, err := gvisor.FindRunsc()
		if err != nil {
			return nil, err
		}
		baseline = func() (time.Duration, error) { return bareRunsc(ctx, runsc, tree) }
	default:
		return nil, fmt.Errorf("no baseline for runtime %s", rtName)
	}
	var bare, ours []time.Duration
	for range runs {
		d, err := baseline()
		if err != nil {
			return nil, fmt.Errorf("bare %s: %w", rtName, err)
		}
		bare = append(bare, d)
		t := time.Now()
		id, err := rcli("create")
		if err != nil {
			return nil, err
		}
		_, err = cli("exec", id, "--", "true")
		ours = append(ours, time.Since(t))
		_, _ = cli("rm", id)
		if err != nil {
			return nil, err
		}
	}
	b, o := median(bare), median(ours)
	ratio := fmt.Sprintf("%s (%.2fx)", ms(o), float64(o)/float64(b))
	if rtName == "qemu" {
		return [][3]string{
			{"bare `qemu-system-x86_64` cold boot of the same kernel to agent banner", ms(b), fmt.Sprintf("median of %d, no disk, no airlock", runs)},
			{"`create` until the first exec answers, qemu, vs a bare QEMU cold boot", ratio,
				fmt.Sprintf("median of %d each, alternating; two CLI processes; target at most 0.04x (1/25)", runs)},
		}, nil
	}
	return [][3]string{
		{"bare `runsc run` of `true` on the same image tree, until it exits", ms(b),
			fmt.Sprintf("median of %d; systrap, no network, root overlay in memory, no airlock", runs)},
		{"`create` until the first exec answers, gvisor, vs a bare `runsc run`", ratio,
			fmt.Sprintf("median of %d each, alternating; two CLI processes; target at most 0.5x, or 60 ms", runs)},
	}, nil
}

// bareRunsc runs `/bin/true` in a new gVisor sandbox on the image tree
// root with runsc alone (a minimal OCI bundle, no agent, no airlock) and
// returns how long `runsc run` took until it exited.
func bareRunsc(ctx context.Context, runsc, root string) (time.Duration, error) {
	dir, err := os.MkdirTemp("", "airlock-bench-runsc-")
	if err != nil {
		return 0, err
	}
	state := filepath.Join(dir, "state")
	defer func() {
		// runsc leaves its "null" network namespace bind-mounted in its
		// root dir (--network=none).
		if ents, err := os.ReadDir(state); err == nil {
			for _, e := range ents {
				_ = unix.Unmount(filepath.Join(state, e.Name()), unix.MNT_DETACH)
			}
		}
		_ = os.RemoveAll(dir)
	}()
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"args": []string{"/bin/true"},
			"env":  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			"cwd":  "/",
		},
		"root":     map[string]any{"path": root, "readonly": false},
		"hostname": "bare",
		"mounts":   []map[string]any{{"destination": "/proc", "type": "proc", "source": "proc"}},
		"linux": map[string]any{
			"namespaces": []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}},
		},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cid := "bench-" + filepath.Base(dir)[len("airlock-bench-runsc-"):]
	cmd := exec.CommandContext(ctx, runsc, "--root="+state, "--platform=systrap", "--network=none",
		"--overlay2=root:memory", "--ignore-cgroups", "run", "--bundle", dir, cid)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	t := time.Now()
	err = cmd.Run()
	d := time.Since(t)
	if err != nil {
		return 0, fmt.Errorf("runsc run: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return d, nil
}
