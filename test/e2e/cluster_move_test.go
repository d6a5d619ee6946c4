package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
)

// TestClusterMovesARunningSandbox: an operator (an admin key) moves a
// running sandbox to another node through the control tier, as a drain
// would: its Python variable and its file are there on the other node,
// which now runs it, and the first node no longer has it.
func TestClusterMovesARunningSandbox(t *testing.T) {
	e := setup(t)
	cl := startCluster(t)
	bundles := t.TempDir()
	startDaemon(t, e, "node e2e-mv1", cl.nodeArgs("e2e-mv1", "--bundle-dir", bundles)...)
	replica := cl.replicas(t, e, 1)[0]
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-mv"))
	admin := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-ops", "--admin"))
	code, body := cl.firstCreate(t, replica, key, `{"timeout_s":900}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(body, &sb)
	e2 := env{bin: e.bin, state: cloneNodeState(t, e.state)}
	t.Cleanup(func() {
		for _, st := range []env{e, e2} {
			st.run(t, nil, "rm", sb.ID)
		}
	})
	if code, body := cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/code", `{"code":"x = 41\nopen('/root/m.txt','w').write('moved')"}`); code != http.StatusOK {
		t.Fatalf("code: %d %s", code, body)
	}
	startDaemon(t, e2, "node e2e-mv2", cl.nodeArgs("e2e-mv2", "--bundle-dir", bundles)...)
	if code, body := cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/move", `{}`); code != http.StatusForbidden {
		t.Fatalf("a tenant's move: %d %s", code, body)
	}
	t0 := time.Now()
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		code, body = cl.call(replica, admin, "POST", "/v1/sandboxes/"+sb.ID+"/move", `{"to":"e2e-mv2"}`)
		return code != http.StatusServiceUnavailable // node 2 not live to the replica yet
	}) || code != http.StatusOK || !strings.Contains(string(body), `"to":"e2e-mv2"`) {
		t.Fatalf("move: %d %s", code, body)
	}
	t.Logf("moved a running sandbox between nodes in %s: %s", time.Since(t0).Round(time.Millisecond), body)
	if code, body := cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/code", `{"code":"print(x + 1, open('/root/m.txt').read())"}`); code != http.StatusOK || !strings.Contains(string(body), "42 moved") {
		t.Fatalf("code after the move: %d %s", code, body)
	}
	if r := e.run(t, nil, "ls"); strings.Contains(r.stdout, sb.ID) {
		t.Fatalf("node 1 still has the moved sandbox:\n%s", r.stdout)
	}
	if r := e2.run(t, nil, "ls"); !strings.Contains(r.stdout, sb.ID) || !strings.Contains(r.stdout, "running") {
		t.Fatalf("node 2 does not run it:\n%s", r.stdout)
	}
	cat, err := store.Open(t.Context(), cl.catalog)
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	if p, err := cat.PlacementOf(t.Context(), sb.ID); err != nil || p.Node != "e2e-mv2" || p.BundleDigest != "" {
		t.Fatalf("placement after the move: %+v %v", p, err)
	}
	// Creates spread: with node 2 holding the moved sandbox, the next one
	// goes to node 1, which has the most room, once node 1's published
	// status (every few seconds) no longer counts the sandbox it gave up:
	// it counts what node 1 has.
	reg := &cluster.Registry{Dynamic: dynamic.NewForConfigOrDie(kubetest.As(cl.cp.Config, "system:serviceaccount:airlock:airlock-control", "system:serviceaccounts", "system:serviceaccounts:airlock"))}
	rctx, stop := context.WithCancel(t.Context())
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(rctx) }()
	defer func() {
		stop()
		if err := <-regDone; err != nil {
			t.Errorf("registry: %v", err)
		}
	}()
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		for _, n := range reg.Nodes() {
			if n.Name == "e2e-mv1" {
				return n.Live && n.Sandboxes == aliveOn(t, e)
			}
		}
		return false
	}) {
		t.Fatalf("node 1's status still counts the moved sandbox: %+v", reg.Nodes())
	}
	code, body = cl.call(replica, key, "POST", "/v1/sandboxes", `{"timeout_s":300}`)
	var next struct{ ID string }
	if code != http.StatusCreated || json.Unmarshal(body, &next) != nil {
		t.Fatalf("create after the move: %d %s", code, body)
	}
	t.Cleanup(func() { e.run(t, nil, "rm", next.ID) })
	if p, err := cat.PlacementOf(t.Context(), next.ID); err != nil || p.Node != "e2e-mv1" {
		t.Fatalf("the next create's placement: %+v %v", p, err)
	}
}

// aliveOn counts the sandboxes of e's state dir that a node's status
// counts (store.State.Alive: not paused, not failed).
func aliveOn(t *testing.T, e env) int {
	t.Helper()
	var sbs []struct{ State store.State }
	if err := json.Unmarshal([]byte(e.must(t, "ls", "--json")), &sbs); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sb := range sbs {
		if sb.State.Alive() {
			n++
		}
	}
	return n
}
