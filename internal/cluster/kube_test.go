package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
)

// as is cfg acting as a service account of the airlock namespace, so the
// test runs with the rights deploy/kubernetes/rbac.yaml gives, not an
// admin's.
func as(cfg *rest.Config, sa string) *rest.Config {
	return kubetest.As(cfg, "system:serviceaccount:airlock:"+sa, "system:serviceaccounts", "system:serviceaccounts:airlock")
}

// cuttable is a node's API connection that the test can cut, as a
// crashed or partitioned node's is: every request fails from then on.
type cuttable struct {
	cut  atomic.Bool
	next http.RoundTripper
}

func (c *cuttable) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.cut.Load() {
		return nil, errors.New("test: the node's connection is cut")
	}
	return c.next.RoundTrip(r)
}

type testNodeProc struct {
	name   string
	cut    *cuttable
	cancel context.CancelFunc
	done   chan error
	status atomic.Pointer[Node]
}

func startNode(t *testing.T, cfg *rest.Config, name string) *testNodeProc {
	t.Helper()
	p := &testNodeProc{name: name, cut: &cuttable{}, done: make(chan error, 1)}
	c := as(cfg, "airlock-node")
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { p.cut.next = rt; return p.cut }
	n := Node{Address: "https://" + name + ".test:7443", Runtimes: []string{"qemu", "gvisor"}, Arch: "amd64", Accel: "kvm",
		Kernel: "6.1.0-test", Version: "test", CPUs: 16, MemoryMiB: 65536}
	p.status.Store(&n)
	r := &Registrar{
		Dynamic: dynamic.NewForConfigOrDie(c), Name: name,
		Status: func(context.Context) (Node, error) { return *p.status.Load(), nil },
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-p.done; err != nil {
			t.Errorf("node %s: %v", name, err)
		}
	})
	return p
}

// TestNodesRegisterAndAreLost runs the registration against a real API
// server with the manifests' rights: three nodes register and become live
// with the capacity they publish; a name cannot be taken twice; a status
// change reaches the control tier; a node whose connection is cut is lost
// within the Lease duration and gets no placements; a node that stops
// cleanly is gone at once.
func TestNodesRegisterAndAreLost(t *testing.T) {
	cp := kubetest.Start(t)
	kubetest.Apply(t, cp.Config, filepath.Join("..", "..", "deploy", "kubernetes"))
	ctx := t.Context()

	control := as(cp.Config, "airlock-control")
	type lossEvent struct {
		n   Node
		why string
		at  time.Time
	}
	var mu sync.Mutex
	var losses []lossEvent
	lives := map[string]int{}
	liveAt := map[string]string{} // the address OnLive was given last
	reg := &Registry{Dynamic: dynamic.NewForConfigOrDie(control),
		OnLost: func(n Node, why string) {
			mu.Lock()
			defer mu.Unlock()
			losses = append(losses, lossEvent{n, why, time.Now()})
		},
		OnLive: func(n Node) {
			mu.Lock()
			defer mu.Unlock()
			lives[n.Name]++
			liveAt[n.Name] = n.Address
		}}
	livesOf := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return lives[name]
	}
	rctx, rcancel := context.WithCancel(ctx)
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-regDone; err != nil {
			t.Errorf("registry: %v", err)
		}
	}()
	if err := reg.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}

	nodes := map[string]*testNodeProc{}
	for _, name := range []string{"n1", "n2", "n3"} {
		nodes[name] = startNode(t, cp.Config, name)
	}
	liveNames := func() string {
		var out []string
		for _, n := range reg.Nodes() {
			if n.Live {
				out = append(out, n.Name)
			}
		}
		return strings.Join(out, ",")
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { return liveNames() == "n1,n2,n3" }) {
		t.Fatalf("live nodes: %q, want n1,n2,n3", liveNames())
	}
	for _, n := range reg.Nodes() {
		if n.CPUs != 16 || n.MemoryMiB != 65536 || n.Address != "https://"+n.Name+".test:7443" || n.Kernel != "6.1.0-test" || n.LeaseDuration != DefaultLeaseDuration {
			t.Fatalf("node as the control tier sees it: %+v", n)
		}
	}

	// The node identity may not list other nodes' objects.
	nodeDyn := dynamic.NewForConfigOrDie(as(cp.Config, "airlock-node"))
	if _, err := nodeDyn.Resource(NodeResource).Namespace(DefaultNamespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a node listed the AirlockNodes: %v", err)
	}

	// A second process with a live node's name is refused.
	dup := &Registrar{Dynamic: nodeDyn, Name: "n1",
		Status: func(context.Context) (Node, error) { return Node{}, nil }}
	if err := dup.Run(ctx); err == nil || !strings.Contains(err.Error(), "is taken") {
		t.Fatalf("a second n1: %v", err)
	}

	// A status change reaches the registry.
	busy := *nodes["n2"].status.Load()
	busy.Sandboxes, busy.AllocatedCPUs, busy.AllocatedMemoryMiB = 5, 10, 20480
	nodes["n2"].status.Store(&busy)
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		for _, n := range reg.Nodes() {
			if n.Name == "n2" {
				return n.Sandboxes == 5 && n.AllocatedMemoryMiB == 20480
			}
		}
		return false
	}) {
		t.Fatalf("n2's new status never arrived: %+v", reg.Nodes())
	}

	// A node that goes silent (crashed, partitioned) is lost within its
	// Lease's duration, and nothing is placed on it after.
	cutAt := time.Now()
	nodes["n3"].cut.cut.Store(true)
	lossCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(losses)
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { return lossCount() == 1 }) || liveNames() != "n1,n2" {
		t.Fatalf("30 s after n3's connection was cut: live %q, %d losses", liveNames(), lossCount())
	}
	mu.Lock()
	if len(losses) != 1 || losses[0].n.Name != "n3" || !strings.Contains(losses[0].why, "not renewed") {
		t.Fatalf("losses: %+v", losses)
	}
	took := losses[0].at.Sub(cutAt)
	mu.Unlock()
	if took > DefaultLeaseDuration+2*checkEvery+time.Second {
		t.Errorf("n3 lost %s after its connection was cut; the Lease lasts %s", took, DefaultLeaseDuration)
	}
	t.Logf("a silent node was lost %s after it went silent (lease %s)", took.Round(10*time.Millisecond), DefaultLeaseDuration)
	for range 50 {
		n, err := Place(reg.Nodes(), Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512}, Limits{}, DefaultChoices, nil)
		if err != nil || n.Name == "n3" {
			t.Fatalf("placed on %q: %v", n.Name, err)
		}
	}
	// Each node was live once (OnLive); n3, its connection back, is live
	// again, and OnLive says so a second time.
	for _, name := range []string{"n1", "n2", "n3"} {
		if livesOf(name) != 1 {
			t.Fatalf("OnLive for %s: %d calls, want 1", name, livesOf(name))
		}
	}
	nodes["n3"].cut.cut.Store(false)
	if !testutil.WaitFor(t, 30*time.Second, func() bool { return livesOf("n3") == 2 && liveNames() == "n1,n2,n3" }) {
		t.Fatalf("n3 reconnected: live %q, OnLive for n3 %d times", liveNames(), livesOf("n3"))
	}

	// A clean stop deletes the Lease: the node is gone at once.
	stopAt := time.Now()
	nodes["n1"].cancel()
	if err := <-nodes["n1"].done; err != nil {
		t.Fatalf("n1 stopped with %v", err)
	}
	nodes["n1"].done <- nil // for the cleanup
	if !testutil.WaitFor(t, 5*time.Second, func() bool { return lossCount() == 2 }) || liveNames() != "n2,n3" {
		t.Fatalf("after n1 stopped: live %q, %d losses", liveNames(), lossCount())
	}
	mu.Lock()
	lost := slices.Clone(losses)
	mu.Unlock()
	if len(lost) != 2 || lost[1].n.Name != "n1" || !strings.Contains(lost[1].why, "deleted") {
		t.Fatalf("losses: %+v", lost)
	}
	t.Logf("a stopped node was gone %s after it stopped", lost[1].at.Sub(stopAt).Round(10*time.Millisecond))
	if _, err := Place(reg.Nodes(), Request{Runtime: "gvisor", CPUs: 1, MemoryMiB: 512, Arch: "arm64"}, Limits{}, DefaultChoices, nil); err == nil {
		t.Fatal("placed an arm64 state on amd64 nodes")
	}

	// n1 starts again at another address. It holds its new Lease before
	// it publishes its status; until then the AirlockNode still names the
	// old address, and a node counted live then would be called there
	// (OnLive's reconcile was, and failed).
	gate := make(chan struct{})
	var gated atomic.Bool
	restarted := Node{Address: "https://n1-again.test:7443", Runtimes: []string{"qemu"}, Arch: "amd64", Accel: "kvm",
		Kernel: "6.1.0-test", Version: "test", CPUs: 16, MemoryMiB: 65536}
	again := &Registrar{Dynamic: nodeDyn, Name: "n1", Status: func(ctx context.Context) (Node, error) {
		if gated.CompareAndSwap(false, true) {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
		return restarted, nil
	}}
	actx, acancel := context.WithCancel(ctx)
	againDone := make(chan error, 1)
	go func() { againDone <- again.Run(actx) }()
	stopAgain := sync.OnceValue(func() error { acancel(); return <-againDone })
	defer stopAgain() //nolint:errcheck // checked below, on the path that gets there
	entryOf := func(name string) (lease bool, live bool, why string) {
		reg.mu.Lock()
		defer reg.mu.Unlock()
		e := reg.nodes[name]
		if e == nil {
			return false, false, ""
		}
		live, why = e.live(time.Now())
		return e.lease, live, why
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { l, _, _ := entryOf("n1"); return l && gated.Load() }) {
		t.Fatal("the registry never saw n1's new Lease")
	}
	if _, live, why := entryOf("n1"); live || !strings.Contains(why, "earlier run") {
		t.Fatalf("n1 holds a new Lease under its old status: live %v (%s)", live, why)
	}
	close(gate)
	if !testutil.WaitFor(t, 30*time.Second, func() bool { return livesOf("n1") == 2 }) {
		t.Fatalf("n1 published its new status and is not live: %+v", reg.Nodes())
	}
	mu.Lock()
	addr := liveAt["n1"]
	mu.Unlock()
	if addr != restarted.Address {
		t.Fatalf("n1, started again, was live at %q, want %q", addr, restarted.Address)
	}
	t.Logf("n1 started again at a new address: live only once it published it (%s)", addr)
	if err := stopAgain(); err != nil {
		t.Fatalf("n1, started again: %v", err)
	}

	// An operator drains n2 and n3 (kubectl patch): no more placements,
	// and the node's own status updates keep the operator's spec.
	admin := dynamic.NewForConfigOrDie(cp.Config)
	patch := []byte(`{"spec":{"draining":true}}`)
	for _, name := range []string{"n2", "n3"} {
		if _, err := admin.Resource(NodeResource).Namespace(DefaultNamespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	more := *nodes["n2"].status.Load()
	more.Sandboxes = 6
	nodes["n2"].status.Store(&more)
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		ns := reg.Nodes()
		return len(ns) == 3 && ns[1].Name == "n2" && ns[1].Draining && ns[1].Sandboxes == 6 && ns[2].Draining
	}) {
		t.Fatalf("n2 drained and updated: %+v", reg.Nodes())
	}
	if _, err := Place(reg.Nodes(), Request{Runtime: "qemu", CPUs: 1, MemoryMiB: 512}, Limits{}, DefaultChoices, nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("placed with every live node draining: %v", err)
	}
}

// TestWorkloadManifestsApply applies deploy/kubernetes/workloads (the
// base, the nodes' DaemonSet, the control tier's Deployment and Service,
// the bundle volume's claim) to a real API server with strict field
// validation, and reads back what the nodes and replicas depend on.
func TestWorkloadManifestsApply(t *testing.T) {
	cp := kubetest.Start(t)
	kubetest.Apply(t, cp.Config, filepath.Join("..", "..", "deploy", "kubernetes", "workloads"))
	ctx := t.Context()
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	get := func(group, version, resource, name string) *unstructured.Unstructured {
		t.Helper()
		u, err := dyn.Resource(schema.GroupVersionResource{Group: group, Version: version, Resource: resource}).Namespace(DefaultNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s %s: %v", resource, name, err)
		}
		return u
	}
	ds := get("apps", "v1", "daemonsets", "airlock-node")
	sa, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "serviceAccountName")
	hostNet, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostNetwork")
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if sa != "airlock-node" || !hostNet || len(containers) != 1 || !strings.Contains(fmt.Sprint(containers[0]), "--bundle-dir=/var/lib/airlock-bundles") {
		t.Fatalf("the nodes' DaemonSet: sa %q, hostNetwork %v, containers %v", sa, hostNet, containers)
	}
	dep := get("apps", "v1", "deployments", "airlock-control")
	sa, _, _ = unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	nonRoot, _, _ := unstructured.NestedBool(dep.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot")
	replicas, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas")
	if sa != "airlock-control" || !nonRoot || replicas != 2 {
		t.Fatalf("the control tier's Deployment: sa %q, runAsNonRoot %v, replicas %d", sa, nonRoot, replicas)
	}
	get("", "v1", "services", "airlock")
	get("", "v1", "persistentvolumeclaims", "airlock-bundles")
}
