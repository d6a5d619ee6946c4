package qemu

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestUIDLeases(t *testing.T) {
	dir := t.TempDir()
	const base, count = 5000, 3
	var leases []*uidLease
	seen := map[uint32]bool{}
	for range count {
		l, err := acquireUID(dir, base, count)
		if err != nil {
			t.Fatal(err)
		}
		if seen[l.UID] || l.UID < base || l.UID >= base+count {
			t.Fatalf("uid %d reused or out of range", l.UID)
		}
		seen[l.UID] = true
		leases = append(leases, l)
	}
	if _, err := acquireUID(dir, base, count); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("4th lease: %v, want resource exhausted", err)
	}
	freed := leases[1].UID
	if err := leases[1].Release(); err != nil {
		t.Fatal(err)
	}
	if err := leases[1].Release(); err != nil {
		t.Fatal("second release:", err)
	}
	l, err := acquireUID(dir, base, count)
	if err != nil {
		t.Fatal(err)
	}
	if l.UID != freed {
		t.Fatalf("got uid %d, want the freed %d", l.UID, freed)
	}
	for _, l := range append(leases, l) {
		_ = l.Release()
	}
}
