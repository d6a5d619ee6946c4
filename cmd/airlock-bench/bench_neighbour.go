package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// neighbourBench measures the host envelope (threat 88): the exec round
// trip of a 1-vCPU sandbox, first beside an idle 2-vCPU neighbour, then
// while that neighbour burns CPU in 4 guest processes, with host cgroups on
// and then off (--host-cgroups), all in this run. The ratio busy/idle is
// the neighbour's effect.
func neighbourBench(ctx context.Context, m *sandbox.Manager, cli func(...string) (string, error), rtName string, execs int) ([][3]string, error) {
	var rows [][3]string
	for _, mode := range []string{"on", "off"} {
		flags := []string{"--runtime", rtName, "--host-cgroups", mode}
		victim, err := cli(append(flags, "create", "--cpus", "1")...)
		if err != nil {
			return nil, fmt.Errorf("victim: %w", err)
		}
		neighbour, err := cli(append(flags, "create", "--cpus", "2")...)
		if err != nil {
			_, _ = cli("rm", victim)
			return nil, fmt.Errorf("neighbour: %w", err)
		}
		idle, err := execRTT(ctx, m, victim, execs)
		if err != nil {
			return nil, err
		}
		var burning sync.WaitGroup
		burning.Go(func() {
			// Ends when the neighbour is removed.
			_, _ = cli("exec", neighbour, "--", "sh", "-c", "for i in 1 2 3 4; do (while :; do :; done) & done; touch /tmp/burning; wait")
		})
		// The burners run once the exec has started; give them a moment.
		if _, err := cli("exec", neighbour, "--", "sh", "-c", "for i in $(seq 100); do [ -e /tmp/burning ] && exit 0; sleep 0.1; done; exit 1"); err != nil {
			return nil, fmt.Errorf("neighbour burners did not start: %w", err)
		}
		busy, err := execRTT(ctx, m, victim, execs)
		_, _ = cli("rm", neighbour)
		burning.Wait()
		_, _ = cli("rm", victim)
		if err != nil {
			return nil, err
		}
		rows = append(rows, [3]string{
			fmt.Sprintf("exec round trip beside a neighbour burning 2 vCPUs, host cgroups %s, %s", mode, rtName),
			fmt.Sprintf("%s (%.2fx)", ms(busy), float64(busy)/float64(idle)),
			fmt.Sprintf("median of %d; %s beside the same neighbour idle", execs, ms(idle)),
		})
	}
	return rows, nil
}

// execRTT is the median round trip of n `true` execs in sandbox id.
func execRTT(ctx context.Context, m *sandbox.Manager, id string, n int) (time.Duration, error) {
	var ds []time.Duration
	for range n {
		t := time.Now()
		if err := benchTrue(ctx, m, id); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(t))
	}
	return median(ds), nil
}
