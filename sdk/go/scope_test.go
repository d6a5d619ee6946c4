package airlock_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// TestScope: an admin's scope reaches the server as ?tenant= and ?all=1,
// and DeleteSnapshotIn never sends all.
func TestScope(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.RequestURI())
		mu.Unlock()
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_, _ = w.Write([]byte(`{"snapshots":[]}`))
	}))
	t.Cleanup(srv.Close)
	c := airlock.New(srv.URL, "k")
	if _, err := c.ListSnapshotsIn(t.Context(), airlock.Scope{Tenant: "t1", All: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListSnapshots(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSnapshotIn(t.Context(), airlock.Scope{Tenant: "t1", All: true}, "s1"); err != nil {
		t.Fatal(err)
	}
	want := []string{"GET /v1/snapshots?all=1&tenant=t1", "GET /v1/snapshots", "DELETE /v1/snapshots/s1?tenant=t1"}
	if len(got) != len(want) {
		t.Fatalf("requests %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: %q, want %q", i, got[i], want[i])
		}
	}
}
