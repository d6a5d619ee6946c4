package boot

import "testing"

func TestParseCmdline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Cmdline
	}{
		{"", DefaultCmdline()},
		{"console=ttyS0 quiet panic=-1", DefaultCmdline()},
		{
			"console=ttyS0 airlock.root=/dev/vdb airlock.probe=1 airlock.hostname=box airlock.pids=77",
			Cmdline{Root: "/dev/vdb", Probe: true, Hostname: "box", Pids: 77},
		},
		{
			"airlock.root=vda airlock.root=/dev/../etc airlock.pids=0 airlock.pids=x airlock.probe=0 airlock.hostname=",
			DefaultCmdline(),
		},
	} {
		if got := ParseCmdline(tc.in); got != tc.want {
			t.Errorf("ParseCmdline(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
