package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
)

// fakeWarm is one node's pools, in memory: it records the calls, and
// reports ready as many as the test says (at most the pool's perNode).
type fakeWarm struct {
	mu     sync.Mutex
	pools  map[string]WarmPoolSpec
	calls  []string
	ready  int
	refuse map[string]error // by image: SetWarmPool refuses it
}

var _ WarmTarget = (*fakeWarm)(nil)

func newFakeWarm() *fakeWarm {
	return &fakeWarm{pools: map[string]WarmPoolSpec{}, refuse: map[string]error{}}
}

func (f *fakeWarm) SetWarmPool(name string, spec WarmPoolSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("set %s %d", name, spec.PerNode))
	if err := f.refuse[spec.Image]; err != nil {
		return err
	}
	f.pools[name] = spec
	return nil
}

func (f *fakeWarm) DeleteWarmPool(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "delete "+name)
	delete(f.pools, name)
}

func (f *fakeWarm) WarmPoolState(name string) WarmPoolState {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.pools[name]
	if !ok {
		return WarmPoolState{}
	}
	return WarmPoolState{Ready: min(f.ready, s.PerNode), Size: s.PerNode}
}

func (f *fakeWarm) setReady(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ready = n
}

// pool returns pool name's spec, if the node has it.
func (f *fakeWarm) pool(name string) (WarmPoolSpec, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.pools[name]
	return s, ok
}

func (f *fakeWarm) called(call string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.calls {
		if c == call {
			return true
		}
	}
	return false
}

func (f *fakeWarm) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("pools %v, calls %v", f.pools, f.calls)
}

// startWarmPools runs node's WarmPools until the test ends; its warnings
// are shown if the test fails.
func startWarmPools(t *testing.T, cfg *rest.Config, node string, runtimes []string, target WarmTarget) {
	t.Helper()
	logs := &testutil.Buffer{}
	w := &WarmPools{Target: target, NodeController: NodeController{Config: cfg, Node: node, Runtimes: runtimes,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("warm pools of %s: %v", node, err)
		}
		if t.Failed() {
			t.Logf("warm pools of %s, log:\n%s", node, logs)
		}
	})
}

// TestWarmPools runs two nodes' WarmPools against a real API server with
// the nodes' rights from deploy/kubernetes: a pool reaches the node that
// runs its runtime (defaults filled) and not the other, which keeps none;
// each node writes its own entry of the status, with the readiness its
// pools report; the schema refuses a bad pool; a spec the node refuses
// shows in its entry; a spec change and a deletion reach the nodes.
func TestWarmPools(t *testing.T) {
	cp := kubetest.Start(t)
	kubetest.Apply(t, cp.Config, filepath.Join("..", "..", "deploy", "kubernetes"))
	ctx := t.Context()
	node := as(cp.Config, "airlock-node")
	n1, n2 := newFakeWarm(), newFakeWarm()
	n1.refuse["missing"] = errors.New("image missing:\nnot on this node")
	startWarmPools(t, node, "n1", []string{"qemu", "gvisor"}, n1)
	startWarmPools(t, node, "n2", []string{"gvisor"}, n2)

	// An operator's (an admin's) client writes the pools.
	pools := dynamic.NewForConfigOrDie(cp.Config).Resource(WarmPoolResource).Namespace(DefaultNamespace)
	create := func(name string, spec map[string]any) error {
		u := warmPoolObject()
		u.SetNamespace(DefaultNamespace)
		u.SetName(name)
		u.Object["spec"] = spec
		_, err := pools.Create(ctx, u, metav1.CreateOptions{})
		return err
	}
	entry := func(pool, node string) (WarmPoolState, string, bool) {
		u, err := pools.Get(ctx, pool, metav1.GetOptions{})
		if err != nil {
			return WarmPoolState{}, err.Error(), false
		}
		m, ok, _ := unstructured.NestedMap(u.Object, "status", "nodes", node)
		ready, _, _ := unstructured.NestedInt64(m, "ready")
		size, _, _ := unstructured.NestedInt64(m, "size")
		msg, _, _ := unstructured.NestedString(m, "error")
		return WarmPoolState{Ready: int(ready), Size: int(size), Error: msg}, fmt.Sprint(u.Object["status"]), ok
	}
	waitEntry := func(pool, node string, want WarmPoolState) {
		t.Helper()
		var status string
		if !testutil.WaitFor(t, 30*time.Second, func() bool {
			var got WarmPoolState
			var ok bool
			got, status, ok = entry(pool, node)
			return ok && got == want
		}) {
			t.Fatalf("pool %s: status %s, want nodes.%s = %+v", pool, status, node, want)
		}
	}

	if err := create("py", map[string]any{"image": "base", "perNode": 2, "runtime": "qemu"}); err != nil {
		t.Fatal(err)
	}
	want := WarmPoolSpec{Image: "base", CPUs: 1, MemoryMiB: 512, Runtime: "qemu", PerNode: 2}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { s, _ := n1.pool("py"); return s == want }) {
		t.Fatalf("n1: %v; want pool py %+v", n1, want)
	}
	// n2 does not run qemu: it keeps none.
	if !testutil.WaitFor(t, 30*time.Second, func() bool { s, ok := n2.pool("py"); return ok && s.PerNode == 0 }) {
		t.Fatalf("n2: %v; want pool py kept at 0", n2)
	}
	waitEntry("py", "n1", WarmPoolState{Ready: 0, Size: 2})
	n1.setReady(2)
	waitEntry("py", "n1", WarmPoolState{Ready: 2, Size: 2})
	// Both nodes' entries are there: neither overwrote the other's.
	waitEntry("py", "n2", WarmPoolState{})
	if got, status, _ := entry("py", "n1"); got != (WarmPoolState{Ready: 2, Size: 2}) {
		t.Fatalf("n1's entry after n2's: %s", status)
	}

	// The schema refuses a bad pool before any node sees it.
	err := create("huge", map[string]any{"perNode": 1000})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.perNode") {
		t.Fatalf("a pool of 1000 per node: %v", err)
	}
	err = create("bad-image", map[string]any{"image": "../etc", "perNode": 1})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.image") {
		t.Fatalf("a pool of image ../etc: %v", err)
	}
	// Nodes read the pools but may not write them.
	nodePools := dynamic.NewForConfigOrDie(node).Resource(WarmPoolResource).Namespace(DefaultNamespace)
	if _, err := nodePools.Patch(ctx, "py", types.MergePatchType, []byte(`{"spec":{"perNode":5}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a node changed a pool's spec: %v", err)
	}

	// A spec the node refuses is shown in its entry, on one line; the
	// node keeps none of it.
	if err := create("gone", map[string]any{"image": "missing", "perNode": 1}); err != nil {
		t.Fatal(err)
	}
	waitEntry("gone", "n1", WarmPoolState{Error: "image missing: not on this node"})
	if _, ok := n1.pool("gone"); ok || !n1.called("delete gone") {
		t.Fatalf("n1 after refusing pool gone: %v", n1)
	}

	// A change of the spec reaches the node, and its entry.
	if _, err := pools.Patch(ctx, "py", types.MergePatchType, []byte(`{"spec":{"perNode":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { s, _ := n1.pool("py"); return s.PerNode == 3 }) {
		t.Fatalf("n1: %v; want pool py of 3", n1)
	}
	waitEntry("py", "n1", WarmPoolState{Ready: 2, Size: 3})

	// A deleted pool is dropped by every node.
	for _, name := range []string{"py", "gone"} {
		if err := pools.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		_, ok1 := n1.pool("py")
		_, ok2 := n2.pool("py")
		return !ok1 && !ok2 && n1.called("delete py") && n2.called("delete py")
	}) {
		t.Fatalf("pool py deleted: n1 %v; n2 %v", n1, n2)
	}
}

// TestWarmPoolSpec checks the defaults and limits a node applies to a
// spec (the same as the CRD's schema).
func TestWarmPoolSpec(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   map[string]any
		want WarmPoolSpec
		err  string // in the error; "" for none
	}{
		{in: map[string]any{"perNode": int64(2)}, want: WarmPoolSpec{Image: "base", CPUs: 1, MemoryMiB: 512, PerNode: 2}},
		{in: map[string]any{}, want: WarmPoolSpec{Image: "base", CPUs: 1, MemoryMiB: 512}},
		{
			in:   map[string]any{"image": "py-3.12_x", "cpus": int64(64), "memoryMiB": int64(65536), "runtime": "gvisor", "perNode": int64(MaxWarmPerNode)},
			want: WarmPoolSpec{Image: "py-3.12_x", CPUs: 64, MemoryMiB: 65536, Runtime: "gvisor", PerNode: MaxWarmPerNode},
		},
		{in: map[string]any{"cpus": int64(1), "memoryMiB": int64(128), "runtime": "qemu"}, want: WarmPoolSpec{Image: "base", CPUs: 1, MemoryMiB: 128, Runtime: "qemu"}},
		{in: nil, err: "no spec"},
		{in: map[string]any{"perNode": int64(-1)}, err: "spec.perNode -1"},
		{in: map[string]any{"perNode": int64(MaxWarmPerNode + 1)}, err: "spec.perNode 65"},
		{in: map[string]any{"runtime": "docker"}, err: "spec.runtime"},
		{in: map[string]any{"image": "../etc"}, err: "spec.image"},
		{in: map[string]any{"image": "Base"}, err: "spec.image"},
		{in: map[string]any{"image": "-base"}, err: "spec.image"},
		{in: map[string]any{"image": strings.Repeat("a", 64)}, err: "spec.image"},
		{in: map[string]any{"cpus": int64(-1)}, err: "spec.cpus"},
		{in: map[string]any{"cpus": int64(65)}, err: "spec.cpus"},
		{in: map[string]any{"memoryMiB": int64(127)}, err: "spec.memoryMiB"},
		{in: map[string]any{"memoryMiB": int64(65537)}, err: "spec.memoryMiB"},
		{in: map[string]any{"perNode": "two"}, err: "spec:"},
	} {
		got, err := warmPoolSpecFrom(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.in, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("%v: %+v, want %+v", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one with %q", tc.in, err, tc.err)
		}
	}
}

// TestWarmPoolStatusStale checks when a node rewrites its status entry:
// on any change, and otherwise once a minute.
func TestWarmPoolStatusStale(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	obj := func(entry map[string]any) *unstructured.Unstructured {
		u := warmPoolObject()
		if entry != nil {
			u.Object["status"] = map[string]any{"nodes": map[string]any{"n1": entry, "n2": map[string]any{"ready": int64(9)}}}
		}
		return u
	}
	at := func(d time.Duration) string { return now.Add(-d).Format(time.RFC3339) }
	st := WarmPoolState{Ready: 1, Size: 2}
	for _, tc := range []struct {
		name  string
		entry map[string]any
		st    WarmPoolState
		stale bool
	}{
		{"none", nil, st, true},
		{"same and fresh", map[string]any{"ready": int64(1), "size": int64(2), "updated": at(59 * time.Second)}, st, false},
		{"same but a minute old", map[string]any{"ready": int64(1), "size": int64(2), "updated": at(time.Minute)}, st, true},
		{"ready changed", map[string]any{"ready": int64(0), "size": int64(2), "updated": at(0)}, st, true},
		{"size changed", map[string]any{"ready": int64(1), "size": int64(3), "updated": at(0)}, st, true},
		{"error gone", map[string]any{"ready": int64(1), "size": int64(2), "error": "x", "updated": at(0)}, st, true},
		{"error came", map[string]any{"ready": int64(0), "size": int64(0), "updated": at(0)}, WarmPoolState{Error: "x"}, true},
		{"same error", map[string]any{"ready": int64(0), "size": int64(0), "error": "x", "updated": at(0)}, WarmPoolState{Error: "x"}, false},
		{"no time", map[string]any{"ready": int64(1), "size": int64(2)}, st, true},
	} {
		if got := warmStatusStale(obj(tc.entry), "n1", tc.st, now); got != tc.stale {
			t.Errorf("%s: stale %v, want %v", tc.name, got, tc.stale)
		}
	}
	if got := oneLine("a\n  b\tc"); got != "a b c" {
		t.Errorf("oneLine: %q", got)
	}
	if got := oneLine(strings.Repeat("é", maxEntryString)); len(got) > maxEntryString+len("…") || !strings.HasSuffix(got, "é…") {
		t.Errorf("oneLine of a long message: %d bytes, ends %q", len(got), got[len(got)-8:])
	}
}

// warmPoolObject is an empty SandboxWarmPool.
func warmPoolObject() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("airlock.dev/v1alpha1")
	u.SetKind("SandboxWarmPool")
	return u
}
