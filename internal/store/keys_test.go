package store

import (
	"errors"
	"regexp"
	"testing"
)

func TestKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.CreateKey(ctx, APIKey{Tenant: "Bad Tenant"}); err == nil {
		t.Fatal("bad tenant accepted")
	}
	k, key, err := s.CreateKey(ctx, APIKey{Tenant: "acme", MaxSandboxes: 3, RatePerMin: 60})
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^e2b_[0-9a-f]{50}$`).MatchString(key) || key[4:14] != k.ID || !ValidKeyID(k.ID) {
		t.Fatalf("key %q (id %q) has the wrong shape", key, k.ID)
	}
	got, err := s.LookupKey(ctx, key)
	if err != nil || got.Tenant != "acme" || got.MaxSandboxes != 3 || got.RatePerMin != 60 || got.Admin {
		t.Fatalf("LookupKey = %+v, %v", got, err)
	}
	wrong := key[:len(key)-1] + map[bool]string{true: "b", false: "a"}[key[len(key)-1] == 'a']
	for _, bad := range []string{"", "al_", "e2b_", key + "x", key + "0", key[:len(key)-1], wrong, "e2b_0000000000" + key[14:], "E2B_" + key[4:], "Bearer " + key} {
		if _, err := s.LookupKey(ctx, bad); !errors.Is(err, ErrBadKey) {
			t.Errorf("LookupKey(%q) = %v, want ErrBadKey", bad, err)
		}
	}
	var hash string
	if err := s.db.QueryRowContext(ctx, `SELECT hash FROM api_keys WHERE id=?`, k.ID).Scan(&hash); err != nil || hash != hashSecret(key[14:]) {
		t.Fatalf("stored hash %q, %v", hash, err)
	}
	if err := s.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LookupKey(ctx, key); !errors.Is(err, ErrBadKey) {
		t.Fatalf("revoked key: %v", err)
	}
	if err := s.RevokeKey(ctx, "zzzzzzzz"); err == nil {
		t.Fatal("revoking a missing key succeeded")
	}
	if g, err := s.GetKey(ctx, k.ID); err != nil || !g.Revoked || g.Tenant != "acme" {
		t.Fatalf("GetKey(revoked) = %+v, %v", g, err)
	}
	if _, err := s.GetKey(ctx, "zzzzzzzz"); !errors.Is(err, ErrBadKey) {
		t.Fatalf("GetKey(missing) = %v, want ErrBadKey", err)
	}
	keys, err := s.ListKeys(ctx)
	if err != nil || len(keys) != 1 || !keys[0].Revoked {
		t.Fatalf("ListKeys = %+v, %v", keys, err)
	}
}
