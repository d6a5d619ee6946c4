package kubetest_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
)

// pinnedKubernetes is the k8s.io/kubernetes version tools/kube/apiserver
// pins: the one scripts/kube-bins.sh builds.
func pinnedKubernetes(t *testing.T) string {
	t.Helper()
	const modFile = "../../../tools/kube/apiserver/go.mod"
	b, err := os.ReadFile(modFile)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v1\.\d+\.\d+)(?:\s*//.*)?$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no require line for k8s.io/kubernetes", modFile)
	}
	return string(m[1])
}

func newNamespace(t *testing.T, cs kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// TestControlPlaneServesLeases is what node registration will do: a Lease
// created, renewed, read back and watched, on the pinned Kubernetes.
func TestControlPlaneServesLeases(t *testing.T) {
	t.Parallel()
	cp := kubetest.Start(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}

	want := pinnedKubernetes(t)
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("/version: %v", err)
	}
	if wantMinor := strings.Split(want, ".")[1]; v.Major != "1" || v.Minor != wantMinor || v.GitVersion != want {
		t.Errorf("/version = major %q minor %q gitVersion %q, want 1, %s, %s", v.Major, v.Minor, v.GitVersion, wantMinor, want)
	}

	ns := newNamespace(t, cs, "leases-")
	leases := cs.CoordinationV1().Leases(ns)
	acquired := metav1.NewMicroTime(time.Now().Truncate(time.Microsecond))
	created, err := leases.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       new("node-a"),
			LeaseDurationSeconds: new(int32(15)),
			AcquireTime:          &acquired,
			RenewTime:            &acquired,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create lease: %v", err)
	}

	// From the creation's resource version on: the next event is the
	// renewal.
	w, err := leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:   "metadata.name=node-a",
		ResourceVersion: created.ResourceVersion,
	})
	if err != nil {
		t.Fatalf("watch leases: %v", err)
	}
	defer w.Stop()

	renewed := metav1.NewMicroTime(acquired.Add(10 * time.Second))
	created.Spec.RenewTime = &renewed
	updated, err := leases.Update(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("renew lease: %v", err)
	}
	if updated.ResourceVersion == created.ResourceVersion {
		t.Errorf("renewal kept resource version %s", created.ResourceVersion)
	}

	got, err := leases.Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	if got.Spec.RenewTime == nil || !got.Spec.RenewTime.Equal(&renewed) {
		t.Errorf("renewTime read back = %v, want %v", got.Spec.RenewTime, renewed)
	}
	if got.Spec.HolderIdentity == nil || *got.Spec.HolderIdentity != "node-a" {
		t.Errorf("holderIdentity read back = %v, want node-a", got.Spec.HolderIdentity)
	}

	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("watch closed before the renewal arrived")
			}
			l, isLease := ev.Object.(*coordinationv1.Lease)
			if ev.Type != watch.Modified || !isLease {
				t.Fatalf("watch event %s %T, want Modified Lease", ev.Type, ev.Object)
			}
			if l.Spec.RenewTime == nil || !l.Spec.RenewTime.Equal(&renewed) || l.ResourceVersion != updated.ResourceVersion {
				t.Fatalf("watched lease renewTime %v rv %s, want %v rv %s", l.Spec.RenewTime, l.ResourceVersion, renewed, updated.ResourceVersion)
			}
			return
		case <-timeout:
			t.Fatal("no watch event for the renewal within 30 s")
		}
	}
}

// TestCRDInstalls is what the cluster controllers' types will need: a
// CustomResourceDefinition becomes Established and serves objects.
func TestCRDInstalls(t *testing.T) {
	t.Parallel()
	cp := kubetest.Start(t)
	ctx := t.Context()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := apiextensions.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}

	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.test.airlock.dev"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "test.airlock.dev",
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList",
			},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{
					OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object",
						Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"spec": {
								Type: "object",
								Properties: map[string]apiextensionsv1.JSONSchemaProps{
									"size": {Type: "integer", Minimum: new(float64(1))},
								},
							},
						},
					},
				},
			}},
		},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CRD: %v", err)
	}
	var conds []apiextensionsv1.CustomResourceDefinitionCondition
	established := testutil.WaitFor(t, 30*time.Second, func() bool {
		got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds = got.Status.Conditions
		for _, c := range conds {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if !established {
		t.Fatalf("CRD not Established within 30 s; conditions: %+v", conds)
	}

	ns := newNamespace(t, cs, "crds-")
	widgets := dyn.Resource(schema.GroupVersionResource{Group: "test.airlock.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.airlock.dev/v1",
		"kind":       "Widget",
		"metadata":   map[string]any{"name": "w1"},
		"spec":       map[string]any{"size": int64(3)},
	}}
	// Established says the names are accepted; the handler for the new
	// resource can lag it by a moment.
	var createErr error
	if !testutil.WaitFor(t, 10*time.Second, func() bool {
		_, createErr = widgets.Create(ctx, obj, metav1.CreateOptions{})
		return !apierrors.IsNotFound(createErr)
	}) || createErr != nil {
		t.Fatalf("create Widget: %v", createErr)
	}
	got, err := widgets.Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Widget: %v", err)
	}
	if size, found, err := unstructured.NestedInt64(got.Object, "spec", "size"); err != nil || !found || size != 3 {
		t.Errorf("Widget spec.size = %d (found %v, %v), want 3", size, found, err)
	}

	// The schema is enforced: a size below the minimum is refused.
	bad := obj.DeepCopy()
	bad.SetName("w2")
	if err := unstructured.SetNestedField(bad.Object, int64(0), "spec", "size"); err != nil {
		t.Fatal(err)
	}
	if _, err := widgets.Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("create Widget with size 0: err = %v, want Invalid", err)
	}
}
