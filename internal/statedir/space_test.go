package statedir

import (
	"errors"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestDefaultDiskReserve(t *testing.T) {
	for total, want := range map[int64]int64{
		100 << 30: 5 << 30, // 5%
		10 << 30:  2 << 30, // at least 2 GiB
		3 << 30:   3 << 29, // at most half
	} {
		if got := DefaultDiskReserve(total); got != want {
			t.Errorf("DefaultDiskReserve(%d GiB) = %d MiB, want %d MiB", total>>30, got>>20, want>>20)
		}
	}
}

// TestDiskFiguresCheck: the reserve defaults and can be turned off, and a
// refusal is a *SpaceError that is an errdefs.ErrInsufficientStorage
// naming the figures.
func TestDiskFiguresCheck(t *testing.T) {
	d := NewDiskFigures(100<<30, 10<<30, 0) // reserve: 5 GiB
	if d.Reserve != 5<<30 {
		t.Fatalf("default reserve %d MiB", d.Reserve>>20)
	}
	if err := d.Check("4 GiB", 4<<30); err != nil {
		t.Fatalf("4 GiB with 10 GiB free and 5 GiB reserved: %v", err)
	}
	err := d.Check("this sandbox's disk", 6<<30)
	var se *SpaceError
	if !errors.As(err, &se) || !errors.Is(err, errdefs.ErrInsufficientStorage) || se.Need != 6<<30 || se.Free != 10<<30 || se.Reserve != 5<<30 || se.What != "this sandbox's disk" {
		t.Fatalf("6 GiB with 10 GiB free and 5 GiB reserved: %v", err)
	}
	if d := NewDiskFigures(100<<30, 1<<30, -1); d.Reserve != 0 || d.Check("1 GiB", 1<<30) != nil {
		t.Fatalf("no reserve: %+v", d)
	}
}
