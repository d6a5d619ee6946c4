package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

func TestVolumeRoutes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})

	r := h.do(h.alice, "POST", "/v1/volumes", strings.NewReader(`{"name":"data","size_mb":32}`))
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	var v Volume
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatal(err)
	}
	if v.Name != "data" || v.Tenant != "alice" || v.SizeMB != 32 || !strings.HasPrefix(v.ID, "vol") || v.GuestWritten || v.Attachments == nil || len(v.Attachments) != 0 {
		t.Fatalf("create answer: %s", r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/volumes", strings.NewReader(`{"name":"data","size_mb":32}`)); r.code != http.StatusConflict || r.err(t).Error.Message != errVolumeTaken.Message {
		t.Fatalf("second create: %d %s", r.code, r.body)
	}
	for _, body := range []string{`{}`, `{"name":"data2"}`, `{"name":"Bad","size_mb":32}`, `{"name":"x","size_mb":8}`, `{"name":"x","size_mb":32,"extra":1}`} {
		if r := h.do(h.alice, "POST", "/v1/volumes", strings.NewReader(body)); r.code != http.StatusBadRequest {
			t.Errorf("create %s: %d %s", body, r.code, r.body)
		}
	}

	var list struct{ Volumes []Volume }
	if err := json.Unmarshal(h.do(h.alice, "GET", "/v1/volumes", nil).body, &list); err != nil || len(list.Volumes) != 1 || list.Volumes[0].Name != "data" {
		t.Fatalf("alice's list: %+v %v", list, err)
	}
	if err := json.Unmarshal(h.do(h.bob, "GET", "/v1/volumes", nil).body, &list); err != nil || len(list.Volumes) != 0 {
		t.Fatalf("bob's list: %+v %v", list, err)
	}
	if err := json.Unmarshal(h.do(h.admin, "GET", "/v1/volumes?all=1", nil).body, &list); err != nil || len(list.Volumes) != 1 || list.Volumes[0].Tenant != "alice" {
		t.Fatalf("admin's list: %+v %v", list, err)
	}
	if err := json.Unmarshal(h.do(h.alice, "GET", "/v1/volumes?all=1&tenant=bob", nil).body, &list); err != nil || len(list.Volumes) != 1 {
		t.Fatalf("a tenant's all=1 and tenant= must be ignored: %+v %v", list, err)
	}
	if r := h.do(h.admin, "GET", "/v1/volumes/data?tenant=alice", nil); r.code != http.StatusOK {
		t.Fatalf("admin get: %d %s", r.code, r.body)
	}

	// Resize: grow only.
	r = h.do(h.alice, "POST", "/v1/volumes/data/resize", strings.NewReader(`{"size_mb":64}`))
	if err := json.Unmarshal(r.body, &v); r.code != http.StatusOK || err != nil || v.SizeMB != 64 {
		t.Fatalf("resize: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "POST", "/v1/volumes/data/resize", strings.NewReader(`{"size_mb":32}`)); r.code != http.StatusBadRequest {
		t.Fatalf("shrink: %d %s", r.code, r.body)
	}

	// Attached, it cannot be resized or removed; the attachment shows.
	if err := h.st.CreateSandbox(t.Context(), store.Sandbox{ID: "attachedaaaa", Tenant: "alice", State: store.StateRunning,
		Mounts: []store.Mount{{VolumeID: v.ID, VolumeName: "data", Path: "/data", ReadOnly: true}}}); err != nil {
		t.Fatal(err)
	}
	r = h.do(h.alice, "GET", "/v1/volumes/data", nil)
	if err := json.Unmarshal(r.body, &v); err != nil || len(v.Attachments) != 1 || v.Attachments[0] != (VolumeAttachment{SandboxID: "attachedaaaa", Path: "/data", ReadOnly: true}) {
		t.Fatalf("attachments: %s", r.body)
	}
	for _, r := range []resp{h.do(h.alice, "DELETE", "/v1/volumes/data", nil), h.do(h.alice, "POST", "/v1/volumes/data/resize", strings.NewReader(`{"size_mb":128}`))} {
		if e := r.err(t); r.code != http.StatusConflict || e.Error.Message != errVolumeInUse.Message {
			t.Errorf("while attached: %d %s", r.code, r.body)
		}
	}
	if err := h.st.DeleteSandbox(t.Context(), "attachedaaaa"); err != nil {
		t.Fatal(err)
	}
	if r := h.do(h.alice, "DELETE", "/v1/volumes/data", nil); r.code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.code, r.body)
	}
	if r := h.do(h.alice, "GET", "/v1/volumes/data", nil); r.code != http.StatusNotFound {
		t.Fatalf("get after delete: %d %s", r.code, r.body)
	}
	evs, err := h.st.ListEvents(t.Context(), store.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range evs {
		if strings.HasPrefix(e.Action, "volume.") && e.Tenant == "alice" {
			actions = append(actions, e.Action)
		}
	}
	if strings.Join(actions, ",") != "volume.create,volume.resize,volume.delete" && strings.Join(actions, ",") != "volume.delete,volume.resize,volume.create" {
		t.Fatalf("audit: %v", actions)
	}
}

// TestVolumeCrossTenantIsAbsence: another tenant's volume, a missing one
// and a malformed name answer the same bytes on every volume route.
func TestVolumeCrossTenantIsAbsence(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	if r := h.do(h.bob, "POST", "/v1/volumes", strings.NewReader(`{"name":"bobs","size_mb":16}`)); r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	n := 0
	for _, rt := range routes {
		if !strings.Contains(rt.pattern, "/v1/volumes/{name}") {
			continue
		}
		n++
		var bodies []string
		for _, name := range []string{"bobs", "missing", "BAD..name"} {
			m, p, _ := strings.Cut(rt.pattern, " ")
			p = strings.ReplaceAll(p, "{name}", name)
			r := h.do(h.alice, m, p, strings.NewReader(`{"size_mb":32}`))
			e := r.err(t)
			if r.code != http.StatusNotFound || e.Error.Message != errNoVolume.Message {
				t.Errorf("%s on %s: %d %s", rt.pattern, name, r.code, r.body)
			}
			bodies = append(bodies, strings.Replace(string(r.body), e.Error.RequestID, "", 1))
		}
		if bodies[0] != bodies[1] || bodies[1] != bodies[2] {
			t.Errorf("%s: bodies differ:\n%s", rt.pattern, strings.Join(bodies, ""))
		}
	}
	if n != 3 {
		t.Fatalf("%d volume routes with a name, want 3", n)
	}
	// Bob's volume is intact; an admin reaches it with ?tenant=.
	if r := h.do(h.admin, "GET", "/v1/volumes/bobs?tenant=bob", nil); r.code != http.StatusOK {
		t.Fatalf("admin: %d %s", r.code, r.body)
	}
}

func TestVolumeQuota(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{MaxVolumes: 1, MaxDiskMiB: 100})
	if r := h.do(h.alice, "POST", "/v1/volumes", strings.NewReader(`{"name":"a","size_mb":16}`)); r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	r := h.do(h.alice, "POST", "/v1/volumes", strings.NewReader(`{"name":"b","size_mb":16}`))
	if e := r.err(t); r.code != http.StatusTooManyRequests || !strings.Contains(e.Error.Message, "max_volumes") {
		t.Fatalf("over max_volumes: %d %s", r.code, r.body)
	}
	r = h.do(h.alice, "POST", "/v1/volumes/a/resize", strings.NewReader(`{"size_mb":200}`))
	if e := r.err(t); r.code != http.StatusTooManyRequests || !strings.Contains(e.Error.Message, "max_disk_mb") {
		t.Fatalf("over max_disk_mb: %d %s", r.code, r.body)
	}
}

func TestCreateWithMounts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, store.APIKey{})
	r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"volumes":[{"name":"data","path":"/data"},{"name":"ref","path":"/ref","read_only":true}],
		"mounts":[{"host_path":"/srv/a","path":"/a"},{"host_path":"/srv/b","path":"/b","read_only":false},{"host_path":"/srv/c","path":"/c","read_only":true}]}`))
	if r.code != http.StatusCreated {
		t.Fatalf("create: %d %s", r.code, r.body)
	}
	o := h.fake.created[len(h.fake.created)-1]
	wantV := []sandbox.VolumeMount{{Name: "data", Path: "/data"}, {Name: "ref", Path: "/ref", ReadOnly: true}}
	// A host mount is read-write only when read_only is false explicitly.
	wantH := []sandbox.HostMount{{HostPath: "/srv/a", Path: "/a"}, {HostPath: "/srv/b", Path: "/b", ReadWrite: true}, {HostPath: "/srv/c", Path: "/c"}}
	if fmt.Sprint(o.Volumes) != fmt.Sprint(wantV) || fmt.Sprint(o.HostMounts) != fmt.Sprint(wantH) {
		t.Fatalf("options: %+v %+v", o.Volumes, o.HostMounts)
	}
	if r := h.do(h.alice, "POST", "/v1/sandboxes", strings.NewReader(`{"volumes":[{"name":"data","path":"/data","extra":1}]}`)); r.code != http.StatusBadRequest {
		t.Fatalf("unknown field: %d %s", r.code, r.body)
	}
}

func TestSandboxViewMounts(t *testing.T) {
	t.Parallel()
	v := viewSandbox(store.Sandbox{Mounts: []store.Mount{
		{VolumeID: "volx", VolumeName: "data", Path: "/data"},
		{HostPath: "/srv/src", Path: "/src", ReadOnly: true},
	}})
	b, _ := json.Marshal(v.Mounts)
	if want := `[{"volume":"data","path":"/data","read_only":false},{"host_path":"/srv/src","path":"/src","read_only":true}]`; string(b) != want {
		t.Fatalf("mounts: %s, want %s", b, want)
	}
	if b, _ := json.Marshal(viewSandbox(store.Sandbox{})); !strings.Contains(string(b), `"mounts":[]`) {
		t.Fatalf("no mounts: %s", b)
	}
}

// TestMountErrorFaces: a create's mount errors answer API callers without
// the manager's text (host paths, allowed roots).
func TestMountErrorFaces(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{errdefs.ErrPermissionDenied, http.StatusForbidden, "permission_denied"},
		{errdefs.ErrConflict, http.StatusConflict, "conflict"},
		{errdefs.ErrNotFound, http.StatusNotFound, "not_found"},
		{errdefs.ErrUnsupported, http.StatusBadRequest, "invalid"},
		{errdefs.ErrFailedPrecondition, http.StatusPreconditionFailed, "failed_precondition"},
	} {
		e := publicError(mountErr(fmt.Errorf("%w: host path /srv/secret is not under /allowed", c.err)))
		if e.Status != c.status || e.Code != c.code || strings.Contains(e.Message, "/srv") || strings.Contains(e.Message, "/allowed") {
			t.Errorf("%v: %+v", c.err, e)
		}
	}
	if e := publicError(mountErr(fmt.Errorf("%w: host path /srv/x: not nosuid", sandbox.ErrHostMountSetid))); e.Status != http.StatusPreconditionFailed || !strings.Contains(e.Message, "nosuid") || strings.Contains(e.Message, "/srv") {
		t.Errorf("setid: %+v", e)
	}
	// Invalid keeps the manager's text (the caller's own values).
	if e := publicError(mountErr(fmt.Errorf("%w: mount path %q must be absolute", errdefs.ErrInvalid, "rel"))); e.Status != http.StatusBadRequest || !strings.Contains(e.Message, "rel") {
		t.Errorf("invalid: %+v", e)
	}
}
