package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// pauseBench measures pause (guest stopped until the VMM is gone) and
// resume (until the first exec answers) of a default sandbox of runtime
// rtName, runs times; with fillMiB > 0 the guest first writes that much
// random data to tmpfs (and as much again passes through a process's
// memory). The rows name the runtime, but for qemu (their names before
// gVisor paused).
func pauseBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error), rtName string, runs, fillMiB int) ([][3]string, error) {
	id, err := cli("--runtime", rtName, "create")
	if err != nil {
		return nil, err
	}
	defer func() { _, _ = cli("rm", id) }()
	if fillMiB > 0 {
		if _, err := cli("exec", id, "--", "sh", "-c", fillCmd(fillMiB)); err != nil {
			return nil, err
		}
	}
	var pauseD, saveD, resumeD []time.Duration
	var stateBytes int64
	for range runs {
		t := time.Now()
		r, err := m.Pause(ctx, sandbox.Local(), id, false)
		if err != nil {
			return nil, fmt.Errorf("pause: %w", err)
		}
		pauseD = append(pauseD, time.Since(t))
		saveD = append(saveD, r.Save)
		stateBytes = r.StateBytes
		if pid := m.ShimPID(id); pid > 0 {
			return nil, fmt.Errorf("the shim (pid %d) still runs after pause", pid)
		}
		t = time.Now()
		if _, err := m.Resume(ctx, sandbox.Local(), id); err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		if err := benchTrue(ctx, m, id); err != nil {
			return nil, fmt.Errorf("after resume: %w", err)
		}
		resumeD = append(resumeD, time.Since(t))
	}
	what := "fresh 512 MiB sandbox"
	if fillMiB > 0 {
		what = fmt.Sprintf("512 MiB sandbox after writing %d MiB", fillMiB)
	}
	note := fmt.Sprintf("median of %d; state %d MiB", runs, stateBytes>>20)
	return [][3]string{
		{"pause, " + what + " (until the VMM and shim are gone)" + rtSuffix(rtName), ms(median(pauseD)), note + fmt.Sprintf("; guest stopped for the save: %s", ms(median(saveD)))},
		{"resume, " + what + ", until the first exec answers" + rtSuffix(rtName), ms(median(resumeD)), note + "; the state digest is checked meanwhile"},
	}, nil
}

// rtSuffix names rtName at the end of a pause or fork row, but for qemu,
// whose rows kept the names they had before gVisor saved its sandboxes.
func rtSuffix(rtName string) string {
	if rtName == "qemu" {
		return ""
	}
	return ", " + rtName
}

// forkBench measures, on one live sandbox that wrote 64 MiB of tmpfs: a
// snapshot (until the source answers again, and that its shim and VMM went
// on), a fork into three (until all three answer) against one template
// clone of the same size measured just before (Manager.Create until it
// runs, median of 3), and each fork's memory (shim and VMM; PSS divides
// the pages forks share).
func forkBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error), rtName string) ([][3]string, error) {
	m.Runtime = func(context.Context) (string, error) { return rtName, nil }
	defer func() { m.Runtime = func(context.Context) (string, error) { return "qemu", nil } }()
	var clones []time.Duration
	for range 3 {
		t := time.Now()
		sb, err := m.Create(ctx, sandbox.Local(), sandbox.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("baseline create: %w", err)
		}
		clones = append(clones, time.Since(t))
		if err := m.Remove(ctx, sandbox.Local(), sb.ID); err != nil {
			return nil, err
		}
	}
	clone := median(clones)
	id, err := cli("--runtime", rtName, "create")
	if err != nil {
		return nil, err
	}
	defer func() { _, _ = cli("rm", id) }()
	if _, err := cli("exec", id, "--", "sh", "-c", fillCmd(64)); err != nil {
		return nil, err
	}
	pid := shimPID(m.L.ShimLock(id))
	name := "bench-live-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t := time.Now()
	if _, err := m.Snapshot(ctx, sandbox.Local(), id, name, false); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	// The snapshot goes once the forks (whose disks it backs) are gone:
	// deferred before their removals, it runs after them.
	defer func() { _ = m.RemoveSnapshot(context.WithoutCancel(ctx), sandbox.Local(), "", name) }()
	if _, err := cli("exec", id, "--", "true"); err != nil {
		return nil, err
	}
	snap := time.Since(t)
	went := "its shim went on"
	if shimPID(m.L.ShimLock(id)) != pid {
		went = "its shim was replaced (a pause and a resume)"
	}
	t = time.Now()
	forks, err := m.Fork(ctx, sandbox.Local(), id, sandbox.ForkOptions{Count: 3})
	d := time.Since(t)
	for _, f := range forks {
		defer func() { _, _ = cli("rm", f.ID) }()
	}
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	time.Sleep(time.Second)
	var mem []string
	for _, f := range forks {
		rss, pss := sandboxMemory(m.L.ShimLock(f.ID))
		mem = append(mem, fmt.Sprintf("%d/%d", rss>>10, pss>>10))
	}
	baseline, how := "one template clone", "includes the source's live save and the first build of the snapshot's template"
	if rtName != "qemu" {
		baseline, how = "one create", "includes the source's live save; each fork restores the snapshot's state"
	}
	return [][3]string{
		{"snapshot a live sandbox, until it answers an exec again" + rtSuffix(rtName), ms(snap), "saved while it runs; " + went},
		{"fork a live sandbox into 3 (until all 3 answer), vs " + baseline + rtSuffix(rtName), fmt.Sprintf("%s (%.1fx)", ms(d), float64(d)/float64(clone)),
			fmt.Sprintf("one create (Manager.Create until running, median of 3): %s; %s", ms(clone), how)},
		{"memory per fork, RSS/PSS MiB (shim + VMM)" + rtSuffix(rtName), strings.Join(mem, ", "), "parent wrote 64 MiB of tmpfs before the fork; PSS splits the pages the forks share"},
	}, nil
}

// shimPID is the pid in a shim lock file, or 0.
func shimPID(lock string) int {
	if pids := sandboxPIDs(lock); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// fillCmd writes mib MiB of random bytes to /dev/shm/fill through one
// buffer of that size in dd's memory, so that twice mib of guest RAM is
// dirtied (as a Python urandom-and-write did), with only what an image as
// small as busybox has.
func fillCmd(mib int) string {
	return fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/fill bs=%dM count=1 iflag=fullblock 2>/dev/null", mib)
}
