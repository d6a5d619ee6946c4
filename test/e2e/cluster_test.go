package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
	"github.com/airlock-sandbox/airlock/internal/testutil/pgtest"
)

// TestNodeRegistersAndServesTheControlTier runs a real `airlock node`
// against a real kube-apiserver, with deploy/kubernetes applied and the
// node's service account's rights: it registers live with the host's
// capacity and its runtime; through its node API, with the node token and
// a tenant named by the control tier, a sandbox is created and runs a
// command, and its AirlockNode then counts it; a tenant's API key and a
// wrong token get nothing; killed with SIGKILL, the node is lost to the
// control tier within 15 s.
func TestNodeRegistersAndServesTheControlTier(t *testing.T) {
	e := setup(t)
	cp := kubetest.Start(t)
	kubetest.Apply(t, cp.Config, filepath.Join("..", "..", "deploy", "kubernetes"))
	ctx := t.Context()
	dir := t.TempDir()
	kubeconfig := cp.Kubeconfig(t, "system:serviceaccount:airlock:airlock-node", "system:serviceaccounts", "system:serviceaccounts:airlock")
	token := strings.Repeat("e2e-node-token-", 4)
	tokenFile := filepath.Join(dir, "node-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopback(t)

	// The control tier's view, as the airlock-control service account.
	control := dynamic.NewForConfigOrDie(kubetest.As(cp.Config, "system:serviceaccount:airlock:airlock-control", "system:serviceaccounts", "system:serviceaccounts:airlock"))
	var mu sync.Mutex
	var lostAt time.Time
	var lostWhy string
	reg := &cluster.Registry{Dynamic: control, OnLost: func(n cluster.Node, why string) {
		mu.Lock()
		defer mu.Unlock()
		if n.Name == "e2e-node" && lostAt.IsZero() {
			lostAt, lostWhy = time.Now(), why
		}
	}}
	rctx, rcancel := context.WithCancel(ctx)
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-regDone; err != nil {
			t.Errorf("registry: %v", err)
		}
	}()

	var out testutil.Buffer
	node := e.cmd(context.Background(), nil, "node", "--name", "e2e-node", "--listen", addr, "--kubeconfig", kubeconfig, "--node-token-file", tokenFile)
	node.Stdout, node.Stderr = &out, &out
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = node.Process.Kill()
			_, _ = node.Process.Wait()
		}
		if t.Failed() {
			t.Logf("airlock node's output:\n%s", tail(out.String(), 4000))
		}
	})
	self := func() (cluster.Node, bool) {
		for _, n := range reg.Nodes() {
			if n.Name == "e2e-node" {
				return n, true
			}
		}
		return cluster.Node{}, false
	}
	if !testutil.WaitFor(t, 60*time.Second, func() bool { n, ok := self(); return ok && n.Live }) {
		t.Fatalf("the node never registered live: %+v", reg.Nodes())
	}
	n, _ := self()
	if n.Address != "http://"+addr || len(n.Runtimes) != 1 || n.Runtimes[0] != runtimeName() || n.Kernel == "" ||
		n.CPUs != goruntime.NumCPU() || n.MemoryMiB < 512 || n.Arch != goruntime.GOARCH {
		t.Fatalf("the node as registered: %+v", n)
	}

	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}
	call := func(auth string, caller *store.APIKey, method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		if caller != nil {
			req.Header.Set(api.NodeCallerHeader, api.NodeCaller(*caller))
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	tenantKey := strings.TrimSpace(e.must(t, "keys", "create", "--tenant", "e2e-node-tenant"))
	if code, _ := call(tenantKey, nil, "GET", "/v1/sandboxes", ""); code != http.StatusUnauthorized {
		t.Fatalf("a tenant's key on the node API: %d", code)
	}
	acme := &store.APIKey{ID: "ctl1", Tenant: "e2e-acme", MaxSandboxes: 2}
	if code, _ := call(strings.Repeat("x", len(token)), acme, "GET", "/v1/sandboxes", ""); code != http.StatusUnauthorized {
		t.Fatalf("a wrong node token: %d", code)
	}
	code, b := call(token, acme, "POST", "/v1/sandboxes", `{"timeout_s":300}`)
	if code != http.StatusCreated {
		t.Fatalf("create through the node API: %d %s", code, b)
	}
	var sb struct{ ID, State, Tenant string }
	_ = json.Unmarshal(b, &sb)
	t.Cleanup(func() {
		if r := e.run(t, nil, "rm", sb.ID); r.code != 0 {
			t.Errorf("rm %s: %s", sb.ID, r.stderr)
		}
	})
	if sb.State != "running" || sb.Tenant != "e2e-acme" {
		t.Fatalf("created %s", b)
	}
	code, b = call(token, acme, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["sh","-c","echo from-$(hostname)"]}`)
	var stdout strings.Builder
	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		var l struct{ Type, Data string }
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Type == "stdout" {
			stdout.WriteString(l.Data)
		}
	}
	if code != http.StatusOK || !strings.HasPrefix(stdout.String(), "from-") {
		t.Fatalf("exec through the node API: %d %s", code, b)
	}
	other := &store.APIKey{ID: "ctl2", Tenant: "e2e-other"}
	if code, _ := call(token, other, "GET", "/v1/sandboxes/"+sb.ID, ""); code != http.StatusNotFound {
		t.Fatalf("another tenant read the sandbox through the node: %d", code)
	}
	if !testutil.WaitFor(t, 30*time.Second, func() bool { n, _ := self(); return n.Sandboxes >= 1 && n.AllocatedMemoryMiB >= 128 }) {
		n, _ := self()
		t.Fatalf("the node's status never counted the sandbox: %+v", n)
	}

	// SIGKILL: no clean stop, the Lease stays until it runs out.
	killAt := time.Now()
	if err := node.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = node.Process.Wait()
	killed = true
	if !testutil.WaitFor(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return !lostAt.IsZero() }) {
		t.Fatalf("the killed node was not lost within 30 s: %+v", reg.Nodes())
	}
	mu.Lock()
	took, why := lostAt.Sub(killAt), lostWhy
	mu.Unlock()
	if took > 15*time.Second || !strings.Contains(why, "not renewed") {
		t.Fatalf("the killed node was lost after %s (%s); want within 15 s", took, why)
	}
	t.Logf("the killed node was lost %s after SIGKILL (%s)", took.Round(10*time.Millisecond), why)
}

// startDaemon starts a long-running airlock command, killed (SIGKILL)
// when the test ends unless the test did; its output is logged if the
// test failed.
func startDaemon(t *testing.T, e env, name string, args ...string) *exec.Cmd {
	t.Helper()
	var out testutil.Buffer
	c := e.cmd(context.Background(), nil, args...)
	c.Stdout, c.Stderr = &out, &out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.ProcessState == nil {
			_ = c.Process.Kill()
			_, _ = c.Process.Wait()
		}
		if t.Failed() {
			t.Logf("%s's output:\n%s", name, tail(out.String(), 4000))
		}
	})
	return c
}

// TestClusterControlTierPlacesAndProxies runs a cluster on this host: a
// real kube-apiserver with deploy/kubernetes applied, a real PostgreSQL
// as the shared catalog, one `airlock node` and two `airlock serve
// --cluster` replicas. A sandbox created through one replica runs
// commands and files through the other; the tenant's quota holds across
// replicas; another tenant cannot see it; a delete frees the quota; and
// when the node is killed, the replicas list its sandbox as failed with
// the reason.
func TestClusterControlTierPlacesAndProxies(t *testing.T) {
	e := setup(t)
	cp := kubetest.Start(t)
	kubetest.Apply(t, cp.Config, filepath.Join("..", "..", "deploy", "kubernetes"))
	pg, err := pgtest.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	catalog, err := pg.Database(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	dir := t.TempDir()
	token := strings.Repeat("e2e-cluster-tok-", 4)
	tokenFile := filepath.Join(dir, "node-token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	sa := func(name string) string {
		return cp.Kubeconfig(t, "system:serviceaccount:airlock:"+name, "system:serviceaccounts", "system:serviceaccounts:airlock")
	}
	nodeAddr := freeLoopback(t)
	node := startDaemon(t, e, "airlock node", "node", "--name", "e2e-n1", "--listen", nodeAddr, "--kubeconfig", sa("airlock-node"), "--node-token-file", tokenFile)
	controlKC := sa("airlock-control")
	var replicas []string
	for i := range 2 {
		addr := freeLoopback(t)
		startDaemon(t, e, "replica "+string(rune('A'+i)), "serve", "--cluster", "--catalog", catalog, "--kubeconfig", controlKC, "--node-token-file", tokenFile, "--listen", addr)
		replicas = append(replicas, "http://"+addr)
	}
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}
	call := func(base, key, method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := hc.Do(req)
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	for _, r := range replicas {
		if !testutil.WaitFor(t, 60*time.Second, func() bool { code, _ := call(r, "", "GET", "/healthz", ""); return code == 200 }) {
			t.Fatalf("replica %s never answered", r)
		}
	}
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", catalog, "--tenant", "e2e-cl", "--max-sandboxes", "1"))
	other := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", catalog, "--tenant", "e2e-cl-other"))
	a, b := replicas[0], replicas[1]
	if code, _ := call(a, "", "GET", "/v1/sandboxes", ""); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", code)
	}

	// The node must be live to the replicas before a create can place.
	var code int
	var body []byte
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		code, body = call(a, key, "POST", "/v1/sandboxes", `{"timeout_s":600}`)
		return code != http.StatusServiceUnavailable
	}) || code != http.StatusCreated {
		t.Fatalf("create through replica A: %d %s", code, body)
	}
	var sb struct{ ID, State, Tenant string }
	_ = json.Unmarshal(body, &sb)
	cleanup := func(id string) {
		t.Cleanup(func() {
			if r := e.run(t, nil, "rm", id); r.code != 0 && !strings.Contains(r.stderr, "no sandbox") {
				t.Errorf("rm %s: %s", id, r.stderr)
			}
		})
	}
	cleanup(sb.ID)
	if sb.State != "running" || sb.Tenant != "e2e-cl" {
		t.Fatalf("created %s", body)
	}

	// Through the other replica: exec, a file round trip, the listing.
	code, body = call(b, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["sh","-c","echo via-b; exit 3"]}`)
	if code != http.StatusOK || !strings.Contains(string(body), `"data":"via-b\n"`) || !strings.Contains(string(body), `"code":3`) {
		t.Fatalf("exec through replica B: %d %s", code, body)
	}
	if code, body := call(b, key, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/x.txt", "cluster-file"); code != http.StatusOK {
		t.Fatalf("put a file through replica B: %d %s", code, body)
	}
	if code, body := call(a, key, "GET", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/x.txt", ""); code != http.StatusOK || string(body) != "cluster-file" {
		t.Fatalf("get it through replica A: %d %q", code, body)
	}
	if code, body := call(b, key, "GET", "/v1/sandboxes", ""); code != http.StatusOK || !strings.Contains(string(body), sb.ID) {
		t.Fatalf("list through replica B: %d %s", code, body)
	}

	// The quota is the cluster's, not a replica's; another tenant sees
	// nothing.
	if code, body := call(b, key, "POST", "/v1/sandboxes", `{}`); code != http.StatusTooManyRequests || !strings.Contains(string(body), "max_sandboxes") {
		t.Fatalf("a second sandbox through replica B: %d %s", code, body)
	}
	if code, _ := call(a, other, "GET", "/v1/sandboxes/"+sb.ID, ""); code != http.StatusNotFound {
		t.Fatalf("another tenant read the sandbox: %d", code)
	}
	if code, body := call(a, other, "GET", "/v1/sandboxes", ""); code != http.StatusOK || strings.Contains(string(body), sb.ID) {
		t.Fatalf("another tenant's list: %d %s", code, body)
	}

	// A delete through one replica frees the quota for the other.
	if code, body := call(b, key, "DELETE", "/v1/sandboxes/"+sb.ID, ""); code/100 != 2 {
		t.Fatalf("delete through replica B: %d %s", code, body)
	}
	t0 := time.Now()
	code, body = call(a, key, "POST", "/v1/sandboxes", `{"timeout_s":600}`)
	if code != http.StatusCreated {
		t.Fatalf("create after the delete: %d %s", code, body)
	}
	t.Logf("a create through a replica answered in %s", time.Since(t0).Round(time.Millisecond))
	_ = json.Unmarshal(body, &sb)
	cleanup(sb.ID)

	// The node dies: the replicas list its sandbox as failed, with why.
	if err := node.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = node.Process.Wait()
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		code, body = call(b, key, "GET", "/v1/sandboxes", "")
		return code == http.StatusOK && strings.Contains(string(body), `"state":"failed"`) && strings.Contains(string(body), "e2e-n1 was lost")
	}) {
		t.Fatalf("30 s after the node was killed, the list: %d %s", code, body)
	}
	if code, body := call(a, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["true"]}`); code != http.StatusConflict {
		t.Fatalf("exec on a lost node's sandbox: %d %s", code, body)
	}
}
