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
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// TestClusterWarmPool applies a SandboxWarmPool to a real kube-apiserver
// with one `airlock node` and two control-tier replicas: the node fills
// its pool to perNode and reports it in the pool's status; a create
// through a replica takes a warm sandbox (its source says so, it runs
// commands as its creator's) and the pool refills; deleting the pool
// removes the node's unclaimed sandboxes and keeps the claimed one.
func TestClusterWarmPool(t *testing.T) {
	e := setup(t)
	cl := startCluster(t)
	startDaemon(t, e, "airlock node", cl.nodeArgs("e2e-w1")...)
	replicas := cl.replicas(t, e, 2)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-warm"))
	dyn, err := dynamic.NewForConfig(cl.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	pools := dyn.Resource(cluster.WarmPoolResource).Namespace(cluster.DefaultNamespace)
	ctx := t.Context()
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "airlock.dev/v1alpha1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": "e2e-base"},
		"spec":     map[string]any{"image": "base", "perNode": int64(2)},
	}}
	if _, err := pools.Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = pools.Delete(ctx, "e2e-base", metav1.DeleteOptions{})
		}
	})
	// ready reads the node's entry of the pool's status.
	ready := func() (int64, string) {
		u, err := pools.Get(ctx, "e2e-base", metav1.GetOptions{})
		if err != nil {
			return -1, err.Error()
		}
		n, _, _ := unstructured.NestedInt64(u.Object, "status", "nodes", "e2e-w1", "ready")
		msg, _, _ := unstructured.NestedString(u.Object, "status", "nodes", "e2e-w1", "error")
		return n, msg
	}
	t0 := time.Now()
	var n int64
	var msg string
	if !testutil.WaitFor(t, 5*time.Minute, func() bool { n, msg = ready(); return n == 2 }) {
		t.Fatalf("the pool's status on e2e-w1: ready %d, error %q", n, msg)
	}
	t.Logf("the node filled its pool of 2 in %s", time.Since(t0).Round(time.Millisecond))
	warm := warmIDs(t, e)
	if len(warm) != 2 {
		t.Fatalf("the node has warm sandboxes %v, want 2", warm)
	}

	// A replica places the create on the node with a warm sandbox; the
	// node gives it one.
	t1 := time.Now()
	code, body := cl.firstCreate(t, replicas[0], key, `{"timeout_s":600,"env":{"WHO":"warm-e2e"},"network":{"secrets":[{"name":"API_TOKEN","hosts":["api.example.com"],"value":"warm-secret-value-31"}]}}`)
	took := time.Since(t1)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ ID, State, Tenant, Source string }
	_ = json.Unmarshal(body, &sb)
	t.Cleanup(func() { e.run(t, nil, "rm", sb.ID) })
	if sb.Source != "warm:e2e-base" || sb.Tenant != "e2e-warm" || sb.State != "running" || !strings.Contains(strings.Join(warm, " "), sb.ID) {
		t.Fatalf("created %s, want one of the warm %v", body, warm)
	}
	t.Logf("a create that took a warm sandbox answered in %s", took.Round(time.Millisecond))
	// Its environment and its secret (a placeholder in the guest, the
	// interception CA in its trust store) came with the claim.
	code, body = cl.call(replicas[1], key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["sh","-c","echo $WHO $API_TOKEN; test -s /usr/local/share/ca-certificates/airlock-egress.crt && echo has-ca"]}`)
	if code != http.StatusOK || !strings.Contains(string(body), `warm-e2e `) || !strings.Contains(string(body), `has-ca`) || strings.Contains(string(body), "warm-secret-value-31") {
		t.Fatalf("exec in the claimed sandbox: %d %s", code, body)
	}
	if !testutil.WaitFor(t, 5*time.Minute, func() bool { n, msg = ready(); return n == 2 && len(warmIDs(t, e)) == 2 }) {
		t.Fatalf("the pool did not refill: ready %d, error %q", n, msg)
	}

	// Deleting the pool removes what is still warm, not the claimed one.
	if err := pools.Delete(ctx, "e2e-base", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if !testutil.WaitFor(t, 2*time.Minute, func() bool { return len(warmIDs(t, e)) == 0 }) {
		t.Fatalf("after the pool's delete the node still has %v", warmIDs(t, e))
	}
	if code, body := cl.call(replicas[0], key, "GET", "/v1/sandboxes/"+sb.ID, ""); code != http.StatusOK || !strings.Contains(string(body), `"state":"running"`) {
		t.Fatalf("the claimed sandbox after the pool's delete: %d %s", code, body)
	}
}

// warmIDs are the running warm sandboxes of the state dir (airlock ls as
// the local admin, who sees every tenant's).
func warmIDs(t *testing.T, e env) []string {
	t.Helper()
	var rows []struct{ ID, State, Tenant string }
	if err := json.Unmarshal([]byte(e.must(t, "ls", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		if r.Tenant == sandbox.WarmTenant && r.State == string(store.StateRunning) {
			ids = append(ids, r.ID)
		}
	}
	return ids
}
