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
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
	"github.com/airlock-sandbox/airlock/internal/testutil/kubetest"
	"github.com/airlock-sandbox/airlock/internal/testutil/pgtest"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
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
	cl := startCluster(t)
	node := startDaemon(t, e, "airlock node", cl.nodeArgs("e2e-n1")...)
	replicas := cl.replicas(t, e, 2)
	call, catalog := cl.call, cl.catalog
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", catalog, "--tenant", "e2e-cl", "--max-sandboxes", "1"))
	other := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", catalog, "--tenant", "e2e-cl-other"))
	a, b := replicas[0], replicas[1]
	if code, _ := call(a, "", "GET", "/v1/sandboxes", ""); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", code)
	}

	code, body := cl.firstCreate(t, a, key, `{"timeout_s":600}`)
	if code != http.StatusCreated {
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
	// A terminal (the PTY WebSocket) through replica B, with the Go SDK.
	tctx, tcancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer tcancel()
	term, err := airlock.New(b, key).Terminal(tctx, sb.ID, airlock.TerminalOptions{Cmd: []string{"sh", "-c", "read l; echo got:$l"}})
	if err != nil {
		t.Fatalf("terminal through replica B: %v", err)
	}
	if _, err := term.Write([]byte("via-pty\n")); err != nil {
		t.Fatal(err)
	}
	if out, err := io.ReadAll(term); err != nil || !strings.Contains(string(out), "got:via-pty") {
		t.Fatalf("terminal through replica B: %q %v", out, err)
	}
	if x, err := term.Wait(tctx); err != nil || x.Code != 0 {
		t.Fatalf("terminal through replica B: exit %+v %v", x, err)
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

// e2eCluster is a Kubernetes control plane with deploy/kubernetes applied,
// a PostgreSQL catalog and a node token: what the nodes and replicas of
// an e2e cluster share.
type e2eCluster struct {
	cp        *kubetest.ControlPlane
	catalog   string
	tokenFile string
	hc        *http.Client
	ctx       context.Context
	t         *testing.T
}

func startCluster(t *testing.T) *e2eCluster {
	t.Helper()
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
	tokenFile := filepath.Join(t.TempDir(), "node-token")
	if err := os.WriteFile(tokenFile, []byte(strings.Repeat("e2e-cluster-tok-", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	return &e2eCluster{cp: cp, catalog: catalog, tokenFile: tokenFile, ctx: t.Context(), t: t,
		hc: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{}}}
}

// sa is a kubeconfig of service account name of the airlock namespace.
func (c *e2eCluster) sa(name string) string {
	return c.cp.Kubeconfig(c.t, "system:serviceaccount:airlock:"+name, "system:serviceaccounts", "system:serviceaccounts:airlock")
}

// nodeArgs are the arguments of `airlock node` NAME on a loopback port.
func (c *e2eCluster) nodeArgs(name string, extra ...string) []string {
	return append([]string{"node", "--name", name, "--listen", freeLoopback(c.t), "--kubeconfig", c.sa("airlock-node"), "--node-token-file", c.tokenFile}, extra...)
}

// replicas starts n `airlock serve --cluster` replicas and returns their
// base URLs once they answer.
func (c *e2eCluster) replicas(t *testing.T, e env, n int) []string {
	t.Helper()
	kc := c.sa("airlock-control")
	var out []string
	for i := range n {
		addr := freeLoopback(t)
		startDaemon(t, e, "replica "+string(rune('A'+i)), "serve", "--cluster", "--catalog", c.catalog, "--kubeconfig", kc, "--node-token-file", c.tokenFile, "--listen", addr)
		out = append(out, "http://"+addr)
	}
	for _, r := range out {
		if !testutil.WaitFor(t, 60*time.Second, func() bool { code, _ := c.call(r, "", "GET", "/healthz", ""); return code == 200 }) {
			t.Fatalf("replica %s never answered", r)
		}
	}
	return out
}

// call makes one API call; a transport error is status 0 with its text.
func (c *e2eCluster) call(base, key, method, path, body string) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequestWithContext(c.ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// firstCreate creates a sandbox through replica, waiting for a node to be
// live to the replicas first.
func (c *e2eCluster) firstCreate(t *testing.T, replica, key, body string) (int, []byte) {
	t.Helper()
	var code int
	var out []byte
	testutil.WaitFor(t, 60*time.Second, func() bool {
		code, out = c.call(replica, key, "POST", "/v1/sandboxes", body)
		return code != http.StatusServiceUnavailable
	})
	return code, out
}

// TestClusterResumesAPausedSandboxOnAnotherNode pauses a sandbox with a
// Python variable through the control tier, stops its node, and has the
// next call resume it on a second node (its own state dir) from the
// bundle the pause wrote to the nodes' shared bundle directory: the
// variable is intact and the placement moved; node 1, back, forgets its
// stale copy; and a bundle that was tampered with is refused, never
// resumed.
func TestClusterResumesAPausedSandboxOnAnotherNode(t *testing.T) {
	e := setup(t)
	cl := startCluster(t)
	bundles := t.TempDir()
	n1 := startDaemon(t, e, "node e2e-m1", cl.nodeArgs("e2e-m1", "--bundle-dir", bundles)...)
	replica := cl.replicas(t, e, 1)[0]
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-move"))

	code, body := cl.firstCreate(t, replica, key, `{"timeout_s":900}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ ID string }
	_ = json.Unmarshal(body, &sb)
	e2 := env{bin: e.bin, state: cloneNodeState(t, e.state)}
	t.Cleanup(func() {
		for _, st := range []env{e, e2} { // node 3 never holds it
			if r := st.run(t, nil, "rm", sb.ID); r.code != 0 && !strings.Contains(r.stderr, "no sandbox") {
				t.Errorf("rm %s in %s: %s", sb.ID, st.state, r.stderr)
			}
		}
	})
	if code, body := cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/code", `{"code":"x = 41\nprint('set', x)"}`); code != http.StatusOK || !strings.Contains(string(body), "set 41") {
		t.Fatalf("code: %d %s", code, body)
	}
	t0 := time.Now()
	code, body = cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", `{}`)
	var paused struct {
		State  string
		Bundle *struct {
			Digest string
			Bytes  int64
		}
	}
	if code != http.StatusOK || json.Unmarshal(body, &paused) != nil || paused.State != "paused" || paused.Bundle == nil {
		t.Fatalf("pause: %d %s", code, body)
	}
	t.Logf("pause with its bundle (%d MiB, %s): %s", paused.Bundle.Bytes>>20, paused.Bundle.Digest[:19], time.Since(t0).Round(time.Millisecond))
	bundleFile := filepath.Join(bundles, sb.ID, strings.TrimPrefix(paused.Bundle.Digest, "sha256:")+".tar")
	if fi, err := os.Stat(bundleFile); err != nil || fi.Size() != paused.Bundle.Bytes {
		t.Fatalf("the bundle in the shared directory: %v", err)
	}

	// A sandbox its shim pauses after 2 idle seconds: no export writes
	// its bundle, the node's sweep does, and the replica records it.
	code, body = cl.call(replica, key, "POST", "/v1/sandboxes", `{"timeout_s":900,"idle_pause_s":2}`)
	var idle struct{ ID string }
	if code != http.StatusCreated || json.Unmarshal(body, &idle) != nil {
		t.Fatalf("create an idle-pausing sandbox: %d %s", code, body)
	}
	t.Cleanup(func() {
		for _, st := range []env{e, e2} {
			st.run(t, nil, "rm", idle.ID)
		}
	})
	if code, body := cl.call(replica, key, "PUT", "/v1/sandboxes/"+idle.ID+"/files?path=/root/idle.txt", "kept-while-idle"); code != http.StatusOK {
		t.Fatalf("put a file in the idle-pausing sandbox: %d %s", code, body)
	}
	catIdle, err := store.Open(t.Context(), cl.catalog)
	if err != nil {
		t.Fatal(err)
	}
	defer catIdle.Close()
	t0 = time.Now()
	if !testutil.WaitFor(t, 2*time.Minute, func() bool {
		p, err := catIdle.PlacementOf(t.Context(), idle.ID)
		return err == nil && p.BundleDigest != ""
	}) {
		p, _ := catIdle.PlacementOf(t.Context(), idle.ID)
		t.Fatalf("the idle-paused sandbox's bundle was never recorded: %+v; node 1 has %s", p, e.run(t, nil, "ls").stdout)
	}
	t.Logf("the idle-paused sandbox's bundle was swept and recorded %s after its create", time.Since(t0).Round(time.Second))

	// The second node, then the first one stops: the sandbox is listed
	// paused, waiting to move.
	n2 := startDaemon(t, e2, "node e2e-m2", cl.nodeArgs("e2e-m2", "--bundle-dir", bundles)...)
	if err := n1.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _ = n1.Process.Wait()
	if !testutil.WaitFor(t, 30*time.Second, func() bool {
		code, body = cl.call(replica, key, "GET", "/v1/sandboxes", "")
		return code == http.StatusOK && strings.Contains(string(body), "e2e-m1 is not live")
	}) {
		t.Fatalf("after node 1 stopped, the list: %d %s", code, body)
	}

	cat, err := store.Open(t.Context(), cl.catalog)
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()

	// The next call resumes it on node 2, variable intact.
	t0 = time.Now()
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		code, body = cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/code", `{"code":"print('got', x + 1)"}`)
		return code != http.StatusServiceUnavailable
	}) || code != http.StatusOK || !strings.Contains(string(body), "got 42") {
		r := e2.run(t, nil, "ls")
		r2 := e2.run(t, nil, "events")
		t.Fatalf("code after the move: %d %s\nnode 2 has: %s %s\n%s %s", code, body, r.stdout, r.stderr, r2.stdout, r2.stderr)
	}
	t.Logf("the first call after node 1 stopped moved the sandbox to node 2 and resumed it there in %s", time.Since(t0).Round(time.Millisecond))
	p, err := cat.PlacementOf(t.Context(), sb.ID)
	if err != nil || p.Node != "e2e-m2" || p.State != store.PlacementPlaced || p.BundleDigest != "" {
		t.Fatalf("placement after the move: %+v %v", p, err)
	}
	// The idle-paused one moves too, with its file.
	if code, body := cl.call(replica, key, "GET", "/v1/sandboxes/"+idle.ID+"/files?path=/root/idle.txt", ""); code != http.StatusOK || string(body) != "kept-while-idle" {
		t.Fatalf("the idle-paused sandbox after node 1 stopped: %d %s", code, body)
	}
	if p, err := cat.PlacementOf(t.Context(), idle.ID); err != nil || p.Node != "e2e-m2" {
		t.Fatalf("the idle-paused sandbox's placement after the move: %+v %v", p, err)
	}
	if _, err := os.Stat(bundleFile); !os.IsNotExist(err) {
		t.Fatalf("the stale bundle is still in the store after the resume: %v", err)
	}

	// Paused again, on node 2, and its bundle tampered with (one bit):
	// when node 2 stops, the node it moves to (1 or 3) refuses it, and
	// the sandbox is failed with the reason instead of resumed from bytes
	// no node wrote.
	code, body = cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", `{}`)
	if code != http.StatusOK || json.Unmarshal(body, &paused) != nil || paused.Bundle == nil {
		t.Fatalf("second pause: %d %s", code, body)
	}
	second := filepath.Join(bundles, sb.ID, strings.TrimPrefix(paused.Bundle.Digest, "sha256:")+".tar")

	// Node 1 comes back: the replica forgets its stale copy, and leaves
	// the bundle that node 2's copy would resume from.
	startDaemon(t, e, "node e2e-m1, back", cl.nodeArgs("e2e-m1", "--bundle-dir", bundles)...)
	if !testutil.WaitFor(t, 60*time.Second, func() bool { return !strings.Contains(e.run(t, nil, "ls").stdout, sb.ID) }) {
		t.Fatalf("node 1 came back and still has its copy of %s", sb.ID)
	}
	if _, err := os.Stat(second); err != nil {
		t.Fatalf("forgetting node 1's stale copy took node 2's bundle: %v", err)
	}
	b, err := os.ReadFile(second)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(second, b, 0o600); err != nil {
		t.Fatal(err)
	}
	e3 := env{bin: e.bin, state: cloneNodeState(t, e.state)}
	startDaemon(t, e3, "node e2e-m3", cl.nodeArgs("e2e-m3", "--bundle-dir", bundles)...)
	if err := n2.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _ = n2.Process.Wait()
	if !testutil.WaitFor(t, 60*time.Second, func() bool {
		code, body = cl.call(replica, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":["true"]}`)
		return code != http.StatusServiceUnavailable
	}) || code != http.StatusConflict || !strings.Contains(string(body), "do not match its digest") {
		t.Fatalf("a call with a tampered bundle: %d %s", code, body)
	}
	for _, st := range []env{e, e3} {
		if r := st.run(t, nil, "ls"); strings.Contains(r.stdout, sb.ID) {
			t.Fatalf("a node kept the tampered sandbox: %s", r.stdout)
		}
	}
	t.Logf("the tampered bundle was refused: %s", body)
}

// cloneNodeState makes a state dir for a second node on this host, beside
// src (hard links need the same filesystem): statedir.CloneSetup.
func cloneNodeState(t *testing.T, src string) string {
	t.Helper()
	dst, err := os.MkdirTemp(filepath.Dir(src), "e2e-node-") //nolint:usetesting // beside src, for hard links: t.TempDir is on another filesystem
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dst) })
	if err := (statedir.Layout{Root: src}).CloneSetup(statedir.Layout{Root: dst}); err != nil {
		t.Fatal(err)
	}
	return dst
}
