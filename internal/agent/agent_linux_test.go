package agent

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

func TestInfo(t *testing.T) {
	t.Parallel()
	info := newTestEnv(t).c.Info // Dial calls Info
	if info.GetProtocolVersion() != agentapi.ProtocolVersion || info.GetAgentVersion() != "test" {
		t.Errorf("versions = %d %q", info.GetProtocolVersion(), info.GetAgentVersion())
	}
	if info.GetKernelRelease() == "" || info.GetMemTotalBytes() == 0 || info.GetCpus() == 0 || info.GetUptimeSeconds() <= 0 {
		t.Errorf("info = %v", info)
	}
}

func TestSync(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	ctx := t.Context()
	seed := bytes.Repeat([]byte{7}, 64)
	host := time.Now().Add(time.Hour)
	resp, err := env.c.Agent.Sync(ctx, connect.NewRequest(&agentv1.SyncRequest{
		UnixNano: host.UnixNano(), Entropy: seed, Hostname: "box-1", GrowRoot: true,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(time.Unix(0, resp.Msg.GetGuestUnixNanoBefore())); d < 0 || d > time.Minute {
		t.Errorf("guest_unix_nano_before is %v off", d)
	}
	if resp.Msg.GetRootSizeBytes() != 1<<30 {
		t.Errorf("root size = %d", resp.Msg.GetRootSizeBytes())
	}
	s := env.sys
	s.mu.Lock()
	if !s.clock.Equal(time.Unix(0, host.UnixNano())) || !bytes.Equal(s.entropy, seed) || s.hostname != "box-1" || !s.grown {
		t.Errorf("system got clock=%v entropy=%d hostname=%q grown=%v", s.clock, len(s.entropy), s.hostname, s.grown)
	}
	s.mu.Unlock()
	if _, err := env.c.Agent.Sync(ctx, connect.NewRequest(&agentv1.SyncRequest{UnixNano: host.UnixNano(), Entropy: seed,
		Volumes: []*agentv1.VolumeMount{{Serial: "airlock-vol0", Path: "/data"}, {Staged: "/.airlock-mounts/1", Path: "/ro", ReadOnly: true}}})); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	if want := []volumeMount{{"airlock-vol0", "/data", false, "", ""}, {"", "/ro", true, "/.airlock-mounts/1", ""}}; !slices.Equal(s.volumes, want) {
		t.Errorf("volumes = %+v, want %+v", s.volumes, want)
	}
	s.volumes = nil
	s.mu.Unlock()

	for name, req := range map[string]*agentv1.SyncRequest{
		"short entropy": {UnixNano: host.UnixNano(), Entropy: make([]byte, 31)},
		"long entropy":  {UnixNano: host.UnixNano(), Entropy: make([]byte, 513)},
		"old clock":     {UnixNano: time.Date(2019, 12, 31, 0, 0, 0, 0, time.UTC).UnixNano(), Entropy: seed},
		"bad hostname":  {UnixNano: host.UnixNano(), Entropy: seed, Hostname: "a.b"},
		"bad network": {UnixNano: host.UnixNano(), Entropy: seed, Network: &agentv1.NetworkConfig{
			Enabled: true, Address: "10.0.2.15", Gateway: "10.0.2.2",
		}},
		"volume serial":      {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Serial: "vda", Path: "/data"}}},
		"volume relative":    {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Serial: "airlock-vol0", Path: "data"}}},
		"volume dotdot":      {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Serial: "airlock-vol0", Path: "/data/../etc"}}},
		"volume root":        {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Serial: "airlock-vol0", Path: "/"}}},
		"volume proc":        {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Serial: "airlock-vol0", Path: "/proc/x"}}},
		"volume staged path": {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Staged: "/etc", Path: "/data"}}},
		"volume both":        {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{{Serial: "airlock-vol0", Staged: "/.airlock-mounts/0", Path: "/data"}}},
		"volume twice": {UnixNano: host.UnixNano(), Entropy: seed, Volumes: []*agentv1.VolumeMount{
			{Serial: "airlock-vol0", Path: "/a"}, {Serial: "airlock-vol0", Path: "/b"}}},
	} {
		_, err := env.c.Agent.Sync(ctx, connect.NewRequest(req))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
	s.mu.Lock()
	if len(s.volumes) != 0 {
		t.Errorf("refused syncs mounted %+v", s.volumes)
	}
	s.mu.Unlock()
}

func TestSyncNetwork(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	seed := bytes.Repeat([]byte{7}, 64)
	sync := func(n *agentv1.NetworkConfig) {
		t.Helper()
		if _, err := env.c.Agent.Sync(t.Context(), connect.NewRequest(&agentv1.SyncRequest{
			UnixNano: time.Now().UnixNano(), Entropy: seed, Network: n,
		})); err != nil {
			t.Fatal(err)
		}
	}
	sync(nil) // an old host: networking is left alone
	sync(&agentv1.NetworkConfig{Enabled: false, Address: "ignored"})
	on := &agentv1.NetworkConfig{Enabled: true, Address: "10.0.2.15/24", Gateway: "10.0.2.2", Nameservers: []string{"10.0.2.3"}, Mtu: 1400}
	sync(on)
	sync(on) // the config last applied: skipped (a clone of a template)
	sync(&agentv1.NetworkConfig{Enabled: true, Address: "10.0.2.15/24", Gateway: "10.0.2.2", Nameservers: []string{"10.0.2.4"}})
	s := env.sys
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.network) != 3 || s.network[0].Enabled || !s.network[1].Enabled ||
		s.network[1].Address != netip.MustParsePrefix("10.0.2.15/24") || s.network[1].MTU != 1400 ||
		s.network[2].Nameservers[0] != netip.MustParseAddr("10.0.2.4") {
		t.Errorf("system got network configs %+v", s.network)
	}
}

func TestShutdownRepliesThenPowersOff(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	if _, err := env.c.Agent.Shutdown(t.Context(), connect.NewRequest(&agentv1.ShutdownRequest{Poweroff: true})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-env.sys.powerOff:
	case <-time.After(5 * time.Second):
		t.Fatal("no power off after Shutdown")
	}
	// A second Shutdown is answered and does not power off twice.
	if _, err := env.c.Agent.Shutdown(t.Context(), connect.NewRequest(&agentv1.ShutdownRequest{Poweroff: true})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-env.sys.powerOff:
		t.Fatal("powered off twice")
	case <-time.After(200 * time.Millisecond):
	}
}

func TestCountCPUList(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]uint32{"0": 1, "0-3": 4, "0-1,4,6-7": 5} {
		if got, err := countCPUList(in); err != nil || got != want {
			t.Errorf("countCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a", "3-1", "1-"} {
		if _, err := countCPUList(in); err == nil {
			t.Errorf("countCPUList(%q) succeeded", in)
		}
	}
}

func TestCPUTimes(t *testing.T) {
	busy, total := cpuTimes("cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
	if busy != (100+5+50+3+2)*1e7 || total != (100+5+50+800+40+3+2)*1e7 {
		t.Fatalf("busy %d total %d", busy, total)
	}
	if b, tt := cpuTimes("intr 1 2\n"); b != 0 || tt != 0 {
		t.Fatalf("no cpu line: %d %d", b, tt)
	}
}

func TestUsage(t *testing.T) {
	env := newTestEnv(t)
	resp, err := env.c.Agent.Usage(t.Context(), connect.NewRequest(&agentv1.UsageRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	u := resp.Msg
	if u.GetCpus() < 1 || u.GetCpuTotalNs() == 0 || u.GetCpuBusyNs() == 0 || u.GetCpuBusyNs() > u.GetCpuTotalNs() {
		t.Errorf("cpu: %v", u)
	}
	if u.GetMemTotalBytes() == 0 || u.GetMemAvailableBytes() == 0 || u.GetMemAvailableBytes() > u.GetMemTotalBytes() {
		t.Errorf("memory: %v", u)
	}
	if u.GetDiskTotalBytes() == 0 || u.GetDiskUsedBytes() > u.GetDiskTotalBytes() {
		t.Errorf("disk: %v", u)
	}
}
