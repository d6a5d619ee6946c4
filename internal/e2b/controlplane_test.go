package e2b

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fakeSnapshots is the manager's snapshot part over fakeSandboxes (and its
// mutex). Like the real one it shows a caller only its tenant's snapshots,
// hides fork bases from lists, and makes forks all or none.
type fakeSnapshots struct {
	sbs   *fakeSandboxes
	snaps []store.Snapshot
	// fromSnapshot records CreateFromSnapshot's options.
	fromSnapshot []sandbox.CreateOptions
	// busy sandboxes run commands: no snapshot or fork without force.
	busy map[string]bool
	// held snapshots back other sandboxes' disks: no removal.
	held map[string]bool
}

// add records sb as a new sandbox of f.sbs; f.sbs.mu is held.
func (f *fakeSnapshots) add(sb store.Sandbox, timeout time.Duration) store.Sandbox {
	f.sbs.n++
	now := time.Now().Add(time.Duration(f.sbs.n) * time.Millisecond)
	sb.ID, sb.State, sb.CreatedAt, sb.ExpiresAt = fmt.Sprintf("sbx%017d", f.sbs.n), store.StateRunning, now, now.Add(timeout)
	f.sbs.sbs[sb.ID] = sb
	return sb
}

func (f *fakeSnapshots) find(tenant, name string) int {
	return slices.IndexFunc(f.snaps, func(sn store.Snapshot) bool { return sn.Tenant == tenant && sn.Name == name })
}

func (f *fakeSnapshots) snapshot(sb store.Sandbox, name string) (store.Snapshot, error) {
	if f.busy[sb.ID] {
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s runs commands", errdefs.ErrFailedPrecondition, sb.ID)
	}
	if f.find(sb.Tenant, name) >= 0 {
		return store.Snapshot{}, fmt.Errorf("%w: snapshot %q exists", errdefs.ErrConflict, name)
	}
	sn := store.Snapshot{Tenant: sb.Tenant, Name: name, ID: fmt.Sprintf("%032x", len(f.snaps)+1), SandboxID: sb.ID, Image: sb.Image,
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Network: sb.Network, Env: sb.Env,
		Created: time.Now().Add(time.Duration(len(f.snaps)) * time.Millisecond)}
	f.snaps = append(f.snaps, sn)
	return sn, nil
}

func (f *fakeSnapshots) Snapshot(_ context.Context, c sandbox.Caller, id, name string, _ bool) (store.Snapshot, error) {
	f.sbs.mu.Lock()
	defer f.sbs.mu.Unlock()
	sb, err := f.sbs.lookup(c, id)
	if err != nil {
		return store.Snapshot{}, err
	}
	if err := sandbox.ValidateSnapshotName(name); err != nil {
		return store.Snapshot{}, err
	}
	return f.snapshot(sb, name)
}

func (f *fakeSnapshots) CreateFromSnapshot(_ context.Context, c sandbox.Caller, name string, o sandbox.CreateOptions) (store.Sandbox, error) {
	f.sbs.mu.Lock()
	defer f.sbs.mu.Unlock()
	f.fromSnapshot = append(f.fromSnapshot, o)
	i := f.find(c.Tenant, name)
	if i < 0 || strings.HasPrefix(name, "_fork-") {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	sn := f.snaps[i]
	return f.add(store.Sandbox{Image: sn.Image, CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB, DiskMiB: sn.DiskMiB, Tenant: c.Tenant,
		Metadata: o.Metadata, Env: sn.Env, Network: sn.Network, Source: "snapshot:" + name}, o.Timeout), nil
}

func (f *fakeSnapshots) Fork(_ context.Context, c sandbox.Caller, id string, o sandbox.ForkOptions) ([]store.Sandbox, error) {
	count := o.Count
	f.sbs.mu.Lock()
	defer f.sbs.mu.Unlock()
	if count < 1 || count > sandbox.MaxForks {
		return nil, fmt.Errorf("%w: fork count must be 1 to %d", errdefs.ErrInvalid, sandbox.MaxForks)
	}
	sb, err := f.sbs.lookup(c, id)
	if err != nil {
		return nil, err
	}
	if _, err := f.snapshot(sb, fmt.Sprintf("_fork-%d", len(f.snaps))); err != nil {
		return nil, err
	}
	var out []store.Sandbox
	for range count {
		// A fork has the source's lifetime, here an hour.
		out = append(out, f.add(store.Sandbox{Image: sb.Image, CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Tenant: sb.Tenant,
			Metadata: sb.Metadata, Env: sb.Env, Network: sb.Network, Source: "fork:" + id}, time.Hour))
	}
	return out, nil
}

func (f *fakeSnapshots) RemoveSnapshot(_ context.Context, c sandbox.Caller, _, name string) error {
	f.sbs.mu.Lock()
	defer f.sbs.mu.Unlock()
	i := f.find(c.Tenant, name)
	switch {
	case i < 0:
		return fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	case f.held[name]:
		return fmt.Errorf("%w: snapshot %q backs sandboxes", errdefs.ErrFailedPrecondition, name)
	}
	f.snaps = slices.Delete(f.snaps, i, i+1)
	return nil
}

func (f *fakeSnapshots) PruneSnapshots(context.Context, sandbox.Caller) (int64, error) { return 0, nil }

func (f *fakeSnapshots) ListSnapshots(_ context.Context, c sandbox.Caller, _ string, _ bool) ([]store.Snapshot, error) {
	f.sbs.mu.Lock()
	defer f.sbs.mu.Unlock()
	var out []store.Snapshot
	for _, sn := range f.snaps { // oldest first, like the store
		if sn.Tenant == c.Tenant && !strings.HasPrefix(sn.Name, "_fork-") {
			out = append(out, sn)
		}
	}
	return out, nil
}

func (f *fakeSnapshots) GetSnapshot(_ context.Context, c sandbox.Caller, _, name string) (store.Snapshot, error) {
	f.sbs.mu.Lock()
	defer f.sbs.mu.Unlock()
	if i := f.find(c.Tenant, name); i >= 0 {
		return f.snaps[i], nil
	}
	return store.Snapshot{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
}

func (f *fakeSnapshots) DiskUsage(string) int64 { return 0 }

var _ api.Snapshots = (*fakeSnapshots)(nil)

// e2bError is E2B's error body.
type e2bError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// wantError checks that r is status with E2B's error body, code included
// (the SDK reads body.code), and a message containing want.
func wantError(t *testing.T, what string, r resp, status int, want string) {
	t.Helper()
	var e e2bError
	r.json(t, &e)
	if r.code != status || e.Code != status || !strings.Contains(e.Message, want) {
		t.Fatalf("%s: %d %s, want %d with %q", what, r.code, r.body, status, want)
	}
}

// accessToken is sandbox id's envd access token under the harness's
// secret.
func (h *harness) accessToken(id string) string {
	return (&handler{cfg: Config{Secret: []byte(strings.Repeat("s", 32))}}).accessToken(id)
}

func (h *harness) create(key, body string) Sandbox {
	h.t.Helper()
	r := h.do(key, "POST", "/v2/sandboxes", body)
	var sb Sandbox
	r.json(h.t, &sb)
	if r.code != http.StatusCreated {
		h.t.Fatalf("create %s: %d %s", body, r.code, r.body)
	}
	return sb
}

func TestFork(t *testing.T) {
	h := newHarness(t)
	src := h.create(h.alice, `{"metadata":{"k":"v"}}`)
	r := h.do(h.alice, "POST", "/sandboxes/"+src.SandboxID+"/fork", `{"timeout":60,"count":2}`)
	var forks []ForkResult
	r.json(t, &forks)
	if r.code != http.StatusCreated || len(forks) != 2 || strings.Contains(string(r.body), `"error"`) {
		t.Fatalf("fork: %d %s", r.code, r.body)
	}
	for _, f := range forks {
		s := f.Sandbox
		if s == nil || s.SandboxID == src.SandboxID || s.EnvdVersion != EnvdVersion || s.EnvdAccessToken == nil || *s.EnvdAccessToken != h.accessToken(s.SandboxID) {
			t.Fatalf("fork answer: %s", r.body)
		}
		sb := h.fake.sbs[s.SandboxID]
		if left := time.Until(sb.ExpiresAt); sb.Tenant != "alice" || left > 61*time.Second || left < 50*time.Second {
			t.Fatalf("fork %s: tenant %q, %v left (want the request's 60 s, not the source's hour)", s.SandboxID, sb.Tenant, left)
		}
	}
	if forks[0].Sandbox.SandboxID == forks[1].Sandbox.SandboxID {
		t.Fatalf("two forks, one id: %s", r.body)
	}
	// Without a timeout or count: one fork with E2B's default lifetime.
	r = h.do(h.alice, "POST", "/sandboxes/"+src.SandboxID+"/fork", `{}`)
	r.json(t, &forks)
	if r.code != http.StatusCreated || len(forks) != 1 {
		t.Fatalf("fork {}: %d %s", r.code, r.body)
	}
	if left := time.Until(h.fake.sbs[forks[0].Sandbox.SandboxID].ExpiresAt); left > DefaultTimeout || left < DefaultTimeout-10*time.Second {
		t.Fatalf("a fork without a timeout has %v left, want %v", left, DefaultTimeout)
	}
	for body, want := range map[string]string{
		`{"count":0}`:     "count must be between 1 and 16",
		`{"count":17}`:    "count must be between 1 and 16",
		`{"timeout":0}`:   "timeout must be between",
		`{"count":"two"}`: "bad JSON",
	} {
		wantError(t, "fork "+body, h.do(h.alice, "POST", "/sandboxes/"+src.SandboxID+"/fork", body), http.StatusBadRequest, want)
	}
	// Another tenant's sandbox and a missing one are 404 with code 404.
	wantError(t, "fork as bob", h.do(h.bob, "POST", "/sandboxes/"+src.SandboxID+"/fork", `{}`), http.StatusNotFound, "not found")
	wantError(t, "fork a missing sandbox", h.do(h.alice, "POST", "/sandboxes/nosuchsandboxaaaaaaa/fork", `{}`), http.StatusNotFound, "not found")
	// A sandbox that cannot be saved (running commands) says why.
	h.snaps.busy = map[string]bool{src.SandboxID: true}
	wantError(t, "fork a busy sandbox", h.do(h.alice, "POST", "/sandboxes/"+src.SandboxID+"/fork", `{}`), http.StatusPreconditionFailed, "runs commands")
	if n := len(h.fake.sbs); n != 4 {
		t.Fatalf("%d sandboxes, want the source and 3 forks", n)
	}
}

func TestSnapshots(t *testing.T) {
	h := newHarness(t)
	a, b := h.create(h.alice, `{}`), h.create(h.alice, `{}`)
	snap := func(key, id, body string) SnapshotInfo {
		t.Helper()
		r := h.do(key, "POST", "/sandboxes/"+id+"/snapshots", body)
		var sn SnapshotInfo
		r.json(t, &sn)
		if r.code != http.StatusCreated {
			t.Fatalf("snapshot %s %s: %d %s", id, body, r.code, r.body)
		}
		return sn
	}
	if sn := snap(h.alice, a.SandboxID, `{"name":"one"}`); sn.SnapshotID != "one" || !slices.Equal(sn.Names, []string{"one"}) {
		t.Fatalf("snapshot one: %+v", sn)
	}
	wantError(t, "the same name again", h.do(h.alice, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"one"}`), http.StatusConflict, "already has a snapshot")
	gen := snap(h.alice, a.SandboxID, `{}`)
	if !regexp.MustCompile(`^snap-[a-z2-7]{10}$`).MatchString(gen.SnapshotID) || sandbox.ValidateSnapshotName(gen.SnapshotID) != nil || !slices.Equal(gen.Names, []string{gen.SnapshotID}) {
		t.Fatalf("generated name: %+v", gen)
	}
	snap(h.alice, b.SandboxID, `{"name":"two"}`)
	wantError(t, "a bad name", h.do(h.alice, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"my-snap:v1"}`), http.StatusBadRequest, "my-snap:v1")
	wantError(t, "snapshot as bob", h.do(h.bob, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", `{"name":"x"}`), http.StatusNotFound, "not found")
	wantError(t, "snapshot a missing sandbox", h.do(h.alice, "POST", "/sandboxes/nosuchsandboxaaaaaaa/snapshots", `{}`), http.StatusNotFound, "not found")
	h.snaps.busy = map[string]bool{b.SandboxID: true}
	wantError(t, "snapshot a busy sandbox", h.do(h.alice, "POST", "/sandboxes/"+b.SandboxID+"/snapshots", `{}`), http.StatusPreconditionFailed, "runs commands")
	// Names are per tenant: bob has his own "one". A fork's base snapshot
	// is never listed.
	snap(h.bob, h.create(h.bob, `{}`).SandboxID, `{"name":"one"}`)
	h.snaps.busy = nil
	if r := h.do(h.alice, "POST", "/sandboxes/"+a.SandboxID+"/fork", `{}`); r.code != http.StatusCreated {
		t.Fatalf("fork: %d %s", r.code, r.body)
	}

	list := func(key, q string) ([]string, string) {
		t.Helper()
		r := h.do(key, "GET", "/snapshots?"+q, "")
		var out []SnapshotInfo
		r.json(t, &out)
		if r.code != http.StatusOK {
			t.Fatalf("list %s: %d %s", q, r.code, r.body)
		}
		var ids []string
		for _, sn := range out {
			if !slices.Equal(sn.Names, []string{sn.SnapshotID}) {
				t.Fatalf("list %s: %s", q, r.body)
			}
			ids = append(ids, sn.SnapshotID)
		}
		return ids, r.hdr.Get("X-Next-Token")
	}
	if got, next := list(h.alice, ""); !slices.Equal(got, []string{"two", gen.SnapshotID, "one"}) || next != "" {
		t.Fatalf("alice's snapshots, newest first: %v, next %q", got, next)
	}
	if got, _ := list(h.bob, ""); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("bob's snapshots: %v", got)
	}
	if got, _ := list(h.alice, "sandboxID="+a.SandboxID); !slices.Equal(got, []string{gen.SnapshotID, "one"}) {
		t.Fatalf("sandboxID filter: %v", got)
	}
	if got, _ := list(h.alice, "name=two"); !slices.Equal(got, []string{"two"}) {
		t.Fatalf("name filter: %v", got)
	}
	if got, _ := list(h.alice, "sandboxID="+a.SandboxID+"&name=two"); len(got) != 0 {
		t.Fatalf("both filters: %v", got)
	}
	page, next := list(h.alice, "limit=2")
	page2, next2 := list(h.alice, "limit=2&nextToken="+next)
	if !slices.Equal(page, []string{"two", gen.SnapshotID}) || next != gen.SnapshotID || !slices.Equal(page2, []string{"one"}) || next2 != "" {
		t.Fatalf("pages: %v next %q, %v next %q", page, next, page2, next2)
	}
	if page, next := list(h.alice, "limit=3"); len(page) != 3 || next != "" {
		t.Fatalf("a full last page: %v next %q", page, next)
	}
	wantError(t, "limit 0", h.do(h.alice, "GET", "/snapshots?limit=0", ""), http.StatusBadRequest, "limit")
	if r := h.do("", "GET", "/snapshots", ""); r.code != http.StatusUnauthorized {
		t.Fatalf("list without a key: %d", r.code)
	}

	// Delete: another tenant's is 404 (the SDK's false) and stays; a held
	// one says why; then 204, then 404.
	wantError(t, "delete as bob", h.do(h.bob, "DELETE", "/templates/two", ""), http.StatusNotFound, "not found")
	h.snaps.held = map[string]bool{"one": true}
	wantError(t, "delete a held snapshot", h.do(h.alice, "DELETE", "/templates/one", ""), http.StatusPreconditionFailed, "backs sandboxes")
	if r := h.do(h.alice, "DELETE", "/templates/two", ""); r.code != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	wantError(t, "delete again", h.do(h.alice, "DELETE", "/templates/two", ""), http.StatusNotFound, `snapshot "two" not found`)
	if got, _ := list(h.alice, ""); !slices.Equal(got, []string{gen.SnapshotID, "one"}) {
		t.Fatalf("after delete: %v", got)
	}
	if got, _ := list(h.bob, ""); !slices.Equal(got, []string{"one"}) {
		t.Fatalf("bob's after alice's delete: %v", got)
	}
}

func TestCreateFromSnapshot(t *testing.T) {
	h := newHarness(t)
	src := h.create(h.alice, `{"envVars":{"A":"1"}}`)
	if r := h.do(h.alice, "POST", "/sandboxes/"+src.SandboxID+"/snapshots", `{"name":"saved"}`); r.code != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", r.code, r.body)
	}
	images := len(h.fake.created)
	r := h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"saved","timeout":120,"metadata":{"k":"v"}}`)
	var sb Sandbox
	r.json(t, &sb)
	if r.code != http.StatusCreated || sb.TemplateID != "saved" || sb.SandboxID == src.SandboxID || sb.EnvdAccessToken == nil || *sb.EnvdAccessToken != h.accessToken(sb.SandboxID) {
		t.Fatalf("create from a snapshot: %d %s", r.code, r.body)
	}
	o := h.snaps.fromSnapshot[0]
	if o.Timeout != 120*time.Second || o.Metadata["k"] != "v" || o.Image != "" || o.Env != nil || o.Network.Mode != "" || o.CPUs != 0 {
		t.Fatalf("create from a snapshot: options %+v", o)
	}
	if row := h.fake.sbs[sb.SandboxID]; row.Source != "snapshot:saved" || row.Env["A"] != "1" || row.Tenant != "alice" {
		t.Fatalf("sandbox from a snapshot: %+v", row)
	}
	// The v1 route, and E2B's default lifetime.
	if r := h.do(h.alice, "POST", "/sandboxes", `{"templateID":"saved","allow_internet_access":true}`); r.code != http.StatusCreated || h.snaps.fromSnapshot[1].Timeout != DefaultTimeout {
		t.Fatalf("v1 create from a snapshot: %d %s, %+v", r.code, r.body, h.snaps.fromSnapshot)
	}
	if len(h.fake.created) != images {
		t.Fatalf("a create from a snapshot reached the image path")
	}
	// What comes from the snapshot is refused rather than ignored.
	wantError(t, "envVars", h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"saved","envVars":{"B":"2"}}`), http.StatusBadRequest, "snapshot's environment")
	wantError(t, "no internet", h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"saved","allow_internet_access":false}`), http.StatusBadRequest, "internet access")
	// A snapshot of a sandbox without internet takes allow_internet_access
	// false.
	closed := h.create(h.alice, `{"allow_internet_access":false}`)
	h.do(h.alice, "POST", "/sandboxes/"+closed.SandboxID+"/snapshots", `{"name":"closed"}`)
	if r := h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"closed","allow_internet_access":false}`); r.code != http.StatusCreated {
		t.Fatalf("no internet from a closed snapshot: %d %s", r.code, r.body)
	}
	if h.snaps.snaps[1].Network.Mode != "deny" {
		t.Fatalf("closed snapshot's network: %+v", h.snaps.snaps[1].Network)
	}
	// Another tenant's snapshot is no template of bob's: his create takes
	// the image path, where there is no image "saved".
	wantError(t, "bob from alice's snapshot", h.do(h.bob, "POST", "/v2/sandboxes", `{"templateID":"saved"}`), http.StatusNotFound, `template "saved" not found`)
	if got := h.fake.created[len(h.fake.created)-1]; got.Image != "saved" {
		t.Fatalf("bob's create: %+v", got)
	}
	// Names that are no snapshot are images, as before.
	if r := h.do(h.alice, "POST", "/v2/sandboxes", `{"templateID":"code-interpreter-v1"}`); r.code != http.StatusCreated || h.fake.created[len(h.fake.created)-1].Image != "base" {
		t.Fatalf("image create: %d %s", r.code, r.body)
	}
}

func TestNetworkUpdateAndMetrics(t *testing.T) {
	h := newHarness(t)
	sb := h.create(h.alice, `{}`)
	// Network updates replace the egress policy through the manager, mapped
	// as a create's network is.
	for body, want := range map[string]string{
		`{"denyOut":["0.0.0.0/0"],"allowOut":["api.example.com","1.1.1.1"]}`: "deny [api.example.com 1.1.1.1]",
		`{"allow_internet_access":false}`:                                    "deny []",
		`{"allowOut":["pypi.org"]}`:                                          "public []",
		`{}`:                                                                 "public []",
	} {
		if r := h.do(h.alice, "PUT", "/sandboxes/"+sb.SandboxID+"/network", body); r.code != http.StatusNoContent {
			t.Fatalf("network update %s: %d %s", body, r.code, r.body)
		}
		h.fake.mu.Lock()
		n := h.fake.sbs[sb.SandboxID].Network
		h.fake.mu.Unlock()
		if got := fmt.Sprintf("%s %v", n.Mode, n.Allow); got != want {
			t.Errorf("network update %s: %s, want %s", body, got, want)
		}
	}
	for body, want := range map[string]string{
		`{"denyOut":["1.2.3.4"]}`:                           "has no deny list",
		`{"rules":{"a.example":[{"transform":{}}]}}`:        "rules",
		`{"egressProxy":{"address":"p:8080"}}`:              "egressProxy",
		`{"denyOut":["0.0.0.0/0"],"allowOut":["*.com"]}`:    "*.com",
		`{"denyOut":["0.0.0.0/0"],"allowOut":["10.0.0.1"]}`: "admin key",
	} {
		code := http.StatusBadRequest
		if want == "admin key" {
			code = http.StatusForbidden
		}
		wantError(t, "network update "+body, h.do(h.alice, "PUT", "/sandboxes/"+sb.SandboxID+"/network", body), code, want)
	}
	// Metrics: one sample from the guest's account, CPU over a short window.
	r := h.do(h.alice, "GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", sb.SandboxID, time.Now().Add(-time.Minute).Unix(), time.Now().Add(time.Minute).Unix()), "")
	var ms []sandboxMetric
	r.json(t, &ms)
	if r.code != 200 || len(ms) != 1 || ms[0].CPUUsedPct != 50 || ms[0].MemUsed != 128<<20 || ms[0].MemTotal != 512<<20 || ms[0].DiskUsed != 1<<30 || ms[0].CPUCount != 1 {
		t.Fatalf("metrics: %d %s", r.code, r.body)
	}
	// A window that ended before now has no sample; a bad bound is 400.
	if r := h.do(h.alice, "GET", fmt.Sprintf("/sandboxes/%s/metrics?end=%d", sb.SandboxID, time.Now().Add(-time.Hour).Unix()), ""); r.code != 200 || strings.TrimSpace(string(r.body)) != "[]" {
		t.Fatalf("metrics of a past window: %d %s", r.code, r.body)
	}
	wantError(t, "metrics with a bad start", h.do(h.alice, "GET", "/sandboxes/"+sb.SandboxID+"/metrics?start=soon", ""), http.StatusBadRequest, "unix seconds")
	for _, who := range []string{h.bob, h.alice} {
		id := sb.SandboxID
		if who == h.alice {
			id = "nosuchsandboxaaaaaaa"
		}
		wantError(t, "network update of an invisible sandbox", h.do(who, "PUT", "/sandboxes/"+id+"/network", `{}`), http.StatusNotFound, "not found")
		wantError(t, "metrics of an invisible sandbox", h.do(who, "GET", "/sandboxes/"+id+"/metrics", ""), http.StatusNotFound, "not found")
	}
}

func TestRegisterWantsSnapshots(t *testing.T) {
	s, err := api.New(api.Config{Sandboxes: &fakeSandboxes{}, Files: struct{ api.Files }{}, Events: struct{ api.Events }{}, Keys: struct{ api.Keys }{}})
	if err != nil {
		t.Fatal(err)
	}
	err = Register(s, Config{Sandboxes: &fakeSandboxes{}, Execs: &fakeExecs{}, Files: &fakeFiles{}, Contexts: &fakeContexts{}, Secret: []byte(strings.Repeat("s", 32))})
	if err == nil || !strings.Contains(err.Error(), "Snapshots") {
		t.Fatalf("Register without Snapshots: %v", err)
	}
}
