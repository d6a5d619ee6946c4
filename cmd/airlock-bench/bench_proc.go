package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envknob"
)

// procBench measures what the guest process audit costs an exec-heavy
// workload: a shell loop running /bin/true n times, timed inside the guest,
// in a sandbox with the audit on (the default) and one with it off
// (envknob.ProcAudit, which `airlock create` passes to the shim it
// starts). Best of runs per side, alternating, so drift on a shared host
// hits both. rtName is the runtime: under qemu the guest agent reports
// the execs, under gvisor the Sentry (runsc's runtime monitoring).
func procBench(ctx context.Context, c airlockCLI, rtName string, n, runs int) ([][3]string, error) {
	type side struct {
		mode string
		id   string
		best time.Duration
		rows int
	}
	sides := []*side{{mode: "on"}, {mode: "off"}}
	for _, s := range sides {
		id, err := c.runEnv([]string{envknob.ProcAudit.Setting(s.mode)}, "--runtime", rtName, "create")
		if err != nil {
			return nil, err
		}
		s.id = id
		defer func() { _, _ = c.run("rm", id) }()
		if _, err := c.run("exec", id, "--", "true"); err != nil { // warm the exec path
			return nil, err
		}
	}
	script := fmt.Sprintf(`s=$(date +%%s%%N); i=0; while [ $i -lt %d ]; do /bin/true; i=$((i+1)); done; e=$(date +%%s%%N); echo $((e-s))`, n)
	for range runs {
		for _, s := range sides {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			out, err := c.run("exec", s.id, "--", "sh", "-c", script)
			if err != nil {
				return nil, fmt.Errorf("exec loop: %w", err)
			}
			ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("exec loop printed %q", out)
			}
			if d := time.Duration(ns); s.best == 0 || d < s.best {
				s.best = d
			}
		}
	}
	on, off := sides[0], sides[1]
	// The rows the audited sandbox left (written at rm: the folded rows).
	if _, err := c.run("rm", on.id); err != nil {
		return nil, err
	}
	out, err := c.run("events", "--sandbox", on.id, "--type", "proc", "--limit", "10000")
	if err != nil {
		return nil, err
	}
	on.rows = strings.Count(out, "\n")
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) / 1000 }
	note := fmt.Sprintf("%d x /bin/true from a shell loop, timed in the guest, best of %d", n, runs)
	overhead := 100 * (float64(on.best) - float64(off.best)) / float64(off.best)
	return [][3]string{
		{"exec-heavy loop, process audit off, " + rtName, fmt.Sprintf("%.2f ms/exec", per(off.best)), note},
		{"exec-heavy loop, process audit on (default), " + rtName, fmt.Sprintf("%.2f ms/exec (%+.0f%%)", per(on.best), overhead),
			fmt.Sprintf("%s; the audited sandbox left %d proc.* rows for %d execs", note, on.rows, runs*n+1)},
	}, nil
}
