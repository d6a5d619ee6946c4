package api

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestNetworkRoute: GET and PUT /v1/sandboxes/{id}/network read and
// replace a sandbox's egress policy for its tenant (another tenant's is
// 404); a tenant's rule that opens the platform floor is refused with the
// create's 403 and message, an admin's is taken; bad bodies are 400; each
// change is audited as its caller.
func TestNetworkRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	const path = "/v1/sandboxes/aliceaaaaaaa/network"
	if r := h.do(h.alice, "GET", path, nil); r.code != 200 {
		t.Fatalf("get: %d %s", r.code, r.body)
	}
	r := h.do(h.alice, "PUT", path, strings.NewReader(`{"mode":"deny","allow":["api.github.com","*.pypi.org:443"]}`))
	if r.code != 200 {
		t.Fatalf("put: %d %s", r.code, r.body)
	}
	var st NetworkState
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Applied != "running" || st.Network.Mode != "deny" || !slices.Equal(st.Network.Allow, []string{"api.github.com", "*.pypi.org:443"}) {
		t.Fatalf("put answer %+v", st)
	}
	r = h.do(h.alice, "GET", path, nil)
	if err := json.Unmarshal(r.body, &st); err != nil || len(st.Network.Allow) != 2 {
		t.Fatalf("get after put: %s %v", r.body, err)
	}

	// The floor: the same answer as a create's.
	const floor = `{"mode":"deny","allow":["10.0.0.0/8:5432"]}`
	put := h.do(h.alice, "PUT", path, strings.NewReader(floor))
	create := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"network":`+floor+`}`))
	if put.code != 403 || create.code != 403 || put.err(t).Error.Message != create.err(t).Error.Message ||
		put.err(t).Error.Code != "permission_denied" || !strings.Contains(put.err(t).Error.Message, `"10.0.0.0/8:5432"`) {
		t.Fatalf("floor: put %d %s; create %d %s", put.code, put.body, create.code, create.body)
	}
	if r := h.do(h.admin, "PUT", path, strings.NewReader(floor)); r.code != 200 {
		t.Fatalf("admin floor: %d %s", r.code, r.body)
	}

	for _, tc := range []struct {
		key, body string
		code      int
	}{
		{h.bob, `{"mode":"public"}`, 404},
		{h.alice, `{"mode":"deny","allow":["*.com"]}`, 400},
		{h.alice, `{"mode":"sideways"}`, 400},
		{h.alice, `{"mode":"none"}`, 400},
		{h.alice, `{"mode":"deny","secrets":[]}`, 400},
		{h.alice, `{"mode":"deny","allow":"x"}`, 400},
	} {
		if r := h.do(tc.key, "PUT", path, strings.NewReader(tc.body)); r.code != tc.code {
			t.Errorf("%s: %d %s, want %d", tc.body, r.code, r.body, tc.code)
		}
	}
	if r := h.do(h.bob, "GET", path, nil); r.code != 404 {
		t.Errorf("bob's get: %d", r.code)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{SandboxID: "aliceaaaaaaa"})
	if err != nil {
		t.Fatal(err)
	}
	var who []string
	for _, e := range evs {
		if e.Action == "sandbox.network" {
			who = append(who, e.Tenant)
		}
	}
	if !slices.Equal(who, []string{"ops", "alice"}) && !slices.Equal(who, []string{"alice", "ops"}) {
		t.Fatalf("sandbox.network events by %v, want alice's and the admin's", who)
	}
}
