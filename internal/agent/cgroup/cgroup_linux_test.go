package cgroup

import "testing"

func TestLimits(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for total, want := range map[uint64]uint64{
		256 * mib:  256*mib - 32*mib,       // the 32 MiB floor
		1024 * mib: 1024*mib - 1024*mib/10, // 10%
		16 * mib:   8 * mib,                // tiny: half
	} {
		if got := MemoryMax(total); got != want {
			t.Errorf("MemoryMax(%d MiB) = %d MiB, want %d MiB", total/mib, got/mib, want/mib)
		}
	}
	for tasks, want := range map[uint64]uint64{
		1917:  1917 - 191, // threads-max of a 256 MiB guest
		32768: 32768 - 3276,
		500:   500 - 64,
		100:   36,
		64:    32,
	} {
		if got := PidsMax(tasks); got != want {
			t.Errorf("PidsMax(%d) = %d, want %d", tasks, got, want)
		}
	}
}
