package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// pauseBench measures pause (guest stopped until the VMM is gone) and
// resume (until the first exec answers) of a default sandbox, runs times;
// with fillMiB > 0 the guest first writes that much random data to tmpfs
// (and as much again passes through a process's memory).
func pauseBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error), runs, fillMiB int) ([][3]string, error) {
	id, err := cli("create")
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
		{"pause, " + what + " (until the VMM and shim are gone)", ms(median(pauseD)), note + fmt.Sprintf("; guest stopped for the save: %s", ms(median(saveD)))},
		{"resume, " + what + ", until the first exec answers", ms(median(resumeD)), note + "; the state digest is checked meanwhile"},
	}, nil
}

// forkBench forks a sandbox three times and reports the time and each
// fork's memory (shim and VMM; PSS divides the pages forks share).
func forkBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error)) ([][3]string, error) {
	id, err := cli("create")
	if err != nil {
		return nil, err
	}
	defer func() { _, _ = cli("rm", id) }()
	if _, err := cli("exec", id, "--", "sh", "-c", fillCmd(64)); err != nil {
		return nil, err
	}
	t := time.Now()
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
	return [][3]string{
		{"fork a live sandbox into 3 (until all 3 answer)", ms(d), "includes the parent's pause+resume and the first build of the snapshot's template"},
		{"memory per fork, RSS/PSS MiB (shim + VMM)", strings.Join(mem, ", "), "parent wrote 64 MiB of tmpfs before the fork; PSS splits the pages the forks share"},
	}, nil
}

// fillCmd writes mib MiB of random bytes to /dev/shm/fill through one
// buffer of that size in dd's memory, so that twice mib of guest RAM is
// dirtied (as a Python urandom-and-write did), with only what an image as
// small as busybox has.
func fillCmd(mib int) string {
	return fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/fill bs=%dM count=1 iflag=fullblock 2>/dev/null", mib)
}
