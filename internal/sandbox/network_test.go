package sandbox

import (
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shim"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// networkEvents returns sandbox id's sandbox.network events.
func networkEvents(t *testing.T, st *store.Store, id string) []store.Event {
	t.Helper()
	evs, err := st.ListEvents(t.Context(), store.EventFilter{SandboxID: id, Type: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Event
	for _, e := range evs {
		if e.Action == "sandbox.network" {
			out = append(out, e)
		}
	}
	return out
}

// TestSetNetworkRunning: a live change of a running sandbox's policy is
// stored, reaches its shim (applied "running"), keeps the rest of the
// network (secrets, limits) and is audited once with the old and new
// policy, as its caller; a refused change leaves the row and the trail as
// they were.
func TestSetNetworkRunning(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	id := r.start(t, "alice", func(sb *store.Sandbox, _ *shim.Config) {
		n, err := netconf.Spec{Mode: "deny", Allow: []string{"old.example.com"}, RateBytes: 1 << 20}.Normalize(nil)
		if err != nil {
			t.Fatal(err)
		}
		sb.Network = n
	})
	ch, err := r.m.SetNetwork(ctx, alice, id, EgressPolicy{Mode: "deny", Allow: []string{"api.example.com", "*.pypi.org:443"}})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Applied != "running" || ch.Network.Mode != "deny" || !slices.Equal(ch.Network.Allow, []string{"api.example.com", "*.pypi.org:443"}) {
		t.Fatalf("change %+v", ch)
	}
	sb, err := r.Store.GetSandbox(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sb.Network.Allow, ch.Network.Allow) || sb.Network.RateBytes != 1<<20 {
		t.Fatalf("stored network %+v", sb.Network)
	}
	evs := networkEvents(t, r.Store, id)
	if len(evs) != 1 {
		t.Fatalf("%d sandbox.network events, want 1", len(evs))
	}
	ev := evs[0]
	old, _ := ev.Detail["old"].(map[string]any)
	nw, _ := ev.Detail["new"].(map[string]any)
	if ev.Tenant != "alice" || ev.KeyID != "ka" || ev.Detail["via"] != "api" || ev.Detail["applied"] != "running" ||
		old["mode"] != "deny" || old["rules"] != float64(1) || nw["rules"] != float64(2) {
		t.Fatalf("event %+v", ev)
	}

	// Public, replacing the rules.
	if ch, err := r.m.SetNetwork(ctx, alice, id, EgressPolicy{Mode: "public"}); err != nil || ch.Network.Mode != "public" || len(ch.Network.Allow) != 0 {
		t.Fatalf("to public: %+v %v", ch, err)
	}

	// Refusals: nothing stored, nothing audited.
	for _, tc := range []struct {
		name string
		c    Caller
		p    EgressPolicy
		want error
	}{
		{"bad rule", alice, EgressPolicy{Mode: "deny", Allow: []string{"*.com"}}, errdefs.ErrInvalid},
		{"bad mode", alice, EgressPolicy{Mode: "sideways"}, errdefs.ErrInvalid},
		{"mode none", alice, EgressPolicy{Mode: "none"}, errdefs.ErrInvalid},
		{"floor by a tenant", alice, EgressPolicy{Mode: "deny", Allow: []string{"169.254.169.254"}}, errdefs.ErrPermissionDenied},
		{"private range by a tenant", alice, EgressPolicy{Allow: []string{"10.0.0.0/8:5432"}}, errdefs.ErrPermissionDenied},
		{"another tenant", bob, EgressPolicy{Mode: "public"}, ErrNoSandbox},
	} {
		_, err := r.m.SetNetwork(ctx, tc.c, id, tc.p)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.want == errdefs.ErrPermissionDenied { //nolint:errorlint // the table's own sentinel
			if fe, ok := errors.AsType[*FloorError](err); !ok || fe.Rule != tc.p.Allow[0] {
				t.Errorf("%s: %v is not the create's floor error", tc.name, err)
			}
		}
	}
	if sb, _ := r.Store.GetSandbox(ctx, id); sb.Network.Mode != "public" || len(sb.Network.Allow) != 0 {
		t.Fatalf("a refused change was stored: %+v", sb.Network)
	}
	if n := len(networkEvents(t, r.Store, id)); n != 2 {
		t.Fatalf("%d sandbox.network events, want 2 (refusals are not audited)", n)
	}

	// An admin may open the floor, as at create.
	if _, err := r.m.SetNetwork(ctx, admin, id, EgressPolicy{Mode: "deny", Allow: []string{"10.1.2.3:5432"}}); err != nil {
		t.Fatalf("admin opening the floor: %v", err)
	}
}

// TestSetNetworkPaused: a paused sandbox's new policy is stored for its
// resume (applied "resume") and audited; a sandbox in another state is
// refused.
func TestSetNetworkPaused(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	const id = "aaaaaaaaaaaa"
	if err := os.MkdirAll(m.L.Dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	ch, err := m.SetNetwork(ctx, alice, id, EgressPolicy{Allow: []string{"example.com"}})
	if err != nil || ch.Applied != "resume" || ch.Closed != 0 {
		t.Fatalf("paused: %+v %v", ch, err)
	}
	sb, err := m.Store.GetSandbox(ctx, id)
	if err != nil || sb.Network.Mode != "deny" || !slices.Equal(sb.Network.Allow, []string{"example.com"}) {
		t.Fatalf("stored %+v %v", sb.Network, err)
	}
	if evs := networkEvents(t, m.Store, id); len(evs) != 1 || evs[0].Detail["applied"] != "resume" {
		t.Fatalf("events %+v", evs)
	}
	// Held shim lock: a resume is under way.
	lock, err := m.takeShimLock(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.SetNetwork(ctx, alice, id, EgressPolicy{Mode: "public"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("while resuming: %v", err)
	}
	lock.Close()
	claimed, err := m.Store.Transition(ctx, id, store.Change{To: store.StateResuming, From: store.StatePaused, Claim: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Store.Transition(ctx, id, store.Change{To: store.StateFailed, From: store.StateResuming, Gen: claimed.Gen, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.SetNetwork(ctx, alice, id, EgressPolicy{Mode: "public"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("failed sandbox: %v", err)
	}
}

// TestCreateFloorRefusedToTenants: a create whose allow rules open the
// platform floor is refused to a caller that is not an admin, whatever
// the surface (the API checked it; MCP and E2B creates come here with
// their callers), with the live change's error; an admin's goes through.
func TestCreateFloorRefusedToTenants(t *testing.T) {
	r := newRunning(t)
	r.startInProcess(t)
	ctx := t.Context()
	floor := netconf.Spec{Mode: "deny", Allow: []string{"10.0.0.1:5432"}}
	for _, c := range []Caller{alice, bob, {Via: "mcp", KeyID: "mcp:session"}} {
		_, err := r.m.Create(ctx, c, CreateOptions{Network: floor})
		if fe, ok := errors.AsType[*FloorError](err); !ok || fe.Rule != "10.0.0.1:5432" || !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%+v: %v, want a FloorError", c, err)
		}
	}
	// Published ports likewise: a port on the server's host is the
	// operator's to open.
	ports := netconf.Spec{Ports: []netconf.Port{{GuestPort: 8080}}}
	for _, c := range []Caller{alice, {Via: "mcp", KeyID: "mcp:session"}} {
		if _, err := r.m.Create(ctx, c, CreateOptions{Network: ports}); !errors.Is(err, ErrPortsNeedAdmin) || !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%+v with ports: %v, want ErrPortsNeedAdmin", c, err)
		}
	}
	if dirs := r.sandboxDirs(t); len(dirs) != 0 {
		t.Fatalf("refused creates left %v", dirs)
	}
	sb, err := r.m.Create(ctx, admin, CreateOptions{Network: floor})
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	if err := r.m.Remove(ctx, admin, sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestSetNetworkShimUnreachable: when the running sandbox's shim does not
// take the new policy (here its socket is out of reach), the stored policy
// is put back, the call fails as unavailable and nothing is audited: the
// catalog never claims a policy the sandbox does not enforce.
func TestSetNetworkShimUnreachable(t *testing.T) {
	r := newRunning(t)
	ctx := t.Context()
	id := r.start(t, "alice", func(sb *store.Sandbox, _ *shim.Config) {
		sb.Network = netconf.Spec{Mode: "deny", Allow: []string{"old.example.com"}, MaxConns: netconf.DefaultMaxConns}
	})
	sock := r.L.Socket(id)
	if err := os.Rename(sock, sock+".away"); err != nil {
		t.Fatal(err)
	}
	_, err := r.m.SetNetwork(ctx, alice, id, EgressPolicy{Mode: "public"})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("unreachable shim: %v, want unavailable", err)
	}
	sb, err := r.Store.GetSandbox(ctx, id)
	if err != nil || sb.Network.Mode != "deny" || !slices.Equal(sb.Network.Allow, []string{"old.example.com"}) {
		t.Fatalf("stored after the failed change: %+v %v", sb.Network, err)
	}
	if evs := networkEvents(t, r.Store, id); len(evs) != 0 {
		t.Fatalf("a failed change was audited: %+v", evs)
	}
	if err := os.Rename(sock+".away", sock); err != nil {
		t.Fatal(err)
	}
	if ch, err := r.m.SetNetwork(ctx, alice, id, EgressPolicy{Mode: "public"}); err != nil || ch.Applied != "running" {
		t.Fatalf("after the socket came back: %+v %v", ch, err)
	}
}
