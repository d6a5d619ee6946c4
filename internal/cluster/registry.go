package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// Registry is the control tier's view of the nodes: it watches their
// Leases and AirlockNodes and knows which nodes are live. A node is live
// while the Registry has seen its Lease renewed within the Lease's
// duration, measured on the Registry's own clock (as Kubernetes' node
// lifecycle controller does), so skew between hosts does not matter.
type Registry struct {
	Dynamic   dynamic.Interface // see Registrar.Dynamic
	Namespace string            // DefaultNamespace if empty
	// OnLost is called (from the Registry's goroutine, one call at a
	// time) once each time a live node stops being live, with why.
	OnLost func(n Node, why string)
	// OnLive is called the same way each time a node becomes live: when
	// the Registry first sees it, and when a lost node comes back.
	OnLive func(n Node)
	Log    *slog.Logger

	mu     sync.Mutex
	nodes  map[string]*entry
	synced chan struct{}
	tmpls  cache.SharedIndexInformer // the SandboxTemplates (TemplateNodes)
}

type entry struct {
	node      Node // from the AirlockNode (zero Name: none seen yet)
	published bool // the AirlockNode has a status
	// writer is the Lease holder that wrote the status: the node is live
	// only when it is the Lease's holder now.
	writer   string
	lease    bool // the Lease exists
	holder   string
	renew    time.Time // the Lease's renewTime, as written
	observed time.Time // when the Registry saw renew change
	duration time.Duration
	wasLive  bool
}

// checkEvery is how often the Registry looks for nodes that went silent.
const checkEvery = 500 * time.Millisecond

// Run watches until ctx ends.
func (r *Registry) Run(ctx context.Context) error {
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	if r.Log == nil {
		r.Log = slog.Default()
	}
	r.mu.Lock()
	if r.nodes == nil {
		r.nodes = map[string]*entry{}
	}
	if r.synced == nil {
		r.synced = make(chan struct{})
	}
	r.mu.Unlock()
	li := r.informer(leaseResource, componentLabel+"=node")
	if _, err := li.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.leaseSeen(o) },
		UpdateFunc: func(_, o any) { r.leaseSeen(o) },
		DeleteFunc: func(o any) { r.leaseGone(o) },
	}); err != nil {
		return err
	}
	ni := r.informer(NodeResource, "")
	if _, err := ni.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.nodeSeen(o) },
		UpdateFunc: func(_, o any) { r.nodeSeen(o) },
		DeleteFunc: func(o any) { r.nodeGone(o) },
	}); err != nil {
		return err
	}
	// The SandboxTemplates are watched too, but not waited for: a cluster
	// applied before they existed still places sandboxes (TemplateNodes
	// then restricts nothing).
	ti := r.informer(TemplateResource, "")
	r.mu.Lock()
	r.tmpls = ti
	r.mu.Unlock()
	go ti.RunWithContext(ctx)
	go li.RunWithContext(ctx)
	go ni.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), li.HasSynced, ni.HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("cluster registry: the Lease and AirlockNode watches did not sync")
	}
	close(r.synced)
	tick := time.NewTicker(checkEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			r.check()
		}
	}
}

// informer watches one resource of the namespace (label selector sel).
func (r *Registry) informer(res schema.GroupVersionResource, sel string) cache.SharedIndexInformer {
	return namespacedInformer(r.Dynamic.Resource(res).Namespace(r.Namespace), sel)
}

// namespacedInformer watches what ri lists (label selector sel). It is
// client-go's informer on the dynamic client, built by hand: the informer
// factories link every API group's types into the binary.
func namespacedInformer(ri dynamic.ResourceInterface, sel string) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return ri.Watch(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
}

// TemplateNodes says which nodes have built template name of tenant, if
// a SandboxTemplate declares it (declared false: none does, or the
// Registry has not listed the templates yet). The nodes are sorted.
func (r *Registry) TemplateNodes(tenant, name string) (nodes []string, declared bool) {
	r.mu.Lock()
	ti := r.tmpls
	r.mu.Unlock()
	if ti == nil || !ti.HasSynced() {
		return nil, false
	}
	o, ok, _ := ti.GetStore().GetByKey(cmp.Or(r.Namespace, DefaultNamespace) + "/" + name)
	u, _ := o.(*unstructured.Unstructured)
	if !ok || u == nil {
		return nil, false
	}
	if t, _, _ := unstructured.NestedString(u.Object, "spec", "tenant"); t != tenant {
		return nil, false
	}
	nodes = []string{}
	byNode, _, _ := unstructured.NestedMap(u.Object, "status", "nodes")
	for node, e := range byNode {
		if m, ok := e.(map[string]any); ok && m["phase"] == TemplateReady {
			nodes = append(nodes, node)
		}
	}
	slices.Sort(nodes)
	return nodes, true
}

// WaitSynced waits until the Registry has listed every node once.
func (r *Registry) WaitSynced(ctx context.Context) error {
	r.mu.Lock()
	if r.synced == nil {
		r.synced = make(chan struct{})
	}
	ch := r.synced
	r.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Registry) entryLocked(name string) *entry {
	if r.nodes == nil {
		r.nodes = map[string]*entry{}
	}
	e := r.nodes[name]
	if e == nil {
		e = &entry{}
		r.nodes[name] = e
	}
	return e
}

func (r *Registry) leaseSeen(o any) {
	l, ok := asLease(o)
	if !ok || !strings.HasPrefix(l.Name, leasePrefix) {
		return
	}
	name := strings.TrimPrefix(l.Name, leasePrefix)
	var renew time.Time
	if l.Spec.RenewTime != nil {
		renew = l.Spec.RenewTime.Time
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entryLocked(name)
	if !e.lease || !renew.Equal(e.renew) || holder != e.holder {
		e.observed = time.Now()
	}
	e.lease, e.renew, e.holder = true, renew, holder
	e.duration = time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
}

func (r *Registry) leaseGone(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	l, ok := asLease(o)
	if !ok || !strings.HasPrefix(l.Name, leasePrefix) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.nodes[strings.TrimPrefix(l.Name, leasePrefix)]; e != nil {
		e.lease = false
	}
}

// asLease reads an informer's object as a Lease.
func asLease(o any) (*coordinationv1.Lease, bool) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	l, err := leaseFrom(u)
	return l, err == nil
}

func (r *Registry) nodeSeen(o any) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	n, published, writer, err := nodeFromObject(u)
	if err != nil {
		r.Log.Warn("cluster registry: an AirlockNode does not parse", "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entryLocked(n.Name)
	e.node, e.published, e.writer = n, published, writer
}

func (r *Registry) nodeGone(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.nodes[u.GetName()]; e != nil {
		e.node, e.published, e.writer = Node{}, false, ""
	}
}

// live reports whether e is live at now, and if not, why.
func (e *entry) live(now time.Time) (bool, string) {
	switch {
	case e.node.Name == "":
		return false, "it has no AirlockNode"
	case !e.published:
		return false, "its AirlockNode has no status yet"
	case !e.lease:
		return false, "its Lease was deleted (the node stopped)"
	case e.writer != e.holder:
		// Restarted: its address may have changed, and calls to the old
		// one would fail (a reconcile of a node back from a restart did).
		return false, "its AirlockNode's status is from an earlier run of the node (Lease holder " + e.holder + ", status written by " + cmp.Or(e.writer, "(none)") + ")"
	case now.Sub(e.observed) >= e.duration:
		return false, fmt.Sprintf("its Lease was not renewed for %s (lease duration %s)", now.Sub(e.observed).Round(100*time.Millisecond), e.duration)
	}
	return true, ""
}

func (e *entry) view(now time.Time) Node {
	n := e.node
	n.Live, _ = e.live(now)
	n.RenewedAt, n.LeaseDuration = e.observed, e.duration
	n.Runtimes = slices.Clone(n.Runtimes)
	return n
}

// check calls OnLost for each node that stopped being live, and OnLive
// for each that became live.
func (r *Registry) check() {
	now := time.Now()
	type loss struct {
		n   Node
		why string
	}
	var lost []loss
	var back []Node
	r.mu.Lock()
	for name, e := range r.nodes {
		live, why := e.live(now)
		if e.wasLive && !live {
			n := e.view(now)
			n.Name = name
			lost = append(lost, loss{n, why})
		}
		if !e.wasLive && live {
			back = append(back, e.view(now))
		}
		e.wasLive = live
		if !e.lease && e.node.Name == "" {
			delete(r.nodes, name)
		}
	}
	r.mu.Unlock()
	for _, l := range lost {
		r.Log.Warn("cluster: node lost", "node", l.n.Name, "why", l.why)
		if r.OnLost != nil {
			r.OnLost(l.n, l.why)
		}
	}
	for _, n := range back {
		r.Log.Info("cluster: node live", "node", n.Name)
		if r.OnLive != nil {
			r.OnLive(n)
		}
	}
}

// Nodes returns every node that has an AirlockNode, live or not, by name.
func (r *Registry) Nodes() []Node {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Node
	for _, e := range r.nodes {
		if e.node.Name != "" {
			out = append(out, e.view(now))
		}
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Name, b.Name) })
	return out
}
