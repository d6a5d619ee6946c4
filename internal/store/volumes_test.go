package store

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func testVolume(t *testing.T, s *Store, tenant, name string) Volume {
	t.Helper()
	v := Volume{ID: "vol" + tenant + name, Tenant: tenant, Name: name, SizeMiB: 64, Created: time.Unix(100, 0)}
	if err := s.CreateVolume(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	return v
}

// mountSandbox records sandbox id of tenant with the volume mounts given.
func mountSandbox(t *testing.T, s *Store, id, tenant string, ms ...Mount) error {
	t.Helper()
	return s.CreateSandbox(t.Context(), Sandbox{ID: id, Tenant: tenant, State: StateCreating, Image: "base", Mounts: ms})
}

func volMount(v Volume, path string, ro bool) Mount {
	return Mount{VolumeID: v.ID, VolumeName: v.Name, Path: path, ReadOnly: ro}
}

func TestVolumeCreateGetList(t *testing.T) {
	t.Parallel()
	s := openTest(t)
	ctx := t.Context()
	v := testVolume(t, s, "alice", "data")
	testVolume(t, s, "bob", "data") // the same name in another tenant
	dup := v
	dup.ID = "volother"
	if err := s.CreateVolume(ctx, dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate name: %v", err)
	}
	got, err := s.GetVolume(ctx, "alice", "data")
	if err != nil || got.ID != v.ID || got.SizeMiB != 64 || !got.Created.Equal(v.Created) || got.GuestWritten {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := s.GetVolume(ctx, "carol", "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's: %v", err)
	}
	all, err := s.ListVolumes(ctx)
	if err != nil || len(all) != 2 || all[0].Tenant != "alice" || all[1].Tenant != "bob" {
		t.Fatalf("list: %+v %v", all, err)
	}
	if err := s.MarkGuestWritten(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetVolume(ctx, "alice", "data"); !got.GuestWritten {
		t.Fatal("MarkGuestWritten did not stick")
	}
}

// TestVolumeAttachRules: one writer or many readers, never both, in
// either order; a volume of another tenant is not found.
func TestVolumeAttachRules(t *testing.T) {
	t.Parallel()
	s := openTest(t)
	ctx := t.Context()
	v := testVolume(t, s, "alice", "data")

	// ro + ro: fine, and both are listed.
	if err := mountSandbox(t, s, "r1", "alice", volMount(v, "/data", true)); err != nil {
		t.Fatal(err)
	}
	if err := mountSandbox(t, s, "r2", "alice", volMount(v, "/mnt", true)); err != nil {
		t.Fatal(err)
	}
	att, err := s.Attachments(ctx, v.ID)
	if err != nil || len(att) != 2 || att[0] != (Attachment{"r1", "/data", true}) || att[1] != (Attachment{"r2", "/mnt", true}) {
		t.Fatalf("attachments: %+v %v", att, err)
	}
	// ro then rw: refused, and the refused sandbox leaves no row.
	err = mountSandbox(t, s, "w1", "alice", volMount(v, "/data", false))
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "mounted read-only by sandbox r1") {
		t.Fatalf("rw after ro: %v", err)
	}
	if _, err := s.GetSandbox(ctx, "w1"); err == nil {
		t.Fatal("a refused create left its sandbox row")
	}
	// Once the readers are gone: rw; then rw + rw and rw + ro refused.
	for _, id := range []string{"r1", "r2"} {
		if err := s.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := mountSandbox(t, s, "w1", "alice", volMount(v, "/data", false)); err != nil {
		t.Fatal(err)
	}
	if err := mountSandbox(t, s, "w2", "alice", volMount(v, "/data", false)); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "one sandbox at a time may write it") {
		t.Fatalf("rw + rw: %v", err)
	}
	if err := mountSandbox(t, s, "r3", "alice", volMount(v, "/data", true)); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "mounted read-write by sandbox w1") {
		t.Fatalf("ro after rw: %v", err)
	}
	// Another tenant's volume id is not found, even named by id.
	if err := mountSandbox(t, s, "b1", "bob", volMount(v, "/data", true)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob mounting alice's volume: %v", err)
	}
	if err := mountSandbox(t, s, "b2", "bob", Mount{VolumeID: "volnothing", VolumeName: "x", Path: "/x"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing volume: %v", err)
	}
	// A host mount has no volume row and is always fine.
	if err := mountSandbox(t, s, "h1", "bob", Mount{HostPath: "/srv", Path: "/srv", ReadOnly: true}); err != nil {
		t.Fatal(err)
	}
	sb, err := s.GetSandbox(ctx, "w1")
	if err != nil || len(sb.Mounts) != 1 || sb.Mounts[0] != volMount(v, "/data", false) {
		t.Fatalf("mounts kept on the row: %+v %v", sb.Mounts, err)
	}
}

func TestVolumeDeleteAndResize(t *testing.T) {
	t.Parallel()
	s := openTest(t)
	ctx := t.Context()
	v := testVolume(t, s, "alice", "data")
	if err := mountSandbox(t, s, "sb1", "alice", volMount(v, "/data", true)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(ctx, "alice", "data"); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "sandbox sb1 has it mounted") {
		t.Fatalf("delete while attached: %v", err)
	}
	called := false
	if _, err := s.ResizeVolume(ctx, "alice", "data", 128, func(Volume) error { called = true; return nil }); !errors.Is(err, errdefs.ErrConflict) || called {
		t.Fatalf("resize while attached: %v (resize called: %v)", err, called)
	}
	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	// Grow only; a failed resize leaves the old size.
	if _, err := s.ResizeVolume(ctx, "alice", "data", 32, func(Volume) error { return nil }); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("shrink: %v", err)
	}
	if _, err := s.ResizeVolume(ctx, "alice", "data", 128, func(Volume) error { return errors.New("disk full") }); err == nil {
		t.Fatal("a failed resize succeeded")
	}
	if got, _ := s.GetVolume(ctx, "alice", "data"); got.SizeMiB != 64 {
		t.Fatalf("size after a failed resize: %d", got.SizeMiB)
	}
	got, err := s.ResizeVolume(ctx, "alice", "data", 128, func(nv Volume) error {
		if nv.SizeMiB != 128 {
			t.Errorf("resize sees %d", nv.SizeMiB)
		}
		return nil
	})
	if err != nil || got.SizeMiB != 128 {
		t.Fatalf("grow: %+v %v", got, err)
	}
	if _, err := s.ResizeVolume(ctx, "bob", "data", 256, func(Volume) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's resize: %v", err)
	}
	if _, err := s.DeleteVolume(ctx, "bob", "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's delete: %v", err)
	}
	del, err := s.DeleteVolume(ctx, "alice", "data")
	if err != nil || del.ID != v.ID {
		t.Fatalf("delete after the sandbox row is gone: %+v %v", del, err)
	}
	if _, err := s.GetVolume(ctx, "alice", "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
}

// TestMigrateV9ToV10 keeps a v9 catalog's rows and gives them no mounts
// and no volume quota.
func TestMigrateV9ToV10(t *testing.T) {
	sqliteOnly(t)
	ctx := t.Context()
	root := t.TempDir()
	path := filepath.Join(root, "catalog.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	for v := range 9 {
		if err := migrate(ctx, &database{sql: db}, root, v); err != nil {
			t.Fatal(err)
		}
	}
	var ver int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&ver); err != nil || ver != 9 {
		t.Fatalf("user_version %d %v", ver, err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO sandboxes(id,state,image,image_digest,cpus,memory_mib,disk_mib,timeout_s,created_at,expires_at,tenant) VALUES('sb1','running','base','',2,512,2048,60,0,0,'alice')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sb, err := s.GetSandbox(ctx, "sb1")
	if err != nil || sb.CPUs != 2 || sb.Tenant != "alice" || len(sb.Mounts) != 0 {
		t.Fatalf("migrated row: %+v %v", sb, err)
	}
	// The new tables work on the migrated catalog.
	v := testVolume(t, s, "alice", "data")
	if err := mountSandbox(t, s, "sb2", "alice", volMount(v, "/data", false)); err != nil {
		t.Fatal(err)
	}
	_, key, err := s.CreateKey(ctx, APIKey{Tenant: "t", MaxVolumes: 3})
	if err != nil {
		t.Fatalf("create key on the migrated catalog: %v", err)
	}
	if k, err := s.LookupKey(ctx, key); err != nil || k.MaxVolumes != 3 {
		t.Fatalf("max_volumes: %+v %v", k, err)
	}
}
