package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// volbenchScript is the workload of the volume rows, run unchanged on the
// host (the baseline) and in guests.
//
//go:embed volbench.py
var volbenchScript string

// fsResult is what volbench.py prints.
type fsResult struct {
	MiB         int      `json:"mib"`
	Files       int      `json:"files"`
	WriteMBps   float64  `json:"write_mbps"`  // MB/s, 1 MiB writes then fsync, timed with the fsync
	ReadMBps    float64  `json:"read_mbps"`   // MB/s, first read after fadvise(DONTNEED)
	RereadMBps  float64  `json:"reread_mbps"` // MB/s, the second read (warm)
	Fadvise     string   `json:"fadvise"`     // "ok", or "error: ..."
	Resident    *float64 `json:"resident"`    // fraction of the file cached in the measuring kernel when the read began; nil: unknown
	CreatesPerS float64  `json:"creates_per_s"`
}

// parseFSResult parses the script's output (its last line) for a run of
// mib MiB and files files.
func parseFSResult(out string, mib, files int) (fsResult, error) {
	out = strings.TrimSpace(out)
	line := out[strings.LastIndexByte(out, '\n')+1:]
	var r fsResult
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return r, fmt.Errorf("volume workload printed %q: %w", out, err)
	}
	if r.MiB != mib || r.Files != files {
		return r, fmt.Errorf("volume workload measured %d MiB and %d files, want %d and %d", r.MiB, r.Files, mib, files)
	}
	for name, v := range map[string]float64{"write_mbps": r.WriteMBps, "read_mbps": r.ReadMBps, "reread_mbps": r.RereadMBps, "creates_per_s": r.CreatesPerS} {
		if !(v > 0) || math.IsInf(v, 0) {
			return r, fmt.Errorf("volume workload printed %s = %v", name, v)
		}
	}
	if r.Resident != nil && (*r.Resident < 0 || *r.Resident > 1) {
		return r, fmt.Errorf("volume workload printed resident = %v", *r.Resident)
	}
	return r, nil
}

// readCache says what the first read measured, as far as the kernel that
// ran the script can tell.
func (r fsResult) readCache() string {
	switch {
	case r.Fadvise != "ok":
		return "page cache not dropped (fadvise " + r.Fadvise + ")"
	case r.Resident == nil:
		return "cold or cached: unknown"
	case *r.Resident <= 0.05:
		return "cold"
	case *r.Resident >= 0.95:
		return "cached"
	default:
		return fmt.Sprintf("%.0f%% cached", *r.Resident*100)
	}
}

// bestOf keeps the best of each figure of runs (at least one): the
// machine is shared, and other work only ever slows a run down. Resident
// is the largest seen, so a read counts as cold only if every run's was,
// and Fadvise is the first failure.
func bestOf(runs []fsResult) fsResult {
	b := runs[0]
	for _, r := range runs[1:] {
		b.WriteMBps = max(b.WriteMBps, r.WriteMBps)
		b.ReadMBps = max(b.ReadMBps, r.ReadMBps)
		b.RereadMBps = max(b.RereadMBps, r.RereadMBps)
		b.CreatesPerS = max(b.CreatesPerS, r.CreatesPerS)
		switch {
		case r.Resident == nil:
			b.Resident = nil
		case b.Resident != nil && *r.Resident > *b.Resident:
			b.Resident = r.Resident
		}
		if b.Fadvise == "ok" {
			b.Fadvise = r.Fadvise
		}
	}
	return b
}

// fsRatios are a guest's figures divided by the host's.
type fsRatios struct{ write, read, reread, creates float64 }

func ratios(guest, host fsResult) fsRatios {
	return fsRatios{
		write:   guest.WriteMBps / host.WriteMBps,
		read:    guest.ReadMBps / host.ReadMBps,
		reread:  guest.RereadMBps / host.RereadMBps,
		creates: guest.CreatesPerS / host.CreatesPerS,
	}
}

func (q fsRatios) String() string {
	return fmt.Sprintf("%.2fx / %.2fx / %.2fx / %.2fx", q.write, q.read, q.reread, q.creates)
}

// absolute prints r's figures in the order of the ratios.
func (r fsResult) absolute() string {
	return fmt.Sprintf("%.0f MB/s, %.0f MB/s (%s), %.0f MB/s, %.0f files/s", r.WriteMBps, r.ReadMBps, r.readCache(), r.RereadMBps, r.CreatesPerS)
}

// volRuns is how many times each target runs the workload (best of).
const volRuns = 2

// volWhat heads the volume rows: the four figures of each, in order.
const volWhat = "write / read after fadvise(DONTNEED) / warm reread / small-file creates"

// volumesBench measures sequential write and read throughput and the
// small-file create rate on a volume, on a host mount and on the
// sandbox's root disk, for each runtime
// present, each divided by the same workload on the host's disk in the
// same run. Every sandbox, volume and bind mount it makes is removed on
// return, error or not.
func volumesBench(ctx context.Context, c airlockCLI, runtimes []string, mib, files int) (rows [][3]string, err error) {
	cc := c
	cc.ctx = context.WithoutCancel(c.ctx) // cleanup runs after an interrupt too
	fmt.Fprintln(os.Stderr, "bench: host disk")
	host, err := hostBaseline(ctx, c.cfg.stateDir, mib, files)
	if err != nil {
		return nil, err
	}
	rows = append(rows, [3]string{"host disk, the baseline: " + volWhat, host.absolute(),
		fmt.Sprintf("best of %d each, host python3 in a temp dir of the state dir; %d MiB in 1 MiB writes + fsync, read back after fadvise(DONTNEED), then again; %d x 4 KiB files + fsync of their dir", volRuns, mib, files)})
	for _, rt := range runtimes {
		rr, err := volumesRuntime(ctx, c, cc, rt, host, mib, files)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rt, err)
		}
		rows = append(rows, rr...)
	}
	return rows, nil
}

// hostBaseline runs the workload volRuns times with the host's python3 in
// a temp dir of the state dir (the filesystem of the volumes' images).
func hostBaseline(ctx context.Context, stateDir string, mib, files int) (fsResult, error) {
	dir, err := os.MkdirTemp(stateDir, "bench-volumes-")
	if err != nil {
		return fsResult{}, err
	}
	defer os.RemoveAll(dir)
	var runs []fsResult
	for range volRuns {
		r, err := hostRun(ctx, dir, mib, files)
		if err != nil {
			return fsResult{}, err
		}
		runs = append(runs, r)
	}
	return bestOf(runs), nil
}

func hostRun(ctx context.Context, dir string, mib, files int) (fsResult, error) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		py = "python3"
	}
	cmd := exec.CommandContext(ctx, py, "-c", volbenchScript, filepath.Join(dir, "w"), strconv.Itoa(mib), strconv.Itoa(files))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fsResult{}, fmt.Errorf("host workload: %w", err)
	}
	return parseFSResult(string(out), mib, files)
}

// volumesRuntime measures one runtime: one sandbox with a fresh volume and
// a read-write host mount, and the workload run in each mount
// and on its root disk.
func volumesRuntime(ctx context.Context, c, cc airlockCLI, rt string, host fsResult, mib, files int) (rows [][3]string, err error) {
	name := "bench-vol-" + rt + "-" + strconv.Itoa(os.Getpid())
	// The volume holds the file, the small files and ext4's overhead.
	size := fmt.Sprintf("%dM", mib+mib/2+64)
	if _, err := c.run("volume", "create", name, "--size", size); err != nil {
		return nil, fmt.Errorf("volume create: %w", err)
	}
	defer func() {
		if _, rmErr := cc.run("volume", "rm", name); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("volume rm %s: %w", name, rmErr))
		}
	}()
	args := []string{"--runtime", rt, "create", "-v", name + ":/bench-vol"}
	var hostDir string
	hostMountNote := ""
	if os.Geteuid() != 0 {
		hostMountNote = "skipped: a read-write host mount needs a nosuid,nodev bind mount, which needs root"
	} else {
		dir, undo, err := nosuidDir(filepath.Dir(c.cfg.stateDir))
		if err != nil {
			return nil, err
		}
		defer func() { err = errors.Join(err, undo()) }()
		hostDir = dir
		args = append(args, "--mount", dir+":/bench-host:rw")
	}
	id, err := c.run(args...)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	defer func() {
		if _, rmErr := cc.run("rm", id); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("rm %s: %w", id, rmErr))
		}
	}()
	guest := func(dir string) (fsResult, error) {
		var runs []fsResult
		for range volRuns {
			out, err := c.run("exec", id, "--", "python3", "-c", volbenchScript, dir, strconv.Itoa(mib), strconv.Itoa(files))
			if err != nil {
				return fsResult{}, fmt.Errorf("workload in %s: %w", dir, err)
			}
			r, err := parseFSResult(out, mib, files)
			if err != nil {
				return fsResult{}, err
			}
			if rt == "gvisor" {
				// gVisor's mincore says every page is resident, even of
				// a file the host has not cached (checked by hand): it
				// tells nothing.
				r.Resident = nil
			}
			runs = append(runs, r)
		}
		return bestOf(runs), nil
	}
	how := map[string]string{
		"qemu":   "virtio-blk raw image, guest ext4; the image's pages may stay in the host's page cache (QEMU does not use O_DIRECT), so a read cold in the guest can be warm on the host",
		"gvisor": "ext4 image loop-mounted by the host kernel, served by the gofer; whether fadvise reaches the host's page cache is unknown (gVisor's mincore reports every page resident)",
	}[rt]
	row := func(what string, r fsResult, note string) {
		rows = append(rows, [3]string{what + ", " + rt + ", vs host", ratios(r, host).String(), r.absolute() + "; " + note})
	}
	fmt.Fprintf(os.Stderr, "bench: %s volume\n", rt)
	vol, err := guest("/bench-vol/airlock-bench")
	if err != nil {
		return nil, err
	}
	row("volume", vol, how)
	switch {
	case hostDir != "":
		fmt.Fprintf(os.Stderr, "bench: %s host mount\n", rt)
		hm, err := guest("/bench-host/airlock-bench")
		if err != nil {
			return nil, err
		}
		note := map[string]string{
			"qemu":   "read-write host mount over virtio-fs (virtiofsd, cache=auto; host dir on a nosuid,nodev bind mount)",
			"gvisor": "read-write host mount served by the gofer (host dir on a nosuid,nodev bind mount); whether fadvise reaches the host's page cache is unknown (gVisor's mincore reports every page resident)",
		}[rt]
		if !sameFS(hostDir, c.cfg.stateDir) {
			note += "; NOTE: not on the baseline's filesystem"
		}
		row("host mount", hm, note)
	case hostMountNote != "":
		rows = append(rows, [3]string{"host mount, " + rt + ", vs host", "-", hostMountNote})
	}
	fmt.Fprintf(os.Stderr, "bench: %s root disk\n", rt)
	root, err := guest("/root/airlock-bench")
	if err != nil {
		return nil, err
	}
	rootHow := map[string]string{
		"qemu":   "reference: the sandbox's qcow2 overlay disk, guest ext4",
		"gvisor": "reference: runsc's root overlay, whose upper layer is the sentry's own tmpfs (backed by a host file): fsync does not reach a disk",
	}[rt]
	row("root disk", root, rootHow)
	return rows, nil
}

// nosuidDir makes a temp dir under parent that is a nosuid,nodev bind
// mount of itself (what a read-write host mount needs). undo unmounts and
// removes it.
func nosuidDir(parent string) (dir string, undo func() error, err error) {
	dir, err = os.MkdirTemp(parent, "airlock-bench-mount-")
	if err != nil {
		return "", nil, err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return "", nil, errors.Join(fmt.Errorf("bind mount %s: %w", dir, err), os.Remove(dir))
	}
	undo = func() error {
		if err := unix.Unmount(dir, 0); err != nil {
			// Still busy (a sandbox not removed): detach it, so the
			// bind mount leaves the mount table all the same.
			if derr := unix.Unmount(dir, unix.MNT_DETACH); derr != nil {
				return fmt.Errorf("unmount %s: %w", dir, errors.Join(err, derr))
			}
		}
		return os.RemoveAll(dir)
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return "", nil, errors.Join(fmt.Errorf("remount %s nosuid,nodev: %w", dir, err), undo())
	}
	return dir, undo, nil
}

// sameFS reports whether a and b are on one filesystem.
func sameFS(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}
