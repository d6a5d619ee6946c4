package store

import (
	"bytes"
	"database/sql"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestVaultSecretsAreScopedToTheirTenant(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openTest(t)
	t0 := time.Unix(1700000000, 0)
	put := func(tenant, name string, sealed []byte, at time.Time, hosts ...string) bool {
		t.Helper()
		created, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: tenant, Name: name, Hosts: hosts, Sealed: sealed, Updated: at}, 0)
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	if !put("alice", "GH", []byte("sealed-a"), t0, "api.github.com") {
		t.Fatal("a new name was not reported created")
	}
	put("bob", "GH", []byte("sealed-b"), t0)
	// Bob's secret of the same name is his own; alice's is not visible to him.
	a, err := s.GetVaultSecret(ctx, "alice", "GH")
	if err != nil || !bytes.Equal(a.Sealed, []byte("sealed-a")) || !slices.Equal(a.Hosts, []string{"api.github.com"}) {
		t.Fatalf("alice's GH: %+v %v", a, err)
	}
	if _, err := s.GetVaultSecret(ctx, "carol", "GH"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant read it: %v", err)
	}
	// Replacing keeps Created and moves Updated.
	if put("alice", "GH", []byte("sealed-a2"), t0.Add(time.Hour)) {
		t.Fatal("a replaced name was reported created")
	}
	a, err = s.GetVaultSecret(ctx, "alice", "GH")
	if err != nil || !bytes.Equal(a.Sealed, []byte("sealed-a2")) || !a.Created.Equal(t0) || !a.Updated.Equal(t0.Add(time.Hour)) || len(a.Hosts) != 0 {
		t.Fatalf("replaced: %+v %v", a, err)
	}
	list, err := s.ListVaultSecrets(ctx, "alice")
	if err != nil || len(list) != 1 || list[0].Name != "GH" || list[0].Sealed != nil {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s.DeleteVaultSecret(ctx, "carol", "GH"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("carol deleted alice's secret: %v", err)
	}
	if err := s.DeleteVaultSecret(ctx, "alice", "GH"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVaultSecret(ctx, "alice", "GH"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := s.GetVaultSecret(ctx, "bob", "GH"); err != nil {
		t.Fatalf("deleting alice's removed bob's: %v", err)
	}
}

func TestVaultSecretCountLimit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := openTest(t)
	for _, name := range []string{"A", "B"} {
		if _, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: "t", Name: name, Sealed: []byte{1}}, 2); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: "t", Name: "C", Sealed: []byte{1}}, 2); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a third secret over a limit of 2: %v", err)
	}
	// Replacing one at the limit, and another tenant, are fine.
	if _, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: "t", Name: "A", Sealed: []byte{2}}, 2); err != nil {
		t.Fatalf("replace at the limit: %v", err)
	}
	if _, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: "u", Name: "C", Sealed: []byte{1}}, 2); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	if _, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: "t", Name: "D"}, 0); err == nil {
		t.Fatal("a secret with nothing sealed was stored")
	}
}

// TestMigrateV11ToV12 gives a v11 catalog an empty vault.
func TestMigrateV11ToV12(t *testing.T) {
	sqliteOnly(t)
	t.Parallel()
	ctx := t.Context()
	root := t.TempDir()
	path := filepath.Join(root, "catalog.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	for v := range 11 {
		if err := migrate(ctx, &database{sql: db}, root, v); err != nil {
			t.Fatal(err)
		}
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
	if sb, err := s.GetSandbox(ctx, "sb1"); err != nil || sb.Tenant != "alice" {
		t.Fatalf("migrated row: %+v %v", sb, err)
	}
	if list, err := s.ListVaultSecrets(ctx, "alice"); err != nil || len(list) != 0 {
		t.Fatalf("vault after migration: %v %v", list, err)
	}
	if _, err := s.PutVaultSecret(ctx, VaultSecret{Tenant: "alice", Name: "GH", Sealed: []byte{1}}, 0); err != nil {
		t.Fatal(err)
	}
}
