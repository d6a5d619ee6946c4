package cluster

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
)

// fakeTemplates is one node's templates, in memory: it records the
// calls, and each template's phase is what the test sets.
type fakeTemplates struct {
	mu    sync.Mutex
	specs map[string]TemplateSpec
	state map[string]TemplateState
	calls []string
}

func (f *fakeTemplates) SetTemplate(name string, spec TemplateSpec) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.specs[name]; ok && cur.Dockerfile == spec.Dockerfile {
		return
	}
	f.calls = append(f.calls, "set "+name+" "+spec.Tenant+" "+strings.TrimSpace(spec.Dockerfile))
	f.specs[name] = spec
	f.state[name] = TemplateState{Phase: TemplateBuilding}
}

func (f *fakeTemplates) DeleteTemplate(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.specs[name]; ok {
		f.calls = append(f.calls, "delete "+name)
	}
	delete(f.specs, name)
	delete(f.state, name)
}

func (f *fakeTemplates) TemplateState(name string) TemplateState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state[name]
}

func (f *fakeTemplates) finish(name string, st TemplateState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[name] = st
}

func (f *fakeTemplates) callList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// TestTemplates runs a node's SandboxTemplate controller against a real
// API server with the node's rights: a template reaches the target with
// its tenant and Dockerfile; the node's status entry follows its build
// (building, then ready or failed with the reason); a changed Dockerfile
// is built again; a template for another runtime is not built; a delete
// removes it.
func TestTemplates(t *testing.T) {
	cp := kubetest.Start(t)
	kubetest.Apply(t, cp.Config, filepath.Join("..", "..", "deploy", "kubernetes"))
	ctx := t.Context()
	f := &fakeTemplates{specs: map[string]TemplateSpec{}, state: map[string]TemplateState{}}
	c := &Templates{NodeController: NodeController{Config: as(cp.Config, "airlock-node"), Node: "n1", Runtimes: []string{"qemu"}}, Target: f}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("templates controller: %v", err)
		}
	})
	tpls := dynamic.NewForConfigOrDie(cp.Config).Resource(TemplateResource).Namespace(DefaultNamespace)
	apply := func(name string, spec map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "airlock.dev/v1alpha1", "kind": "SandboxTemplate",
			"metadata": map[string]any{"name": name}, "spec": spec}}
		cur, err := tpls.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			cur.Object["spec"] = spec
			_, err = tpls.Update(ctx, cur, metav1.UpdateOptions{})
		} else {
			_, err = tpls.Create(ctx, u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	entry := func(name string) (string, string) {
		u, err := tpls.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", err.Error()
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "nodes", "n1", "phase")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "nodes", "n1", "error")
		return phase, msg
	}
	waitEntry := func(name, phase, msg string) {
		t.Helper()
		var p, m string
		if !testutil.WaitFor(t, 30*time.Second, func() bool { p, m = entry(name); return p == phase && strings.Contains(m, msg) }) {
			t.Fatalf("%s: status %q %q, want %q %q (calls %q)", name, p, m, phase, msg, f.callList())
		}
	}

	apply("py", map[string]any{"tenant": "acme", "dockerfile": "FROM base\nRUN true\n"})
	waitEntry("py", TemplateBuilding, "")
	f.finish("py", TemplateState{Phase: TemplateFailed, Error: "step 2 (RUN true):\n exit 1"})
	waitEntry("py", TemplateFailed, "step 2 (RUN true): exit 1")
	apply("py", map[string]any{"tenant": "acme", "dockerfile": "FROM base\nRUN echo fixed\n"})
	waitEntry("py", TemplateBuilding, "")
	f.finish("py", TemplateState{Phase: TemplateReady})
	waitEntry("py", TemplateReady, "")

	// The control tier's Registry (with its rights) sees where it is built.
	reg := &Registry{Dynamic: dynamic.NewForConfigOrDie(as(cp.Config, "airlock-control"))}
	rctx, rcancel := context.WithCancel(context.Background())
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(rctx) }()
	t.Cleanup(func() {
		rcancel()
		if err := <-regDone; err != nil {
			t.Errorf("registry: %v", err)
		}
	})
	var nodes []string
	var declared bool
	if !testutil.WaitFor(t, 30*time.Second, func() bool { nodes, declared = reg.TemplateNodes("acme", "py"); return declared }) || !slices.Equal(nodes, []string{"n1"}) {
		t.Fatalf("TemplateNodes(acme, py) = %v %v, want [n1]", nodes, declared)
	}
	if nodes, declared := reg.TemplateNodes("other", "py"); declared {
		t.Fatalf("another tenant's template of that name: %v", nodes)
	}
	if nodes, declared := reg.TemplateNodes("acme", "nope"); declared {
		t.Fatalf("no such template: %v", nodes)
	}
	apply("gv", map[string]any{"tenant": "acme", "dockerfile": "FROM base\n", "runtime": "gvisor"})
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		u, err := tpls.Get(ctx, "gv", metav1.GetOptions{})
		_, ok, _ := unstructured.NestedMap(u.Object, "status", "nodes", "n1")
		return err == nil && ok
	}) {
		t.Fatal("no status entry for the gvisor template")
	}
	if p, _ := entry("gv"); p != "" {
		t.Fatalf("a gvisor template on a qemu node: phase %q", p)
	}
	if err := tpls.Delete(ctx, "py", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"set py acme FROM base\nRUN true", "set py acme FROM base\nRUN echo fixed", "delete py"}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { return slices.Equal(f.callList(), want) }) {
		t.Fatalf("calls %q, want %q", f.callList(), want)
	}
	// The schema refuses a template without a tenant.
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "airlock.dev/v1alpha1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": "bad"}, "spec": map[string]any{"dockerfile": "FROM base\n"}}}
	if _, err := tpls.Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "tenant") {
		t.Fatalf("a template without a tenant: %v", err)
	}
}

func TestTemplateSpec(t *testing.T) {
	ok := map[string]any{"tenant": "acme", "dockerfile": "FROM base\n"}
	if s, err := templateSpecFrom("py-3.12", ok); err != nil || s.Tenant != "acme" {
		t.Fatalf("a good spec: %+v %v", s, err)
	}
	for _, tc := range []struct {
		name string
		spec map[string]any
		want string
	}{
		{"Bad_Name", ok, "name"},
		{"x", map[string]any{"tenant": "Acme", "dockerfile": "FROM base\n"}, "spec.tenant"},
		{"x", map[string]any{"tenant": "acme", "dockerfile": ""}, "spec.dockerfile"},
		{"x", map[string]any{"tenant": "acme", "dockerfile": strings.Repeat("#", maxDockerfile+1)}, "spec.dockerfile"},
		{"x", map[string]any{"tenant": "acme", "dockerfile": "FROM base\n", "runtime": "docker"}, "spec.runtime"},
		{"x", map[string]any{"tenant": "acme", "dockerfile": "FROM base\n", "cpus": int64(-1)}, "negative"},
		{"x", nil, "no spec"},
	} {
		if _, err := templateSpecFrom(tc.name, tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: %v, want an error about %s", tc.name, tc.spec, err, tc.want)
		}
	}
}
