package airlock_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// TestVolumes checks what the volume methods send and decode, and the
// volumes and host mounts a create sends (a host mount's read_only always
// sent, true unless ReadWrite).
func TestVolumes(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string // "METHOD PATH BODY"
	vol := `{"name":"data","id":"vol1","tenant":"t","size_mb":%d,"allocated_bytes":4096,"created_at":"2026-11-26T07:00:00Z","guest_written":false,"attachments":[{"sandbox_id":"sb1","path":"/data","read_only":true}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(b)))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/volumes":
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, strings.Replace(vol, "%d", "64", 1))
		case "GET /v1/volumes":
			_, _ = io.WriteString(w, `{"volumes":[`+strings.Replace(vol, "%d", "64", 1)+`]}`)
		case "GET /v1/volumes/data":
			_, _ = io.WriteString(w, strings.Replace(vol, "%d", "64", 1))
		case "POST /v1/volumes/data/resize":
			_, _ = io.WriteString(w, strings.Replace(vol, "%d", "128", 1))
		case "DELETE /v1/volumes/data":
			w.WriteHeader(http.StatusNoContent)
		case "DELETE /v1/volumes/busy":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":{"code":"conflict","message":"the volume is mounted by a sandbox","request_id":"r1"}}`)
		case "POST /v1/sandboxes":
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"sb1","state":"running","mounts":[{"volume":"data","path":"/data","read_only":false},{"host_path":"/srv","path":"/srv","read_only":true}]}`)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	c := airlock.New(srv.URL, "key")
	ctx := t.Context()

	v, err := c.CreateVolume(ctx, "data", 64)
	if err != nil || v.Name != "data" || v.SizeMB != 64 || v.AllocatedBytes != 4096 || len(v.Attachments) != 1 || !v.Attachments[0].ReadOnly {
		t.Fatalf("CreateVolume = %+v, %v", v, err)
	}
	if vs, err := c.ListVolumes(ctx); err != nil || len(vs) != 1 || vs[0].ID != "vol1" {
		t.Fatalf("ListVolumes = %+v, %v", vs, err)
	}
	if v, err := c.GetVolume(ctx, "data"); err != nil || v.CreatedAt.IsZero() {
		t.Fatalf("GetVolume = %+v, %v", v, err)
	}
	if v, err := c.ResizeVolume(ctx, "data", 128); err != nil || v.SizeMB != 128 {
		t.Fatalf("ResizeVolume = %+v, %v", v, err)
	}
	if err := c.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVolume(ctx, "busy"); !errors.Is(err, airlock.ErrConflict) {
		t.Fatalf("DeleteVolume(busy) = %v", err)
	}
	sb, err := c.Create(ctx, airlock.CreateOptions{
		Volumes:    []airlock.VolumeMount{{Name: "data", Path: "/data"}, {Name: "ref", Path: "/ref", ReadOnly: true}},
		HostMounts: []airlock.HostMount{{HostPath: "/srv", Path: "/srv"}, {HostPath: "/out", Path: "/out", ReadWrite: true}},
	})
	if err != nil || len(sb.Mounts) != 2 || sb.Mounts[0].Volume != "data" || sb.Mounts[1].HostPath != "/srv" || !sb.Mounts[1].ReadOnly {
		t.Fatalf("Create = %+v, %v", sb, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		`POST /v1/volumes {"name":"data","size_mb":64}`,
		`GET /v1/volumes `,
		`GET /v1/volumes/data `,
		`POST /v1/volumes/data/resize {"size_mb":128}`,
		`DELETE /v1/volumes/data `,
		`DELETE /v1/volumes/busy `,
	}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("request %d: %q, want %q", i, got[i], w)
		}
	}
	var create struct {
		Volumes []map[string]any `json:"volumes"`
		Mounts  []map[string]any `json:"mounts"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(got[len(got)-1], "POST /v1/sandboxes ")), &create); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(create)
	if w := `{"volumes":[{"name":"data","path":"/data"},{"name":"ref","path":"/ref","read_only":true}],"mounts":[{"host_path":"/srv","path":"/srv","read_only":true},{"host_path":"/out","path":"/out","read_only":false}]}`; string(b) != w {
		t.Errorf("create sent %s, want %s", b, w)
	}
}
