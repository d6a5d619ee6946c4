package store

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestKeyNetworkLimits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, _, err := s.CreateKey(ctx, APIKey{Tenant: "acme", NetConnRate: 20, NetDestsPerMin: -7})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetKey(ctx, k.ID)
	if err != nil || got.NetConnRate != 20 || got.NetDestsPerMin != -1 || got.NetUDPRate != 0 {
		t.Fatalf("GetKey = %+v, %v (want 20, -1 for no limit, 0 for the default)", got, err)
	}
	got.NetUDPRate, got.MaxSandboxes = 300, 4
	if err := s.UpdateKeyLimits(ctx, got); err != nil {
		t.Fatal(err)
	}
	if g, err := s.GetKey(ctx, k.ID); err != nil || g.NetUDPRate != 300 || g.MaxSandboxes != 4 || g.NetConnRate != 20 || g.Tenant != "acme" {
		t.Fatalf("after update: %+v, %v", g, err)
	}
	if err := s.UpdateKeyLimits(ctx, APIKey{ID: "0000000000"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("update of a missing key: %v", err)
	}
	for _, bad := range []APIKey{{ID: k.ID, NetConnRate: maxNetLimit + 1}, {ID: k.ID, MaxSandboxes: -1}} {
		if err := s.UpdateKeyLimits(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("update %+v: %v, want invalid", bad, err)
		}
	}
}

func TestTenantEgress(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, a := range []struct {
		tenant string
		n      uint64
	}{{"acme", 100}, {"acme", 50}, {"", 7}, {"beta", 0}} {
		if err := s.AddTenantEgress(ctx, a.tenant, a.n); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.TenantEgress(ctx)
	if err != nil || len(got) != 2 || got["acme"] != 150 || got[""] != 7 {
		t.Fatalf("TenantEgress = %v, %v", got, err)
	}
}
