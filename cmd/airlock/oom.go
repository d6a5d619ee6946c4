package main

import (
	"log/slog"
	"os"
	"strconv"
)

// OOM-killer priorities on the host (threat 124): under memory pressure
// the kernel should end a sandbox, never the control plane. serve lowers
// its own score (it holds every API connection and the catalog's writers);
// a shim raises its own, and the VMM or sentry it starts inherits it, so a
// sandbox (the largest processes on the host) is the first to go. The
// template holder, whose RAM clones also map, is raised the same way.
const (
	oomAdjServe   = -900
	oomAdjSandbox = 500
)

// setOOMScoreAdj sets this process's oom_score_adj (best effort: lowering
// it needs CAP_SYS_RESOURCE, which some hosts' root lacks; a failure is
// logged, not fatal).
func setOOMScoreAdj(log *slog.Logger, v int) {
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(v)), 0); err != nil {
		// Lowering needs CAP_SYS_RESOURCE; sandboxes are raised anyway.
		log.Info("oom_score_adj not set", "value", v, "err", err)
	}
}
