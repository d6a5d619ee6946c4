package kubetest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// Apply creates every object of the kustomization in dir, in the order
// its kustomization.yaml lists the files (plain resources only: no
// patches or generators; a directory listed is a base, applied in its
// place; images: renames are not made), as `kubectl apply -k dir` would
// on an empty cluster, with strict field validation; it waits for each
// CustomResourceDefinition to be established before going on.
func Apply(t testing.TB, cfg *rest.Config, dir string) {
	t.Helper()
	ctx := t.Context()
	var kust struct {
		Resources []string `json:"resources"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil || len(kust.Resources) == 0 {
		t.Fatalf("%s/kustomization.yaml lists no resources: %v", dir, err)
	}
	cached := memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg))
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, f := range kust.Resources {
		if fi, err := os.Stat(filepath.Join(dir, f)); err == nil && fi.IsDir() {
			Apply(t, cfg, filepath.Join(dir, f)) // another kustomization (a base)
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil || obj == nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			u := &unstructured.Unstructured{Object: obj}
			gvk := u.GroupVersionKind()
			var m *meta.RESTMapping
			var merr error
			if !testutil.WaitFor(t, 30*time.Second, func() bool {
				if m, merr = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); merr != nil {
					cached.Invalidate()
					mapper.Reset()
				}
				return merr == nil
			}) {
				t.Fatalf("%s: no API serves %s: %v", f, gvk, merr)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
			}
			if _, err := ri.Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
				t.Fatalf("%s: create %s %s: %v", f, gvk.Kind, u.GetName(), err)
			}
			if gvk.Kind == "CustomResourceDefinition" {
				waitEstablished(t, dyn, u.GetName())
			}
		}
	}
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func waitEstablished(t testing.TB, dyn dynamic.Interface, name string) {
	t.Helper()
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		u, err := dyn.Resource(crdResource).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("CRD %s never established", name)
	}
}

// As is cfg acting as user in groups (the admin token may impersonate
// anyone), so a test runs with the rights RBAC gives that identity, such
// as a service account's: "system:serviceaccount:NS:NAME" with groups
// "system:serviceaccounts" and "system:serviceaccounts:NS".
func As(cfg *rest.Config, user string, groups ...string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	return c
}

// Kubeconfig writes a kubeconfig file for the API server, acting as user
// in groups (see As), and returns its path: for a process the test runs.
func (cp *ControlPlane) Kubeconfig(t testing.TB, user string, groups ...string) string {
	t.Helper()
	ca := cp.Config.CAData
	if len(ca) == 0 && cp.Config.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(cp.Config.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: ca}
	kc.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{Token: cp.Config.BearerToken, Impersonate: user, ImpersonateGroups: append(groups, "system:authenticated")}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	kc.CurrentContext = "kubetest"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, p); err != nil {
		t.Fatal(err)
	}
	return p
}
