package control

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/cluster"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fakeNode is a node API that checks the control tier's credentials and
// keeps sandboxes by tenant.
type fakeNode struct {
	name, token string
	srv         *httptest.Server
	mu          sync.Mutex
	sandboxes   map[string]string // id -> tenant
	callers     []string          // the X-Airlock-Caller of each call
	next        int
	imports     []string // the bundle digests it imported
	refuse      string   // if set, imports fail with this message
	created     map[string]time.Time
	forgot      []string          // the sandboxes it was told to forget
	dropped     []string          // the bundle digests it was told to drop
	bundles     string            // what GET /v1/node/bundles answers
	states      map[string]string // a sandbox's state if not running
	resumed     []string          // the sandboxes it resumed
}

func newFakeNode(t *testing.T, name, token string) *fakeNode {
	n := &fakeNode{name: name, token: token, sandboxes: map[string]string{}, created: map[string]time.Time{}, states: map[string]string{}}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
			// E2B's in-sandbox traffic: the client's own credentials,
			// never the node token or a caller.
			if r.Header.Get(api.NodeCallerHeader) != "" || strings.Contains(r.Header.Get("Authorization"), token) {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, "envd %s %s %s token=%s on %s", id, r.Method, r.URL.Path, r.Header.Get("X-Access-Token"), name)
			return
		}
		if r.Header.Get("Authorization") != "Bearer "+token || r.Header.Get("X-API-KEY") != "" || r.Header.Get("Cookie") != "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var k store.APIKey
		if err := json.Unmarshal([]byte(r.Header.Get(api.NodeCallerHeader)), &k); err != nil || k.Tenant == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		n.callers = append(n.callers, r.Header.Get(api.NodeCallerHeader))
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
			n.next++
			id := fmt.Sprintf("%s-sb%d", name, n.next)
			n.sandboxes[id] = k.Tenant
			n.created[id] = time.Now()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%q,"state":"running","tenant":%q}`, id, k.Tenant)
		case r.Method == "POST" && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes"):
			n.next++
			id := fmt.Sprintf("%s-e2b%d", name, n.next)
			n.sandboxes[id] = k.Tenant
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"sandboxID":%q,"templateID":"base"}`, id)
		case r.Method == "GET" && (r.URL.Path == "/sandboxes" || r.URL.Path == "/v2/sandboxes"):
			out := []map[string]any{}
			for id, tn := range n.sandboxes {
				if tn == k.Tenant {
					out = append(out, map[string]any{"sandboxID": id})
				}
			}
			_ = json.NewEncoder(w).Encode(out)
		case strings.HasPrefix(r.URL.Path, "/sandboxes/"):
			id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/sandboxes/"), "/")
			if tn, ok := n.sandboxes[id]; !ok || tn != k.Tenant {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, `{"code":404,"message":"sandbox not found"}`)
				return
			}
			if r.Method == "DELETE" && rest == "" {
				delete(n.sandboxes, id)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			fmt.Fprintf(w, "e2b %s %s on %s", r.Method, rest, name)
		case r.Method == "POST" && strings.HasPrefix(r.URL.Path, "/v1/node/sandboxes/") && strings.HasSuffix(r.URL.Path, "/export"):
			id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/node/sandboxes/"), "/export")
			n.states[id] = "paused"
			n.next++
			fmt.Fprintf(w, `{"id":%q,"state":"paused","bundle":{"sandbox":%q,"digest":"sha256:%064x","bytes":%d}}`, id, id, n.next, 1000+n.next)
		case r.Method == "POST" && strings.HasPrefix(r.URL.Path, "/v1/node/sandboxes/") && strings.HasSuffix(r.URL.Path, "/forget"):
			id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/node/sandboxes/"), "/forget")
			if _, ok := n.sandboxes[id]; !ok || !k.Admin {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			delete(n.sandboxes, id)
			n.forgot = append(n.forgot, id)
			w.WriteHeader(http.StatusNoContent)
		case r.Method == "GET" && r.URL.Path == "/v1/node/bundles":
			if !k.Admin {
				w.WriteHeader(http.StatusForbidden)
				return
			}
			fmt.Fprint(w, n.bundles)
		case r.Method == "POST" && r.URL.Path == "/v1/node/bundles/drop":
			var ref struct{ Sandbox, Digest string }
			if json.NewDecoder(r.Body).Decode(&ref) != nil || !k.Admin {
				w.WriteHeader(http.StatusForbidden)
				return
			}
			n.dropped = append(n.dropped, ref.Digest)
			w.WriteHeader(http.StatusNoContent)
		case r.Method == "POST" && r.URL.Path == "/v1/node/import":
			var ref struct {
				Sandbox, Digest string
				Bytes           int64
			}
			_ = json.NewDecoder(r.Body).Decode(&ref)
			if n.refuse != "" {
				w.WriteHeader(http.StatusPreconditionFailed)
				fmt.Fprintf(w, `{"error":{"code":"failed_precondition","message":%q}}`, n.refuse)
				return
			}
			n.imports = append(n.imports, ref.Digest)
			n.sandboxes[ref.Sandbox] = k.Tenant
			n.states[ref.Sandbox] = "paused"
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%q,"state":"paused"}`, ref.Sandbox)
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes":
			var out []map[string]any
			for id, tn := range n.sandboxes {
				if tn == k.Tenant || k.Admin {
					out = append(out, map[string]any{"id": id, "tenant": tn, "created_at": n.created[id]})
				}
			}
			_ = json.NewEncoder(w).Encode(map[string]any{"sandboxes": out})
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes/"):
			id, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"), "/")
			if tn, ok := n.sandboxes[id]; !ok || (tn != k.Tenant && !k.Admin) {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			if r.Method == "DELETE" && rest == "" {
				delete(n.sandboxes, id)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			if r.Method == "GET" && rest == "" {
				fmt.Fprintf(w, `{"id":%q,"state":%q,"runtime":"qemu"}`, id, cmp.Or(n.states[id], "running"))
				return
			}
			if r.Method == "POST" && rest == "resume" {
				delete(n.states, id)
				n.resumed = append(n.resumed, id)
			}
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s %s on %s", r.Method, rest, b, name)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(n.srv.Close)
	return n
}

type staticNodes struct {
	mu    sync.Mutex
	nodes []cluster.Node
}

func (s *staticNodes) Nodes() []cluster.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]cluster.Node(nil), s.nodes...)
}

// TestControlTierPlacesQuotasAndProxies: creates spread over the live
// nodes; the tenant's quota counts every replica's placements (two
// replicas share one catalog); calls about a sandbox reach its node with
// the node token and the caller, never the tenant's key; another tenant
// gets 404; a delete frees the quota; a lost node's sandboxes list as
// failed and refuse calls.
func TestControlTierPlacesQuotasAndProxies(t *testing.T) {
	ctx := t.Context()
	catalog := filepath.Join(t.TempDir(), "catalog.db")
	st, err := store.Open(ctx, catalog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, key, _ := st.CreateKey(ctx, store.APIKey{Tenant: "acme", MaxSandboxes: 4})
	_, other, _ := st.CreateKey(ctx, store.APIKey{Tenant: "umbrella"})
	token := strings.Repeat("t", api.MinNodeToken)
	n1, n2 := newFakeNode(t, "n1", token), newFakeNode(t, "n2", token)
	nodes := &staticNodes{}
	for _, n := range []*fakeNode{n1, n2} {
		nodes.nodes = append(nodes.nodes, cluster.Node{Name: n.name, Address: n.srv.URL, Live: true, Runtimes: []string{"qemu"}, CPUs: 8, MemoryMiB: 16384})
	}
	var replicas []*httptest.Server
	var servers []*Server
	for range 2 {
		st2, err := store.Open(ctx, catalog)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st2.Close() })
		s, err := New(Config{Store: st2, Nodes: nodes, NodeToken: []byte(token)})
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, s)
		srv := httptest.NewServer(s)
		t.Cleanup(srv.Close)
		replicas = append(replicas, srv)
	}
	call := func(r int, k, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, replicas[r].URL+path, strings.NewReader(body))
		if k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
		req.Header.Set(api.NodeCallerHeader, `{"Tenant":"umbrella","Admin":true}`) // forged: must not reach a node
		res, err := replicas[r].Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := call(0, "", "GET", "/v1/sandboxes", ""); code != http.StatusUnauthorized {
		t.Fatalf("no key: %d", code)
	}
	var ids []string
	for i := range 4 {
		code, body := call(i%2, key, "POST", "/v1/sandboxes", `{"cpus":1}`)
		if code != http.StatusCreated {
			t.Fatalf("create %d: %d %s", i, code, body)
		}
		var sb struct{ ID string }
		_ = json.Unmarshal([]byte(body), &sb)
		ids = append(ids, sb.ID)
	}
	if len(n1.sandboxes) == 0 || len(n2.sandboxes) == 0 {
		t.Fatalf("4 creates on 2 empty nodes: n1 %d, n2 %d", len(n1.sandboxes), len(n2.sandboxes))
	}
	if code, body := call(1, key, "POST", "/v1/sandboxes", `{}`); code != http.StatusTooManyRequests || !strings.Contains(body, "max_sandboxes") {
		t.Fatalf("a fifth sandbox over max 4, across replicas: %d %s", code, body)
	}
	for _, id := range ids {
		code, body := call(1, key, "POST", "/v1/sandboxes/"+id+"/exec", "payload")
		if code != http.StatusOK || !strings.HasPrefix(body, "POST exec payload on "+id[:2]) {
			t.Fatalf("exec %s through replica 1: %d %s", id, code, body)
		}
		if code, _ := call(0, other, "GET", "/v1/sandboxes/"+id, ""); code != http.StatusNotFound {
			t.Fatalf("another tenant reached %s: %d", id, code)
		}
	}
	for _, n := range []*fakeNode{n1, n2} {
		for _, c := range n.callers {
			if !strings.Contains(c, `"Tenant":"acme"`) || strings.Contains(c, "umbrella") {
				t.Fatalf("%s got caller %s", n.name, c)
			}
		}
	}
	if code, body := call(0, key, "GET", "/v1/sandboxes", ""); code != http.StatusOK || strings.Count(body, `"id"`) != 4 {
		t.Fatalf("list: %d %s", code, body)
	}
	if code, _ := call(0, key, "DELETE", "/v1/sandboxes/"+ids[0], ""); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	if code, body := call(1, key, "POST", "/v1/sandboxes", `{}`); code != http.StatusCreated {
		t.Fatalf("create after a delete: %d %s", code, body)
	}
	// A sandbox gone from its node (its lifetime ran out) stops counting
	// at the next create.
	n2.mu.Lock()
	var gone string
	for id := range n2.sandboxes {
		gone = id
		delete(n2.sandboxes, id)
		break
	}
	n2.mu.Unlock()
	if code, body := call(0, key, "POST", "/v1/sandboxes", `{}`); code != http.StatusCreated {
		t.Fatalf("create after %s ended on its node: %d %s", gone, code, body)
	}

	// n1 is lost.
	nodes.mu.Lock()
	nodes.nodes[0].Live = false
	nodes.mu.Unlock()
	servers[0].OnNodeLost(cluster.Node{Name: "n1"}, "its Lease was not renewed for 10s")
	code, body := call(1, key, "GET", "/v1/sandboxes", "")
	if code != http.StatusOK || !strings.Contains(body, `"state":"failed"`) || !strings.Contains(body, "its node n1 was lost") {
		t.Fatalf("list after n1 was lost: %d %s", code, body)
	}
	for id, tn := range n1.sandboxes {
		if tn != "acme" {
			continue
		}
		if code, body := call(0, key, "POST", "/v1/sandboxes/"+id+"/exec", ""); code != http.StatusConflict || !strings.Contains(body, "was lost") {
			t.Fatalf("exec on %s of the lost n1: %d %s", id, code, body)
		}
	}
	for range 3 {
		if code, body := call(0, key, "POST", "/v1/sandboxes", `{}`); code == http.StatusCreated && !strings.HasPrefix(body, `{"id":"n2-`) {
			t.Fatalf("placed on the lost n1: %s", body)
		}
	}
}

// TestControlTierRateLimitsATenant: a tenant over its keys' rate gets 429
// with Retry-After; another tenant is not slowed.
func TestControlTierRateLimitsATenant(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, slow, _ := st.CreateKey(ctx, store.APIKey{Tenant: "slow", RatePerMin: 20})
	_, fast, _ := st.CreateKey(ctx, store.APIKey{Tenant: "fast"})
	s, err := New(Config{Store: st, Nodes: &staticNodes{}, NodeToken: []byte(strings.Repeat("t", api.MinNodeToken))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	get := func(key string) *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	ok, limited := 0, 0
	for range 10 {
		switch res := get(slow); res.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			limited++
			if res.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
		default:
			t.Fatalf("status %d", res.StatusCode)
		}
	}
	// A burst of a tenth of 20 per minute: 2 pass at once.
	if ok != 2 || limited != 8 {
		t.Fatalf("10 calls at 20 per minute: %d passed, %d limited", ok, limited)
	}
	if res := get(fast); res.StatusCode != http.StatusOK {
		t.Fatalf("another tenant: %d", res.StatusCode)
	}
}

// TestControlTierMovesAPausedSandboxOffALostNode: a pause records the
// bundle its node wrote; a call that may resume the sandbox drops it; a
// lost node's sandbox with a bundle is listed paused, and its next call
// has another node import the bundle and answers from there; a node that
// refuses the bundle fails the sandbox with its reason.
func TestControlTierMovesAPausedSandboxOffALostNode(t *testing.T) {
	ctx := t.Context()
	st, s, _, n2, nodes, call := twoNodeRig(t)
	bundleOf := func(id string) string {
		p, err := st.PlacementOf(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return p.BundleDigest
	}
	ids := createVia(t, call, 3)
	for _, id := range ids {
		if code, body := call("POST", "/v1/sandboxes/"+id+"/pause", `{}`); code != http.StatusOK || bundleOf(id) == "" {
			t.Fatalf("pause: %d %s; bundle %q", code, body, bundleOf(id))
		}
	}
	a, b, c := ids[0], ids[1], ids[2]
	// A call that may resume it drops the bundle; the next pause writes one.
	if code, _ := call("POST", "/v1/sandboxes/"+a+"/exec", `{}`); code != http.StatusOK || bundleOf(a) != "" {
		t.Fatalf("exec: %d; bundle after it %q", code, bundleOf(a))
	}
	call("POST", "/v1/sandboxes/"+a+"/pause", `{}`)
	digest := bundleOf(a)

	// n1 is lost; n2 is live.
	nodes.mu.Lock()
	nodes.nodes[0].Live, nodes.nodes[1].Live = false, true
	nodes.mu.Unlock()
	s.OnNodeLost(cluster.Node{Name: "n1"}, "its Lease was not renewed")
	if code, body := call("GET", "/v1/sandboxes", ""); code != http.StatusOK || strings.Count(body, `"state":"paused"`) != 3 || !strings.Contains(body, "n1 is not live") {
		t.Fatalf("list after n1 was lost: %d %s", code, body)
	}
	// Deleted while its node is lost: the placement goes, and a live node
	// drops its bundle from the shared store.
	digestC := bundleOf(c)
	if code, body := call("DELETE", "/v1/sandboxes/"+c, ""); code != http.StatusNoContent {
		t.Fatalf("delete while its node is lost: %d %s", code, body)
	}
	n2.mu.Lock()
	dropped := append([]string(nil), n2.dropped...)
	n2.mu.Unlock()
	if len(dropped) != 1 || dropped[0] != digestC {
		t.Fatalf("n2 dropped %v, want [%s]", dropped, digestC)
	}
	if _, err := st.PlacementOf(ctx, c); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("placement after the delete: %v", err)
	}
	code, body := call("POST", "/v1/sandboxes/"+a+"/exec", `{"cmd":["true"]}`)
	if code != http.StatusOK || !strings.HasSuffix(body, "on n2") {
		t.Fatalf("exec after n1 was lost: %d %s", code, body)
	}
	n2.mu.Lock()
	imported := append([]string(nil), n2.imports...)
	n2.mu.Unlock()
	if len(imported) != 1 || imported[0] != digest {
		t.Fatalf("n2 imported %v, want [%s]", imported, digest)
	}
	if p, _ := st.PlacementOf(ctx, a); p.Node != "n2" || p.BundleDigest != "" {
		t.Fatalf("placement after the move: %+v", p)
	}
	evs, _ := st.ListEvents(ctx, store.EventFilter{Type: "sandbox.move"})
	if len(evs) != 1 || evs[0].SandboxID != a || evs[0].Detail["from"] != "n1" || evs[0].Detail["to"] != "n2" {
		t.Fatalf("sandbox.move events: %+v", evs)
	}

	// A node that refuses the bundle: the sandbox is failed, saying why.
	n2.mu.Lock()
	n2.refuse = "it was paused with guest kernel sha256:0123; this node's is sha256:4567"
	n2.mu.Unlock()
	code, body = call("POST", "/v1/sandboxes/"+b+"/exec", `{}`)
	if code != http.StatusConflict || !strings.Contains(body, "node n2 could not resume it: it was paused with guest kernel") {
		t.Fatalf("exec with a refused bundle: %d %s", code, body)
	}
	if p, _ := st.PlacementOf(ctx, b); p.State != store.PlacementLost || p.BundleDigest != "" {
		t.Fatalf("placement after a refused move: %+v", p)
	}
}

// TestControlTierReconcilesANodeThatComesBack: when a lost node is live
// again (and first tried at an address it left), its copy of a sandbox that moved is forgotten (its bundle
// stays), its sandboxes that were marked lost are placed again and
// answer, an old sandbox with no placement is removed, and a new one (a
// create in flight) is left alone.
func TestControlTierReconcilesANodeThatComesBack(t *testing.T) {
	ctx := t.Context()
	st, s, n1, _, nodes, call := twoNodeRig(t)
	ids := createVia(t, call, 2)
	moved, stayed := ids[0], ids[1]
	call("POST", "/v1/sandboxes/"+moved+"/pause", `{}`)
	n1.mu.Lock()
	n1.sandboxes["oldorphan"], n1.created["oldorphan"] = "acme", time.Now().Add(-time.Hour)
	n1.sandboxes["inflight"], n1.created["inflight"] = "acme", time.Now()
	n1.sandboxes["local"], n1.created["local"] = "", time.Now().Add(-time.Hour) // the node's own user's
	n1.mu.Unlock()

	// n1 is lost, its paused sandbox moves to n2; then n1 comes back.
	nodes.mu.Lock()
	nodes.nodes[0].Live, nodes.nodes[1].Live = false, true
	nodes.mu.Unlock()
	s.OnNodeLost(cluster.Node{Name: "n1"}, "its Lease was not renewed")
	if code, body := call("POST", "/v1/sandboxes/"+stayed+"/exec", `{}`); code != http.StatusConflict {
		t.Fatalf("exec on a lost node's sandbox: %d %s", code, body)
	}
	if code, body := call("POST", "/v1/sandboxes/"+moved+"/exec", `{}`); code != http.StatusOK || !strings.HasSuffix(body, "on n2") {
		t.Fatalf("exec after the move: %d %s", code, body)
	}
	// OnLive is given an address n1 no longer answers at (it came back
	// at another): the reconcile tries again with the Registry's view.
	nodes.mu.Lock()
	nodes.nodes[0].Live = true
	nodes.mu.Unlock()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	stale := nodes.Nodes()[0]
	stale.Address = gone.URL
	reconcileBackoff = 10 * time.Millisecond
	t.Cleanup(func() { reconcileBackoff = time.Second })
	s.OnNodeLive(stale)
	s.WaitReconciled()

	n1.mu.Lock()
	forgot, left := append([]string(nil), n1.forgot...), maps.Clone(n1.sandboxes)
	n1.mu.Unlock()
	if len(forgot) != 1 || forgot[0] != moved {
		t.Errorf("n1 forgot %v; want [%s]", forgot, moved)
	}
	for _, id := range []string{stayed, "inflight", "local"} {
		if _, ok := left[id]; !ok {
			t.Errorf("n1 lost %s", id)
		}
	}
	for _, id := range []string{moved, "oldorphan"} {
		if _, ok := left[id]; ok {
			t.Errorf("n1 still has %s", id)
		}
	}
	if code, body := call("POST", "/v1/sandboxes/"+stayed+"/exec", `{}`); code != http.StatusOK || !strings.HasSuffix(body, "on n1") {
		t.Fatalf("exec on the sandbox of the node that came back: %d %s", code, body)
	}
	for action, want := range map[string]int{"sandbox.orphan": 1, "sandbox.unplace": 1} {
		if evs, _ := st.ListEvents(ctx, store.EventFilter{Type: action}); len(evs) != want {
			t.Errorf("%s events: %+v", action, evs)
		}
	}
}

// twoNodeRig is a replica on a SQLite catalog over fake nodes n1 (live)
// and n2 (not live yet), and call, which calls it with tenant acme's key.
func twoNodeRig(t *testing.T) (*store.Store, *Server, *fakeNode, *fakeNode, *staticNodes, func(method, path, body string) (int, string)) {
	t.Helper()
	st, s, fakes, nodes, call := nodeRig(t,
		cluster.Node{Name: "n1", Live: true, Runtimes: []string{"qemu"}, CPUs: 8, MemoryMiB: 16384},
		cluster.Node{Name: "n2", Live: false, Runtimes: []string{"qemu"}, CPUs: 8, MemoryMiB: 16384})
	return st, s, fakes[0], fakes[1], nodes, call
}

// nodeRig is a replica on a SQLite catalog over one fake node per spec
// (its Address set to the fake's), and call, which calls it with tenant
// acme's key.
func nodeRig(t *testing.T, specs ...cluster.Node) (*store.Store, *Server, []*fakeNode, *staticNodes, func(method, path, body string) (int, string)) {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	_, key, _ := st.CreateKey(ctx, store.APIKey{Tenant: "acme"})
	token := strings.Repeat("t", api.MinNodeToken)
	nodes := &staticNodes{}
	var fakes []*fakeNode
	for _, n := range specs {
		f := newFakeNode(t, n.Name, token)
		n.Address = f.srv.URL
		fakes = append(fakes, f)
		nodes.nodes = append(nodes.nodes, n)
	}
	s, err := New(Config{Store: st, Nodes: nodes, NodeToken: []byte(token)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	call := func(method, path, body string) (int, string) {
		t.Helper()
		return do(t, srv, map[string]string{"Authorization": "Bearer " + key}, method, path, body)
	}
	return st, s, fakes, nodes, call
}

// do makes one call to srv with headers hdr.
func do(t *testing.T, srv *httptest.Server, hdr map[string]string, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestControlTierServesE2B: E2B's creates are placed and bound like
// /v1's, its lists merged, its calls about a sandbox proxied with the node
// token and the caller, its in-sandbox traffic (E2b-Sandbox-Id) proxied
// with the client's own credentials and nothing of the node's, and the
// errors the replica writes itself are in E2B's shape.
func TestControlTierServesE2B(t *testing.T) {
	st, s, n1, _, _, call := twoNodeRig(t)
	ctx := t.Context()
	_, other, _ := st.CreateKey(ctx, store.APIKey{Tenant: "other"})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	code, body := call("POST", "/v2/sandboxes", `{"templateID":"base","envVars":{"A":"1"}}`)
	var sb struct{ SandboxID string }
	if code != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil || sb.SandboxID == "" {
		t.Fatalf("E2B create: %d %s", code, body)
	}
	if p, err := st.PlacementOf(ctx, sb.SandboxID); err != nil || p.Node != "n1" || p.Tenant != "acme" {
		t.Fatalf("placement of the E2B create: %+v %v", p, err)
	}
	if code, body := call("GET", "/sandboxes?metadata=x%3Dy", ""); code != http.StatusOK || !strings.Contains(body, sb.SandboxID) || !strings.HasPrefix(body, "[") {
		t.Fatalf("E2B list: %d %s", code, body)
	}
	if code, body := call("POST", "/sandboxes/"+sb.SandboxID+"/timeout", `{"timeout":60}`); code != http.StatusOK || body != "e2b POST timeout on n1" {
		t.Fatalf("E2B timeout through the replica: %d %s", code, body)
	}
	e2bDo := func(key, method, path string, hdr map[string]string) (int, string) {
		t.Helper()
		if hdr == nil {
			hdr = map[string]string{}
		}
		if key != "" {
			hdr["X-API-Key"] = key
		}
		return do(t, srv, hdr, method, path, "")
	}
	if code, body := e2bDo(other, "GET", "/sandboxes/"+sb.SandboxID, nil); code != http.StatusNotFound || !strings.Contains(body, `"code":404`) {
		t.Fatalf("another tenant's E2B get: %d %s", code, body)
	}
	if code, body := e2bDo("", "GET", "/sandboxes", nil); code != http.StatusUnauthorized || !strings.Contains(body, `"code":401`) {
		t.Fatalf("no key: %d %s", code, body)
	}
	// In-sandbox traffic: routed by the header, with the client's token,
	// without a key; a spoofed caller header is dropped.
	code, body = e2bDo("", "POST", "/process.Process/Start", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "X-Access-Token": "tok-1", api.NodeCallerHeader: `{"tenant":"other","admin":true}`})
	if code != http.StatusOK || body != "envd "+sb.SandboxID+" POST /process.Process/Start token=tok-1 on n1" {
		t.Fatalf("in-sandbox traffic: %d %s", code, body)
	}
	if code, body := e2bDo("", "GET", "/health", map[string]string{"E2b-Sandbox-Id": "nosuchsandbox"}); code != http.StatusNotFound || !strings.Contains(body, `"code":404`) {
		t.Fatalf("in-sandbox traffic for no sandbox: %d %s", code, body)
	}
	if code, body := call("POST", "/sandboxes/"+sb.SandboxID+"/fork", `{}`); code != http.StatusNotImplemented || !strings.Contains(body, "forks are not served") {
		t.Fatalf("E2B fork: %d %s", code, body)
	}
	if code, body := call("DELETE", "/sandboxes/"+sb.SandboxID, ""); code != http.StatusNoContent {
		t.Fatalf("E2B kill: %d %s", code, body)
	}
	if _, err := st.PlacementOf(ctx, sb.SandboxID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the killed sandbox's placement: %v", err)
	}
	n1.mu.Lock()
	left := len(n1.sandboxes)
	n1.mu.Unlock()
	if left != 0 {
		t.Fatalf("node n1 still has %d sandboxes", left)
	}
}

// TestControlTierPlacesATemplateWhereItIsBuilt: a create of a template a
// SandboxTemplate declares goes only to the nodes that built it, and is
// refused, saying why, when none of them is live.
func TestControlTierPlacesATemplateWhereItIsBuilt(t *testing.T) {
	_, s, _, _, _, call := twoNodeRig(t)
	var built []string
	s.cfg.Templates = func(tenant, name string) ([]string, bool) {
		return built, tenant == "acme" && name == "tpl"
	}
	built = []string{"n2"} // n2 is not live
	if code, body := call("POST", "/v1/sandboxes", `{"image":"tpl"}`); code != http.StatusPreconditionFailed || !strings.Contains(body, "no live node has template tpl built") {
		t.Fatalf("a template built on no live node: %d %s", code, body)
	}
	built = []string{"n1"}
	if code, body := call("POST", "/v1/sandboxes", `{"image":"tpl"}`); code != http.StatusCreated || !strings.Contains(body, `"id":"n1-`) {
		t.Fatalf("a template built on n1: %d %s", code, body)
	}
	// An image no SandboxTemplate declares is placed as before.
	if code, body := call("POST", "/v1/sandboxes", `{"image":"base"}`); code != http.StatusCreated {
		t.Fatalf("an image: %d %s", code, body)
	}
}

// TestControlTierRecordsANodesOwnBundles: the bundles a node wrote of its
// own (an idle pause's) are recorded in the placements on that node that
// have none; another node's placement, one with a bundle already, and a
// malformed ref are left alone.
func TestControlTierRecordsANodesOwnBundles(t *testing.T) {
	ctx := t.Context()
	st, s, n1, _, nodes, _ := twoNodeRig(t)
	place := func(node string) string {
		t.Helper()
		p, err := st.ReservePlacement(ctx, store.Placement{Tenant: "acme", Node: node, CPUs: 1, MemoryMiB: 512}, store.PlacementQuota{})
		id := statedir.NewID()
		if err == nil {
			err = st.BindPlacement(ctx, p.ID, id)
		}
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	a, b, c, elsewhere := place("n1"), place("n1"), place("n1"), place("n2")
	pb, _ := st.PlacementOf(ctx, b)
	if err := st.SetPlacementBundle(ctx, pb.ID, fmt.Sprintf("sha256:%064x", 7), 70); err != nil {
		t.Fatal(err)
	}
	pb, _ = st.PlacementOf(ctx, b)
	digest := func(i int) string { return fmt.Sprintf("sha256:%064x", 0xabc000+i) }
	n1.mu.Lock()
	n1.bundles = fmt.Sprintf(`{"bundles":[{"sandbox":%q,"digest":%q,"bytes":10},{"sandbox":%q,"digest":%q,"bytes":11},{"sandbox":%q,"digest":"md5:x","bytes":12},{"sandbox":%q,"digest":%q,"bytes":13}]}`,
		a, digest(1), b, digest(2), c, elsewhere, digest(4))
	n1.mu.Unlock()
	s.syncBundles(ctx, nodes.Nodes()[0])
	if p, _ := st.PlacementOf(ctx, a); p.BundleDigest != digest(1) || p.BundleBytes != 10 {
		t.Fatalf("a's placement after the sync: %+v", p)
	}
	if p, _ := st.PlacementOf(ctx, b); p.BundleDigest != pb.BundleDigest {
		t.Fatalf("b's bundle was replaced: %+v, was %s", p, pb.BundleDigest)
	}
	if p, _ := st.PlacementOf(ctx, c); p.BundleDigest != "" {
		t.Fatalf("a malformed ref was recorded: %+v", p)
	}
	if p, _ := st.PlacementOf(ctx, elsewhere); p.BundleDigest != "" {
		t.Fatalf("another node's placement took n1's ref: %+v", p)
	}
}

// TestControlTierMovesALiveSandboxOnRequest: an admin moves a running
// sandbox to another live node (exported, imported there, forgotten by
// the first, resumed); a tenant may not; a node that refuses it leaves it
// where it was, running again.
func TestControlTierMovesALiveSandboxOnRequest(t *testing.T) {
	ctx := t.Context()
	st, s, n1, n2, nodes, call := twoNodeRig(t)
	id := createVia(t, call, 1)[0] // on n1: n2 is not live yet
	nodes.mu.Lock()
	nodes.nodes[1].Live = true
	nodes.mu.Unlock()
	_, admin, _ := st.CreateKey(ctx, store.APIKey{Tenant: "ops", Admin: true})
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	move := func(key, body string) (int, string) {
		return do(t, srv, map[string]string{"Authorization": "Bearer " + key}, "POST", "/v1/sandboxes/"+id+"/move", body)
	}
	if code, body := call("POST", "/v1/sandboxes/"+id+"/move", `{}`); code != http.StatusForbidden {
		t.Fatalf("a tenant's move: %d %s", code, body)
	}
	if code, body := move(admin, `{"to":"n1"}`); code != http.StatusBadRequest {
		t.Fatalf("a move to where it is: %d %s", code, body)
	}
	code, body := move(admin, `{}`)
	if code != http.StatusOK || !strings.Contains(body, `"from":"n1"`) || !strings.Contains(body, `"to":"n2"`) || !strings.Contains(body, `"state":"running"`) {
		t.Fatalf("move: %d %s", code, body)
	}
	n1.mu.Lock()
	forgot := slices.Clone(n1.forgot)
	n1.mu.Unlock()
	n2.mu.Lock()
	imports, resumed := slices.Clone(n2.imports), slices.Clone(n2.resumed)
	n2.mu.Unlock()
	if len(imports) != 1 || !slices.Equal(forgot, []string{id}) || !slices.Equal(resumed, []string{id}) {
		t.Fatalf("n2 imported %v and resumed %v; n1 forgot %v", imports, resumed, forgot)
	}
	if p, _ := st.PlacementOf(ctx, id); p.Node != "n2" || p.BundleDigest != "" {
		t.Fatalf("placement after the move: %+v", p)
	}
	evs, _ := st.ListEvents(ctx, store.EventFilter{Type: "sandbox.move"})
	if len(evs) != 1 || evs[0].Detail["reason"] != "requested" {
		t.Fatalf("sandbox.move events: %+v", evs)
	}

	// Back to n1, which refuses it: it stays on n2, running again.
	n1.mu.Lock()
	n1.refuse = "its guest kernel differs"
	n1.mu.Unlock()
	if code, body := move(admin, `{"to":"n1"}`); code != http.StatusConflict || !strings.Contains(body, "node n1 could not take") || !strings.Contains(body, "stays on n2") {
		t.Fatalf("a refused move: %d %s", code, body)
	}
	if p, _ := st.PlacementOf(ctx, id); p.Node != "n2" || p.BundleDigest != "" {
		t.Fatalf("placement after the refused move: %+v", p)
	}
	n2.mu.Lock()
	resumed = slices.Clone(n2.resumed)
	n2.mu.Unlock()
	if len(resumed) != 2 {
		t.Fatalf("n2 resumed %v, want the sandbox resumed again after the refused move", resumed)
	}
}

// createVia creates n sandboxes through call and returns their ids.
func createVia(t *testing.T, call func(method, path, body string) (int, string), n int) []string {
	t.Helper()
	var ids []string
	for range n {
		code, body := call("POST", "/v1/sandboxes", `{}`)
		var sb struct{ ID string }
		if code != http.StatusCreated || json.Unmarshal([]byte(body), &sb) != nil {
			t.Fatalf("create: %d %s", code, body)
		}
		ids = append(ids, sb.ID)
	}
	return ids
}

// TestControlTierMovesALostNodesSandboxToItsRuntime: a paused sandbox of
// a lost gVisor node resumes on the gVisor node, never on the qemu node
// beside it (whose import would refuse a gVisor bundle), though the qemu
// node has the more room; its placement records where it runs.
func TestControlTierMovesALostNodesSandboxToItsRuntime(t *testing.T) {
	ctx := t.Context()
	st, s, fakes, nodes, call := nodeRig(t,
		cluster.Node{Name: "n1", Live: true, Runtimes: []string{"gvisor"}, Arch: "amd64", CPUs: 8, MemoryMiB: 16384},
		cluster.Node{Name: "n2", Live: false, Runtimes: []string{"qemu"}, Arch: "amd64", CPUs: 64, MemoryMiB: 256 << 10},
		cluster.Node{Name: "n3", Live: false, Runtimes: []string{"gvisor"}, Arch: "amd64", CPUs: 8, MemoryMiB: 16384})
	n2 := fakes[1]
	ids := createVia(t, call, 4)
	for _, id := range ids {
		if p, err := st.PlacementOf(ctx, id); err != nil || p.Node != "n1" || p.Runtime != "gvisor" || p.Arch != "amd64" {
			t.Fatalf("placement of %s: %+v %v", id, p, err)
		}
		if code, body := call("POST", "/v1/sandboxes/"+id+"/pause", `{}`); code != http.StatusOK {
			t.Fatalf("pause: %d %s", code, body)
		}
	}
	nodes.mu.Lock()
	nodes.nodes[0].Live, nodes.nodes[1].Live, nodes.nodes[2].Live = false, true, true
	nodes.mu.Unlock()
	s.OnNodeLost(cluster.Node{Name: "n1"}, "its Lease was not renewed")
	for _, id := range ids {
		code, body := call("POST", "/v1/sandboxes/"+id+"/exec", `{"cmd":["true"]}`)
		if code != http.StatusOK || !strings.HasSuffix(body, "on n3") {
			t.Fatalf("exec after n1 was lost: %d %s", code, body)
		}
	}
	n2.mu.Lock()
	defer n2.mu.Unlock()
	if len(n2.imports) != 0 {
		t.Fatalf("the qemu node n2 was asked to import %v", n2.imports)
	}
}
