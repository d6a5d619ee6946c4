package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClusterE2BSDK runs the official E2B SDK (test/e2b/cluster.run.mjs)
// against a cluster's control tier: one node, two replicas, the SDK's
// control-plane calls to one and its in-sandbox calls (commands, files)
// to the other. Create, info, list, timeout, commands, files, another
// tenant's blindness, pause and connect, kill.
func TestClusterE2BSDK(t *testing.T) {
	e := setup(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("the E2B SDK test needs node and npm (run: make deps)")
	}
	dir, err := filepath.Abs("../e2b")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if !npmInstalled(t, dir) {
		npm := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		npm.Dir = dir
		if b, err := npm.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in test/e2b: %v\n%s", err, b)
		}
	}
	cl := startCluster(t)
	startDaemon(t, e, "airlock node", cl.nodeArgs("e2e-e2b1")...)
	replicas := cl.replicas(t, e, 2)
	key := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-cl-e2b"))
	other := strings.TrimSpace(e.must(t, "keys", "create", "--catalog", cl.catalog, "--tenant", "e2e-cl-e2b-other"))
	// The node registers within a second or two; the first create waits
	// for it.
	if code, body := cl.firstCreate(t, replicas[0], key, `{"timeout_s":60}`); code != 201 {
		t.Fatalf("first create: %d %s", code, body)
	} else {
		var sb struct{ ID string }
		_ = json.Unmarshal(body, &sb)
		cl.call(replicas[0], key, "DELETE", "/v1/sandboxes/"+sb.ID, "")
	}

	cmd := exec.CommandContext(ctx, node, "cluster.run.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+replicas[0], "E2B_SANDBOX_URL="+replicas[1], "E2B_API_KEY="+key, "E2B_OTHER_KEY="+other)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the E2B SDK against the cluster: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	id := lines[len(lines)-1]
	t.Logf("the E2B SDK ran sandbox %s through the cluster", id)
	if r := e.run(t, nil, "ls"); strings.Contains(r.stdout, id) {
		t.Fatalf("the SDK's kill left sandbox %s on the node:\n%s", id, r.stdout)
	}
}
