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

func TestParseOOMKills(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n", 2},
		{"low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n", 0},
		{"oom_group_kill 5\n", 0},
		{"oom_kill x\n", 0},
		{"", 0},
	} {
		if got := parseOOMKills(c.in); got != c.want {
			t.Errorf("parseOOMKills(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
