package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// WarmPoolResource is the SandboxWarmPool custom resource.
var WarmPoolResource = schema.GroupVersionResource{Group: "airlock.dev", Version: "v1alpha1", Resource: "sandboxwarmpools"}

// MaxWarmPerNode bounds a pool's perNode.
const MaxWarmPerNode = 64

// WarmPoolSpec is a SandboxWarmPool's spec: what each node keeps ready.
type WarmPoolSpec struct {
	Image     string `json:"image,omitempty"`     // an image name on the nodes; default "base"
	CPUs      int    `json:"cpus,omitempty"`      // default 1
	MemoryMiB int    `json:"memoryMiB,omitempty"` // default 512
	// Runtime, if set ("qemu" or "gvisor"), limits the pool to nodes that run it; others keep none.
	Runtime string `json:"runtime,omitempty"`
	PerNode int    `json:"perNode"` // sandboxes kept ready on each node, 0..MaxWarmPerNode
}

// WarmPoolState is how far one node's pool is filled.
type WarmPoolState struct {
	Ready int    `json:"ready"`           // started, unclaimed
	Size  int    `json:"size"`            // what the node aims for
	Error string `json:"error,omitempty"` // why the last fill failed (one line), or why the spec was refused
}

// WarmTarget is the node's pools (the sandbox manager, adapted by the command).
// WarmPools calls it from one goroutine at a time, and with names it may
// never have been given (a pool refused, or deleted while the node was down).
type WarmTarget interface {
	// SetWarmPool creates or changes pool name; an error means the spec is refused (it is shown in the status).
	SetWarmPool(name string, spec WarmPoolSpec) error
	// DeleteWarmPool drops pool name and its unclaimed sandboxes.
	// It is idempotent: an unknown name is no error.
	DeleteWarmPool(name string)
	// WarmPoolState reports pool name on this node.
	WarmPoolState(name string) WarmPoolState
}

// WarmPools reconciles the namespace's SandboxWarmPools onto one node's Target.
type WarmPools struct {
	NodeController
	Target WarmTarget
}

const (
	// warmFilling is how often a pool that is not full is looked at again:
	// that is how its readiness reaches the status while it fills.
	warmFilling = 2 * time.Second
	// warmSteady is the same for a full pool (or one the node keeps none of).
	warmSteady = 30 * time.Second
)

// Run reconciles until ctx ends (perNode: an informer and a work queue on
// client-go; every node reconciles for itself).
func (w *WarmPools) Run(ctx context.Context) error {
	if w.Target == nil {
		return errors.New("warm pools: no Target")
	}
	r := &warmPoolReconciler{runtimes: slices.Clone(w.Runtimes), target: w.Target, log: cmp.Or(w.Log, slog.Default())}
	return w.controller("warm pools", WarmPoolResource, r.reconcile).run(ctx)
}

// warmPoolReconciler applies one pool at a time to the node's target.
type warmPoolReconciler struct {
	runtimes []string
	target   WarmTarget
	log      *slog.Logger
}

// reconcile makes the node's pool name what spec says and returns the
// node's status entry and when to look again: soon while the pool fills
// (that is how its readiness reaches the status).
func (r *warmPoolReconciler) reconcile(_ context.Context, name string, spec map[string]any, deleted bool) (nodeEntry, time.Duration) {
	if deleted {
		r.target.DeleteWarmPool(name)
		return nil, 0
	}
	st := r.apply(name, spec)
	if st.Ready != st.Size {
		return st.entry(), warmFilling
	}
	return st.entry(), warmSteady
}

// entry is st as a node's entry of a pool's status.
func (st WarmPoolState) entry() nodeEntry {
	return nodeEntry{"ready": st.Ready, "size": st.Size, "error": st.Error}
}

// apply gives pool name its spec (refused: the node keeps none) and says
// where the node's pool stands.
func (r *warmPoolReconciler) apply(name string, obj map[string]any) WarmPoolState {
	spec, err := warmPoolSpecFrom(obj)
	if err == nil && spec.Runtime != "" && !slices.Contains(r.runtimes, spec.Runtime) {
		// Not for this node: it keeps none, and that is no error.
		spec.PerNode = 0
		if err := r.target.SetWarmPool(name, spec); err != nil {
			r.target.DeleteWarmPool(name)
		}
		return WarmPoolState{}
	}
	if err == nil {
		err = r.target.SetWarmPool(name, spec)
	}
	if err != nil {
		r.log.Warn("warm pool refused", "pool", name, "err", err)
		r.target.DeleteWarmPool(name)
		return WarmPoolState{Error: oneLine(err.Error())}
	}
	st := r.target.WarmPoolState(name)
	st.Error = oneLine(st.Error)
	return st
}

// warmStatusStale reports whether u's status.nodes entry for node differs
// from st, or was updated statusEvery or longer ago (or never).
func warmStatusStale(u *unstructured.Unstructured, node string, st WarmPoolState, now time.Time) bool {
	return entryStale(u, node, st.entry(), now)
}

// warmImage is what an image name may be.
var warmImage = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`) })

// warmPoolSpecFrom decodes a SandboxWarmPool's spec, fills its defaults
// and checks it (the CRD's schema checks the same; this is for an object
// stored before it did, or written around it).
func warmPoolSpecFrom(obj map[string]any) (WarmPoolSpec, error) {
	var s WarmPoolSpec
	if obj == nil {
		return s, errors.New("no spec")
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &s); err != nil {
		return s, fmt.Errorf("spec: %w", err)
	}
	if s.Image == "" {
		s.Image = "base"
	}
	if s.CPUs == 0 {
		s.CPUs = 1
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = 512
	}
	switch {
	case s.PerNode < 0 || s.PerNode > MaxWarmPerNode:
		return s, fmt.Errorf("spec.perNode %d: want 0 to %d", s.PerNode, MaxWarmPerNode)
	case s.Runtime != "" && s.Runtime != "qemu" && s.Runtime != "gvisor":
		return s, fmt.Errorf("spec.runtime %q: want qemu, gvisor or none", s.Runtime)
	case !warmImage().MatchString(s.Image):
		return s, fmt.Errorf("spec.image %q: lower-case letters, digits, '.', '_' and '-', at most 63", s.Image)
	case s.CPUs < 1 || s.CPUs > 64:
		return s, fmt.Errorf("spec.cpus %d: want 1 to 64", s.CPUs)
	case s.MemoryMiB < 128 || s.MemoryMiB > 65536:
		return s, fmt.Errorf("spec.memoryMiB %d: want 128 to 65536", s.MemoryMiB)
	}
	return s, nil
}
