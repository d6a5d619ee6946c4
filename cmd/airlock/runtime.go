package main

import (
	"context"
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/statedir"
)

// runtimeChoice is the runtime new sandboxes get, and why.
type runtimeChoice struct {
	name string // "qemu" or "gvisor"
	why  string // one line
	err  error
}

// pickRuntime resolves --runtime once per process. qemu and gvisor are
// taken as asked. auto prefers speed with isolation: qemu when a probe
// guest really runs under KVM; else gvisor when runsc works here (a
// gVisor sandbox starts in about 100 ms, a TCG guest is emulated); else
// qemu on TCG, with a warning.
func (g *globals) pickRuntime(ctx context.Context) runtimeChoice {
	g.rtOnce.Do(func() { g.rtChoice = g.resolveRuntime(ctx) })
	return g.rtChoice
}

func (g *globals) resolveRuntime(ctx context.Context) runtimeChoice {
	if g.runtime != "auto" {
		return runtimeChoice{name: g.runtime, why: "--runtime " + g.runtime}
	}
	kvm := "KVM not probed"
	if bc, err := (statedir.Layout{Root: g.stateDir}).LoadBootConfig(); err != nil {
		kvm += " (" + err.Error() + ")"
	} else if rt, err := newRuntime(g, bc); err != nil {
		kvm += " (" + err.Error() + ")"
	} else if caps, err := rt.Probe(ctx); err != nil {
		kvm += " (" + err.Error() + ")"
	} else if caps.Accel == "kvm" {
		return runtimeChoice{name: "qemu", why: "auto: KVM works here (" + caps.AccelReason + ")"}
	} else {
		kvm = "no usable KVM (" + caps.AccelReason + ")"
	}
	if err := gvisorUsable(ctx, g); err != nil {
		c := runtimeChoice{name: "qemu", why: fmt.Sprintf("auto: %s and gvisor unusable (%v): qemu on TCG, slow", kvm, err)}
		g.log.Warn("runtime", "choice", c.name, "why", c.why)
		return c
	}
	return runtimeChoice{name: "gvisor", why: "auto: " + kvm + "; gvisor (runsc) starts faster than a TCG guest"}
}

// gvisorUsable probes runsc and the agent binary.
func gvisorUsable(ctx context.Context, g *globals) error {
	agent, err := agentPath("")
	if err != nil {
		return err
	}
	rt, err := gvisor.New(gvisor.Config{AgentPath: agent, VersionCache: statedir.Layout{Root: g.stateDir}.RunscVersion(), Logger: g.log})
	if err != nil {
		return err
	}
	_, err = rt.Probe(ctx)
	return err
}
