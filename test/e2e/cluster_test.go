package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

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
