package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
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
	Config    *rest.Config
	Namespace string   // DefaultNamespace if empty
	Node      string   // this node's name (ValidNodeName)
	Runtimes  []string // the runtimes this node runs
	Target    WarmTarget
	Log       *slog.Logger
}

const (
	// warmFilling is how often a pool that is not full is looked at again:
	// that is how its readiness reaches the status while it fills.
	warmFilling = 2 * time.Second
	// warmSteady is the same for a full pool (or one the node keeps none of).
	warmSteady = 30 * time.Second
	// maxWarmError bounds the error a node writes into a pool's status
	// (the CRD's schema allows 1024 characters).
	maxWarmError = 512
)

// Run reconciles until ctx ends.
//
// It is the controller pattern on client-go's pieces, which the binary
// links already: an informer on the dynamic client watching the
// namespace's SandboxWarmPools, and a rate-limited work queue of pool
// names, one worker. (controller-runtime does the same; it links the
// typed clientset and every API group's types, which made airlock 25 MB
// larger and each of its processes, every sandbox's shim included, start
// with 18 MB more resident memory.) No leader election: every node
// reconciles for itself.
func (w *WarmPools) Run(ctx context.Context) error {
	if err := ValidNodeName(w.Node); err != nil {
		return err
	}
	if w.Target == nil {
		return errors.New("warm pools: no Target")
	}
	ns := cmp.Or(w.Namespace, DefaultNamespace)
	log := cmp.Or(w.Log, slog.Default()).With("component", "warmpool", "node", w.Node)
	dyn, err := dynamic.NewForConfig(w.Config)
	if err != nil {
		return fmt.Errorf("warm pools: %w", err)
	}
	ri := dyn.Resource(WarmPoolResource).Namespace(ns)
	inf := namespacedInformer(ri, "")
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "sandboxwarmpool-" + w.Node})
	defer q.ShutDown()
	enqueue := func(o any) {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if u, ok := o.(*unstructured.Unstructured); ok {
			q.Add(u.GetName())
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		// Spec changes and deletions; status writes (every node's) are
		// not events: each node requeues its own pools.
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*unstructured.Unstructured)
			c, ok2 := cur.(*unstructured.Unstructured)
			if !ok1 || !ok2 || o.GetGeneration() != c.GetGeneration() || c.GetDeletionTimestamp() != nil {
				enqueue(cur)
			}
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("warm pools: the SandboxWarmPool watch did not sync (is deploy/kubernetes applied?)")
	}
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	r := &warmPoolReconciler{
		store: inf.GetStore(), pools: ri, namespace: ns, node: w.Node, runtimes: slices.Clone(w.Runtimes),
		target: w.Target, log: log, now: time.Now,
	}
	log.Info("warm pools: reconciling", "namespace", ns)
	for {
		name, quit := q.Get()
		if quit {
			return nil
		}
		after, err := r.reconcile(ctx, name)
		q.Done(name)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				log.Warn("warm pools: reconcile", "pool", name, "err", err)
			}
			q.AddRateLimited(name)
		case after > 0:
			q.Forget(name)
			q.AddAfter(name, after)
		default:
			q.Forget(name)
		}
	}
}

// warmPoolReconciler applies one pool at a time to the node's target and
// writes the node's entry of its status.
type warmPoolReconciler struct {
	store     cache.Store // the informer's: the pools as last seen
	pools     dynamic.ResourceInterface
	namespace string
	node      string
	runtimes  []string
	target    WarmTarget
	log       *slog.Logger
	now       func() time.Time
}

// reconcile makes the node's pool name what the object says, and returns
// when to look at it again (0: on its next change).
func (r *warmPoolReconciler) reconcile(ctx context.Context, name string) (time.Duration, error) {
	o, exists, err := r.store.GetByKey(r.namespace + "/" + name)
	if err != nil {
		return 0, err
	}
	u, _ := o.(*unstructured.Unstructured)
	if !exists || u == nil || u.GetDeletionTimestamp() != nil {
		// Its status goes with the object: nothing else to clean.
		r.target.DeleteWarmPool(name)
		return 0, nil
	}
	spec, _ := u.Object["spec"].(map[string]any)
	st := r.apply(name, spec)
	if err := r.writeStatus(ctx, u, st); err != nil {
		return 0, err
	}
	if st.Ready != st.Size {
		return warmFilling, nil
	}
	return warmSteady, nil
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

// writeStatus writes st as the node's entry of u's status.nodes, unless the
// entry already says so and is younger than statusEvery. It is a JSON merge
// patch of the status subresource that names only the node's key, so the
// nodes never conflict.
func (r *warmPoolReconciler) writeStatus(ctx context.Context, u *unstructured.Unstructured, st WarmPoolState) error {
	now := r.now()
	if !warmStatusStale(u, r.node, st, now) {
		return nil
	}
	var errValue any // null: a merge patch then drops an earlier error
	if st.Error != "" {
		errValue = st.Error
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"nodes": map[string]any{r.node: map[string]any{
		"ready": st.Ready, "size": st.Size, "error": errValue, "updated": now.UTC().Format(time.RFC3339),
	}}}})
	if err != nil {
		return err
	}
	_, err = r.pools.Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("sandboxwarmpool %s: write node %s's status: %w", u.GetName(), r.node, err)
	}
	return nil
}

// warmStatusStale reports whether u's status.nodes entry for node differs
// from st, or was updated statusEvery or longer ago (or never).
func warmStatusStale(u *unstructured.Unstructured, node string, st WarmPoolState, now time.Time) bool {
	cur, ok, _ := unstructured.NestedMap(u.Object, "status", "nodes", node)
	if !ok {
		return true
	}
	ready, _, _ := unstructured.NestedInt64(cur, "ready")
	size, _, _ := unstructured.NestedInt64(cur, "size")
	msg, _, _ := unstructured.NestedString(cur, "error")
	updated, _, _ := unstructured.NestedString(cur, "updated")
	at, err := time.Parse(time.RFC3339, updated)
	return err != nil || ready != int64(st.Ready) || size != int64(st.Size) || msg != st.Error || now.Sub(at) >= statusEvery
}

// warmImage is what an image name may be.
var warmImage = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

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
	case !warmImage.MatchString(s.Image):
		return s, fmt.Errorf("spec.image %q: lower-case letters, digits, '.', '_' and '-', at most 63", s.Image)
	case s.CPUs < 1 || s.CPUs > 64:
		return s, fmt.Errorf("spec.cpus %d: want 1 to 64", s.CPUs)
	case s.MemoryMiB < 128 || s.MemoryMiB > 65536:
		return s, fmt.Errorf("spec.memoryMiB %d: want 128 to 65536", s.MemoryMiB)
	}
	return s, nil
}

// oneLine is msg on one line, at most maxWarmError bytes (cut on a rune).
func oneLine(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) <= maxWarmError {
		return msg
	}
	cut := maxWarmError
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}
