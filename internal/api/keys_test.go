package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestKeysAdminRoutes: an admin lists keys (never a secret or hash) and
// changes a key's limits, the outbound abuse limits among them; the fields
// not given stay; the change is audited; a tenant's key gets 403.
func TestKeysAdminRoutes(t *testing.T) {
	h := newHarness(t, store.APIKey{MaxSandboxes: 3})
	var list struct{ Keys []keyInfo }
	r := h.do(h.admin, "GET", "/v1/keys", nil)
	if r.code != http.StatusOK || json.Unmarshal(r.body, &list) != nil || len(list.Keys) != 3 {
		t.Fatalf("GET /v1/keys: %d %s", r.code, r.body)
	}
	if strings.Contains(string(r.body), h.alice[14:]) || strings.Contains(string(r.body), "hash") {
		t.Fatalf("the key list shows a secret: %s", r.body)
	}
	var alice keyInfo
	for _, k := range list.Keys {
		if k.Tenant == "alice" {
			alice = k
		}
	}
	r = h.do(h.admin, "PATCH", "/v1/keys/"+alice.ID, strings.NewReader(`{"net_conn_rate": 20, "net_dests_per_min": -1}`))
	var got keyInfo
	if r.code != http.StatusOK || json.Unmarshal(r.body, &got) != nil {
		t.Fatalf("PATCH: %d %s", r.code, r.body)
	}
	if got.NetConnRate != 20 || got.NetDestsPerMin != -1 || got.NetUDPRate != 0 || got.MaxSandboxes != 3 || got.Tenant != "alice" {
		t.Fatalf("after PATCH: %+v", got)
	}
	k, err := h.st.GetKey(t.Context(), alice.ID)
	if err != nil || k.NetConnRate != 20 || k.NetDestsPerMin != -1 || k.MaxSandboxes != 3 {
		t.Fatalf("stored: %+v %v", k, err)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{Type: "key"})
	if err != nil || len(evs) != 1 || evs[0].Action != "key.update" || evs[0].Detail["key_id"] != alice.ID || evs[0].Tenant != "ops" {
		t.Fatalf("audit: %+v %v", evs, err)
	}
	for _, tc := range []struct {
		key, id, body string
		code          int
	}{
		{h.alice, alice.ID, `{"net_conn_rate": -1}`, http.StatusForbidden},
		{h.alice, "", "", http.StatusForbidden}, // GET /v1/keys
		{h.admin, "0000000000", `{"net_conn_rate": 1}`, http.StatusNotFound},
		{h.admin, alice.ID, `{"net_conn_rate": 70000}`, http.StatusBadRequest},
		{h.admin, alice.ID, `{"max_sandboxes": -1}`, http.StatusBadRequest},
		{h.admin, alice.ID, `{"tenant": "bob"}`, http.StatusBadRequest},
	} {
		method, path := "PATCH", "/v1/keys/"+tc.id
		if tc.id == "" {
			method, path = "GET", "/v1/keys"
		}
		if r := h.do(tc.key, method, path, strings.NewReader(tc.body)); r.code != tc.code {
			t.Errorf("%s %s %s: %d %s, want %d", method, path, tc.body, r.code, r.body, tc.code)
		}
	}
	if k, _ := h.st.GetKey(t.Context(), alice.ID); k.NetConnRate != 20 || k.Tenant != "alice" {
		t.Fatalf("refused requests changed the key: %+v", k)
	}
}
