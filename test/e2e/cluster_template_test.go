package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestClusterTemplate applies a SandboxTemplate to a real kube-apiserver
// with one `airlock node` and a control-tier replica: the node builds it
// for its tenant and reports ready in the template's status; the tenant's
// create of that name through the replica runs on it, and another
// tenant's finds no such image; deleting the template removes it on the
// node.
func TestClusterTemplate(t *testing.T) {
	e := setup(t)
	cl := startCluster(t)
	startDaemon(t, e, "airlock node", cl.nodeArgs("e2e-t1")...)
	replica := cl.replicas(t, e, 1)[0]
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-tpl"))
	other := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-tpl-other"))
	dyn, err := dynamic.NewForConfig(cl.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	tpls := dyn.Resource(cluster.TemplateResource).Namespace(cluster.DefaultNamespace)
	ctx := t.Context()
	const name = "e2e-crd-greeting"
	// A bad name is refused by the API server's schema.
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "airlock.dev/v1alpha1", "kind": "SandboxTemplate", "metadata": map[string]any{"name": "bad..name-" + strings.Repeat("x", 60)},
		"spec": map[string]any{"tenant": "e2e-tpl", "dockerfile": "FROM base\n"},
	}}
	if _, err := tpls.Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "template's name") {
		t.Fatalf("a template with a 70-character name: %v", err)
	}
	tpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "airlock.dev/v1alpha1", "kind": "SandboxTemplate", "metadata": map[string]any{"name": name},
		"spec": map[string]any{"tenant": "e2e-tpl", "dockerfile": "FROM base\nRUN echo from-a-crd > /etc/greeting\n"},
	}}
	if _, err := tpls.Create(ctx, tpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = tpls.Delete(ctx, name, metav1.DeleteOptions{})
		}
	})
	t0 := time.Now()
	var phase, msg string
	if !testutil.WaitFor(t, 10*time.Minute, func() bool {
		u, err := tpls.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		phase, _, _ = unstructured.NestedString(u.Object, "status", "nodes", "e2e-t1", "phase")
		msg, _, _ = unstructured.NestedString(u.Object, "status", "nodes", "e2e-t1", "error")
		return phase == "ready" || phase == "failed"
	}) || phase != "ready" {
		t.Fatalf("the template on e2e-t1: phase %q, error %q", phase, msg)
	}
	t.Logf("the node built the template in %s", time.Since(t0).Round(time.Millisecond))

	code, body := cl.firstCreate(t, replica, key, `{"image":"`+name+`","timeout_s":300}`)
	if code != http.StatusCreated {
		t.Fatalf("create from the template: %d %s", code, body)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(body, &sb)
	t.Cleanup(func() { e.run(t, nil, "rm", sb.ID) })
	if code, body := cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["cat","/etc/greeting"]}`); code != http.StatusOK || !strings.Contains(string(body), `from-a-crd\n`) {
		t.Fatalf("exec in the template's sandbox: %d %s", code, body)
	}
	if code, body := cl.call(replica, other, "POST", "/v1/sandboxes", `{"image":"`+name+`"}`); code != http.StatusNotFound {
		t.Fatalf("another tenant's create of the template: %d %s", code, body)
	}

	if err := tpls.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if !testutil.WaitFor(t, time.Minute, func() bool {
		code, body := cl.call(replica, key, "POST", "/v1/sandboxes", `{"image":"`+name+`"}`)
		if code == http.StatusCreated { // not removed yet: this one goes
			var made struct{ ID string }
			_ = json.Unmarshal(body, &made)
			cl.call(replica, key, "DELETE", "/v1/sandboxes/"+made.ID, "")
		}
		return code == http.StatusNotFound
	}) {
		t.Fatal("the deleted template still makes sandboxes")
	}
	// The sandbox made from it goes on.
	if code, body := cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["true"]}`); code != http.StatusOK {
		t.Fatalf("the template's sandbox after the delete: %d %s", code, body)
	}
}
