package gvisor

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// stubOOMScoreAdj is the host oom_score_adj of the systrap stubs: the most
// the kernel allows, so that the host's OOM killer ends a stub first.
const stubOOMScoreAdj = 1000

// raiseStubs makes the systrap stubs under runsc (pid root) the host OOM
// killer's first choice within the sandbox's cgroup. Every runsc process
// starts with the shim's oom_score_adj; within one memory cgroup the killer
// then picks the largest, and the sentry maps the same guest memory a
// ballooning stub does, so it can be the one picked, which ends the whole
// sandbox instead of the one guest process (seen in CI: the next exec found
// no agent). Stubs are forked by the stub zygote, which this raises too, so
// later stubs inherit the score. runsc's own processes (argv[0] "runsc-*":
// sandbox, gofer) keep theirs. Best effort: a failure is logged.
func raiseStubs(log *slog.Logger, root int) {
	n := 0
	var errs []string
	for _, pid := range descendants(root) {
		argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // gone
		}
		a0, _, _ := bytes.Cut(argv, []byte{0})
		if strings.HasPrefix(filepath.Base(string(a0)), "runsc") {
			continue
		}
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(stubOOMScoreAdj)), 0); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		n++
	}
	if n == 0 || len(errs) > 0 {
		log.Warn("systrap stubs' oom_score_adj not raised: an OOM in the sandbox may end the sentry", "raised", n, "errors", strings.Join(errs, "; "))
	}
}

// descendants lists the processes under root (not root itself), from
// /proc/PID/task/TID/children.
func descendants(root int) []int {
	var out []int
	seen := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, s := range strings.Fields(string(b)) {
				c, err := strconv.Atoi(s)
				if err != nil || seen[c] {
					continue
				}
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}
