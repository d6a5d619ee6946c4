package cluster

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// NodeController is what a node's controllers of the cluster's custom
// resources (WarmPools, Templates) share.
type NodeController struct {
	Config    *rest.Config
	Namespace string   // DefaultNamespace if empty
	Node      string   // this node's name (ValidNodeName)
	Runtimes  []string // the runtimes this node runs
	Log       *slog.Logger
}

// controller is the perNode controller of res, applying with apply.
func (c NodeController) controller(what string, res schema.GroupVersionResource, apply func(context.Context, string, map[string]any, bool) (nodeEntry, time.Duration)) *perNode {
	return &perNode{what: what, res: res, config: c.Config, namespace: c.Namespace, node: c.Node, log: c.Log, apply: apply}
}

// perNode is the controller pattern for a namespaced resource that every
// node applies for itself (SandboxWarmPool, SandboxTemplate) and reports
// on in its own entry of the object's status.nodes.
//
// It is built on client-go's pieces, which the binary links already: an
// informer on the dynamic client and a rate-limited work queue of object
// names, one worker. (controller-runtime does the same; it links the
// typed clientset and every API group's types, which made airlock 25 MB
// larger and each of its processes, every sandbox's shim included, start
// with 18 MB more resident memory.) No leader election: each node
// reconciles for itself, and writes its entry with a JSON merge patch of
// the status subresource that names only its key, so nodes never
// conflict.
type perNode struct {
	what      string // for logs: "warm pools"
	res       schema.GroupVersionResource
	config    *rest.Config
	namespace string // DefaultNamespace if empty
	node      string
	log       *slog.Logger
	// apply makes this node's part of object name what spec says
	// (deleted: the object is gone) and returns the node's status entry
	// (nil: write none) and when to look again (0: at its next change).
	// It is called from one goroutine.
	apply func(ctx context.Context, name string, spec map[string]any, deleted bool) (nodeEntry, time.Duration)
	now   func() time.Time // time.Now if nil
}

// nodeEntry is one node's entry of an object's status.nodes; its values
// are strings and integers, and an empty string is the same as none.
type nodeEntry map[string]any

// maxEntryString bounds a string a node writes into an entry (the CRDs'
// schemas allow 1024 characters).
const maxEntryString = 512

func (c *perNode) run(ctx context.Context) error {
	if err := ValidNodeName(c.node); err != nil {
		return err
	}
	ns := cmp.Or(c.namespace, DefaultNamespace)
	log := cmp.Or(c.log, slog.Default()).With("component", c.res.Resource, "node", c.node)
	if c.now == nil {
		c.now = time.Now
	}
	dyn, err := dynamic.NewForConfig(c.config)
	if err != nil {
		return fmt.Errorf("%s: %w", c.what, err)
	}
	ri := dyn.Resource(c.res).Namespace(ns)
	inf := namespacedInformer(ri, "")
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: c.res.Resource + "-" + c.node})
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
		// not events: each node requeues its own objects.
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*unstructured.Unstructured)
			n, ok2 := cur.(*unstructured.Unstructured)
			if !ok1 || !ok2 || o.GetGeneration() != n.GetGeneration() || n.GetDeletionTimestamp() != nil {
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
		return fmt.Errorf("%s: the %s watch did not sync (is deploy/kubernetes applied?)", c.what, c.res.Resource)
	}
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	log.Info(c.what+": reconciling", "namespace", ns)
	for {
		name, quit := q.Get()
		if quit {
			return nil
		}
		after, err := c.reconcile(ctx, inf.GetStore(), ri, ns, name)
		q.Done(name)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				log.Warn(c.what+": reconcile", "name", name, "err", err)
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

// reconcile applies object name as the informer last saw it and writes
// the node's entry.
func (c *perNode) reconcile(ctx context.Context, st cache.Store, ri dynamic.ResourceInterface, ns, name string) (time.Duration, error) {
	o, exists, err := st.GetByKey(ns + "/" + name)
	if err != nil {
		return 0, err
	}
	u, _ := o.(*unstructured.Unstructured)
	if !exists || u == nil || u.GetDeletionTimestamp() != nil {
		// Its status goes with the object: nothing else to clean.
		_, after := c.apply(ctx, name, nil, true)
		return after, nil
	}
	spec, _ := u.Object["spec"].(map[string]any)
	e, after := c.apply(ctx, name, spec, false)
	if e == nil {
		return after, nil
	}
	if err := c.writeEntry(ctx, ri, u, e); err != nil {
		return 0, err
	}
	return after, nil
}

// writeEntry writes e as the node's entry of u's status.nodes, unless the
// entry already says so and is younger than statusEvery.
func (c *perNode) writeEntry(ctx context.Context, ri dynamic.ResourceInterface, u *unstructured.Unstructured, e nodeEntry) error {
	now := c.now()
	if !entryStale(u, c.node, e, now) {
		return nil
	}
	out := map[string]any{"updated": now.UTC().Format(time.RFC3339)}
	for k, v := range e {
		if s, ok := v.(string); ok && s == "" {
			v = nil // null: a merge patch drops what an earlier entry said
		}
		out[k] = v
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"nodes": map[string]any{c.node: out}}})
	if err != nil {
		return err
	}
	_, err = ri.Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("%s %s: write node %s's status: %w", c.res.Resource, u.GetName(), c.node, err)
	}
	return nil
}

// entryStale reports whether u's status.nodes entry for node differs from
// e, or was updated statusEvery or longer ago (or never).
func entryStale(u *unstructured.Unstructured, node string, e nodeEntry, now time.Time) bool {
	cur, ok, _ := unstructured.NestedMap(u.Object, "status", "nodes", node)
	if !ok {
		return true
	}
	// norm makes integers int64 (the API server's) and an absent value
	// the zero of its kind.
	norm := func(v, like any) any {
		switch v := v.(type) {
		case int:
			return int64(v)
		case nil:
			switch like.(type) {
			case int, int64:
				return int64(0)
			}
			return ""
		}
		return v
	}
	for k, v := range e {
		if norm(v, v) != norm(cur[k], v) {
			return true
		}
	}
	for k, v := range cur {
		if _, ok := e[k]; !ok && k != "updated" && norm(v, "") != "" {
			return true
		}
	}
	at, err := time.Parse(time.RFC3339, fmt.Sprint(cur["updated"]))
	return err != nil || now.Sub(at) >= statusEvery
}

// oneLine is msg on one line, at most maxEntryString bytes (cut on a
// rune).
func oneLine(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) <= maxEntryString {
		return msg
	}
	cut := maxEntryString
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}
