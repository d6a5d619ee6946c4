package gvisor

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// boot creates and starts spec and completes the agent handshake; cleanups
// kill the instance and close the client.
func boot(t *testing.T, f *fixture, spec runtime.Spec) (*instance, *agentapi.Client) {
	t.Helper()
	ri, err := f.rt.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	in := ri.(*instance)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := in.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		_ = in.Kill()
		if _, err := in.Wait(context.Background()); err != nil {
			t.Error(err)
		}
	})
	conn, err := in.AgentConn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := agentapi.Dial(ctx, conn, agentapi.Options{})
	if err != nil {
		conn.Close()
		t.Fatalf("agent dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Sync(ctx, "", 0); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return in, c
}

type execResult struct {
	code, signal int32
	stdout       string
	stderr       string
}

func run(t *testing.T, c *agentapi.Client, stdin string, argv ...string) execResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st := c.Exec.Exec(ctx)
	if err := st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{Argv: argv, Stdin: stdin != "", TimeoutMs: 10_000}}}); err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	if stdin != "" {
		_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Stdin{Stdin: []byte(stdin)}})
		_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_CloseStdin{CloseStdin: true}})
	}
	var r execResult
	for {
		resp, err := st.Receive()
		if errors.Is(err, io.EOF) {
			return r
		}
		if err != nil {
			t.Fatalf("exec %v: %v", argv, err)
		}
		switch e := resp.GetEvent().(type) {
		case *agentv1.ExecResponse_Stdout:
			r.stdout += string(e.Stdout)
		case *agentv1.ExecResponse_Stderr:
			r.stderr += string(e.Stderr)
		case *agentv1.ExecResponse_Exited:
			r.code, r.signal = e.Exited.ExitCode, e.Exited.Signal
		}
	}
}

func writeFile(t *testing.T, c *agentapi.Client, path, data string) {
	t.Helper()
	st := c.Files.Write(t.Context())
	_ = st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{Path: path, Mode: 0o644}}})
	_ = st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: []byte(data)}})
	if _, err := st.CloseAndReceive(); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func readFile(t *testing.T, c *agentapi.Client, path string) (string, error) {
	t.Helper()
	st, err := c.Files.Read(t.Context(), connect.NewRequest(&agentv1.ReadRequest{Path: path}))
	if err != nil {
		return "", err
	}
	defer st.Close()
	var out []byte
	for st.Receive() {
		out = append(out, st.Msg().GetData()...)
	}
	return string(out), st.Err()
}

// TestExecAndFiles drives the agent's exec and file services through the
// runtime's channel, and measures the exec round trip.
func TestExecAndFiles(t *testing.T) {
	f := newFixture(t)
	_, c := boot(t, f, f.spec(t))
	for _, tc := range []struct {
		stdin string
		argv  []string
		want  execResult
	}{
		{"", []string{"echo", "hello", "world"}, execResult{stdout: "hello world\n"}},
		{"", []string{"sh", "-c", "exit 3"}, execResult{code: 3}},
		{"abc", []string{"cat"}, execResult{stdout: "abc"}},
		{"", []string{"sh", "-c", "echo err >&2"}, execResult{stderr: "err\n"}},
	} {
		if got := run(t, c, tc.stdin, tc.argv...); got != tc.want {
			t.Errorf("exec %q = %+v, want %+v", tc.argv, got, tc.want)
		}
	}
	writeFile(t, c, "/root/hello.txt", "written by the host\n")
	if got, err := readFile(t, c, "/root/hello.txt"); err != nil || got != "written by the host\n" {
		t.Errorf("read back = %q, %v", got, err)
	}
	if got := run(t, c, "", "cat", "/root/hello.txt"); got.stdout != "written by the host\n" {
		t.Errorf("cat = %+v", got)
	}

	var rtts []time.Duration
	for range 20 {
		t0 := time.Now()
		run(t, c, "", "true")
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	t.Logf("exec round trip (true): median %v, min %v, max %v", rtts[len(rtts)/2], rtts[0], rtts[len(rtts)-1])
}

// TestSharedRootIsolation runs two sandboxes on one image tree: each one's
// writes (new files, changed and deleted image files) are invisible to the
// other, and the tree is byte-for-byte unchanged afterwards.
func TestSharedRootIsolation(t *testing.T) {
	f := newFixture(t)
	// As image.Store.Dir leaves it: a read-only bind mount of itself.
	if err := unix.Mount(f.rootfs, f.rootfs, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(f.rootfs, unix.MNT_DETACH) })
	if err := unix.Mount("", f.rootfs, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	before := testutil.HashTree(t, f.rootfs)
	ina, a := boot(t, f, f.spec(t))
	inb, b := boot(t, f, f.spec(t))
	writeFile(t, a, "/etc/only-a", "a\n")
	writeFile(t, b, "/etc/only-b", "b\n")
	if r := run(t, a, "", "sh", "-c", "echo changed >> /etc/passwd && rm /bin/true && mkdir /newdir && echo x > /bin/new"); r.code != 0 {
		t.Fatalf("writes in a: %+v", r)
	}
	if _, err := readFile(t, b, "/etc/only-a"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("b reads a's file: %v", err)
	}
	if _, err := readFile(t, a, "/etc/only-b"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a reads b's file: %v", err)
	}
	if got, _ := readFile(t, b, "/etc/passwd"); strings.Contains(got, "changed") {
		t.Error("b sees a's change to /etc/passwd")
	}
	if r := run(t, b, "", "ls", "/bin/true"); r.code != 0 {
		t.Errorf("b lost /bin/true that a deleted: %+v", r)
	}
	if mid := testutil.HashTree(t, f.rootfs); mid != before {
		t.Error("the shared image tree changed while sandboxes ran")
	}
	for _, in := range []*instance{ina, inb} {
		if err := in.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if after := testutil.HashTree(t, f.rootfs); after != before {
		t.Error("the shared image tree changed")
	}
	checkNoLeftovers(t, f)
}

// TestCrash: a sandbox that dies on its own ends with a Reason and not
// Requested, and its resources are released.
func TestCrash(t *testing.T) {
	f := newFixture(t)
	in, c := boot(t, f, f.spec(t))
	in.mu.Lock()
	p := in.proc
	in.mu.Unlock()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := in.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Requested || st.Reason == "" || st.Signal != "killed" {
		t.Errorf("status after a crash = %+v", st)
	}
	t.Logf("crash status: %v", st)
	if _, err := c.Agent.Info(ctx, connect.NewRequest(&agentv1.InfoRequest{})); err == nil {
		t.Error("agent answered after the crash")
	}
	if n := f.inUse(t); n != 0 {
		t.Errorf("%d resources in use after the crash", n)
	}
	checkNoLeftovers(t, f)
}

// TestLimits checks what the sandbox sees of its memory limit and that the
// writable layer's cap holds.
func TestLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.DiskBytes = 32 << 20 })
	spec := f.spec(t)
	spec.MemoryMiB = 128
	_, c := boot(t, f, spec)
	r := run(t, c, "", "sh", "-c", "head -1 /proc/meminfo")
	if !strings.Contains(r.stdout, "131072 kB") {
		t.Errorf("MemTotal with a 128 MiB limit: %q", r.stdout)
	}
	r = run(t, c, "", "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=64 2>&1; echo rc=$?")
	if !strings.Contains(r.stdout, "rc=1") {
		t.Errorf("writing 64 MiB with a 32 MiB disk cap: %q", r.stdout)
	}
	// runsc gives a sandbox at least 2 vCPUs; the host CPU quota still
	// holds it to spec.CPUs of CPU time.
	t.Logf("nproc with 1 CPU: %q", run(t, c, "", "nproc").stdout)
	if f.rt.cfg.IgnoreCgroups {
		return
	}
	// The host cgroup holds the limit.
	matches, _ := filepath.Glob("/sys/fs/cgroup/memory/airlock-gvisor/airlock-gv-*/memory.limit_in_bytes")
	found := false
	for _, m := range matches {
		if b, err := os.ReadFile(m); err == nil && bytes.Equal(bytes.TrimSpace(b), []byte("134217728")) {
			found = true
		}
	}
	if !found {
		t.Errorf("no host memory cgroup with a 128 MiB limit among %v", matches)
	}
	// And the CPU quota: spec.CPUs periods of CPU time per period.
	quotas, _ := filepath.Glob("/sys/fs/cgroup/cpu/airlock-gvisor/airlock-gv-*/cpu.cfs_quota_us")
	if v2, _ := filepath.Glob("/sys/fs/cgroup/airlock-gvisor/airlock-gv-*/cpu.max"); len(v2) > 0 {
		quotas = v2
	}
	found = false
	for _, q := range quotas {
		b, _ := os.ReadFile(q)
		if f := strings.Fields(string(b)); len(f) > 0 && f[0] == "100000" {
			found = true
		}
	}
	if !found {
		t.Errorf("no host cpu cgroup with a quota of 1 CPU among %v", quotas)
	}
}

// TestNetwork checks the NIC's link: the sandbox's ARP request for its
// gateway arrives on NetConn in -netdev stream framing.
func TestNetwork(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t)
	spec.Network = true
	in, c := boot(t, f, spec)
	nc, err := in.NetConn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := in.NetConn(t.Context()); err == nil {
		t.Error("second NetConn succeeded")
	}
	if r := run(t, c, "", "cat", "/proc/net/dev"); !strings.Contains(r.stdout, "eth0") {
		t.Errorf("no eth0 in the sandbox: %+v", r)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	go func() { // ignores errors: only its frames matter
		defer close(done)
		st := c.Exec.Exec(ctx)
		_ = st.Send(&agentv1.ExecRequest{Msg: &agentv1.ExecRequest_Start{Start: &agentv1.ExecStart{Argv: []string{"sh", "-c", "echo x | nc -w 1 10.0.2.2 80"}, TimeoutMs: 5000}}})
		for {
			if _, err := st.Receive(); err != nil {
				return
			}
		}
	}()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			t.Fatalf("no frame from the sandbox: %v", err)
		}
		frame := make([]byte, binary.BigEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(nc, frame); err != nil {
			t.Fatal(err)
		}
		// ARP (0x0806) asking for 10.0.2.2.
		if len(frame) >= 42 && frame[12] == 0x08 && frame[13] == 0x06 && bytes.Equal(frame[38:42], []byte{10, 0, 2, 2}) {
			return
		}
	}
}

// TestColdStart measures Create until the agent answers Info.
func TestColdStart(t *testing.T) {
	f := newFixture(t)
	var ds []time.Duration
	for range 5 {
		t0 := time.Now()
		in, c := boot(t, f, f.spec(t))
		ds = append(ds, time.Since(t0))
		c.Close()
		if err := in.Stop(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(ds)
	t.Logf("cold start to agent answer (Create, Start, Dial+Info, Sync): median %v of %v", ds[2], ds)
}

// TestSeccompPrecompiled: the runsc scripts/deps.sh installs carries its
// seccomp filters precompiled (scripts/runsc-seccomp/gen.go), so neither
// the sentry nor the gofer builds one at start: their debug logs say they
// loaded a precompiled program, and neither says it found none.
func TestSeccompPrecompiled(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Debug = true })
	spec := f.spec(t)
	in, c := boot(t, f, spec)
	if r := run(t, c, "", "/bin/true"); r.code != 0 {
		t.Fatalf("true: %+v", r)
	}
	c.Close()
	if err := in.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, part := range []string{"boot", "gofer"} {
		logs, _ := filepath.Glob(filepath.Join(in.paths.logDir, "*."+part+".txt"))
		if len(logs) == 0 {
			t.Fatalf("no runsc %s log in %s", part, in.paths.logDir)
		}
		b, err := os.ReadFile(logs[0])
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("No precompiled program found")) || !bytes.Contains(b, []byte("Loaded precompiled seccomp instructions")) {
			line := "(it logged no seccomp program)"
			if i := bytes.Index(b, []byte("No precompiled program found")); i >= 0 {
				line, _, _ = strings.Cut(string(b[i:]), "\n")
			}
			t.Fatalf("the %s of %s built its seccomp filter at start (reinstall runsc with scripts/deps.sh): %s", part, f.rt.cfg.RunscPath, line)
		}
	}
}

// TestNetworkSync: the shim's Sync with a network config (what it sends
// every sandbox) succeeds inside gVisor and leaves the NIC configured.
func TestNetworkSync(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t)
	spec.Network = true
	_, c := boot(t, f, spec)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := c.SyncWith(ctx, agentapi.SyncOptions{Hostname: "sbx", Network: &agentv1.NetworkConfig{
		Enabled:     true,
		Address:     netip.PrefixFrom(netconf.GuestIP, netconf.PrefixLen).String(),
		Gateway:     netconf.GatewayIP.String(),
		Nameservers: []string{netconf.GatewayIP.String()},
	}}); err != nil {
		t.Fatalf("sync with network: %v", err)
	}
	r := run(t, c, "", "sh", "-c", "cat /etc/resolv.conf; hostname; cat /proc/net/route")
	t.Logf("%+v", r)
	if !strings.Contains(r.stdout, "10.0.2.") {
		t.Errorf("guest network after sync: %+v", r)
	}
}
