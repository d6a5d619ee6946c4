package agent

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agent/cgroup"
	"github.com/airlock-sandbox/airlock/internal/agent/reaper"
	"github.com/airlock-sandbox/airlock/internal/agentapi"
)

// TestMain fails the package if the services leave goroutines behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := leakedGoroutines(2 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func leakedGoroutines(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "airlock/internal/agent") && !strings.Contains(g, "leakedGoroutines") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testEnv is a Server in host mode behind a real agentapi session.
type testEnv struct {
	c   *agentapi.Client
	sys *fakeSystem
	dir string // a temp dir holding passwd and group
	// closeServer ends the session and closes the server (idempotent;
	// also run at cleanup).
	closeServer func()
}

// newTestEnv serves a host-mode Server on one end of a net.Pipe and dials it
// with agentapi.Dial on the other.
func newTestEnv(t *testing.T, tweak ...func(*Options)) *testEnv {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "passwd"), "root:x:0:0:root:/root:/bin/sh\n"+
		"alice:x:1234:1234:Alice:"+filepath.Join(dir, "alice")+":/bin/sh\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
	writeFile(t, filepath.Join(dir, "group"), "root:x:0:\nstaff:x:50:alice,bob\nalice:x:1234:\n")
	rp := reaper.New(reaper.Options{})
	sys := &fakeSystem{powerOff: make(chan struct{}, 1)}
	opts := Options{
		Version:    "test",
		Reaper:     rp,
		PasswdFile: filepath.Join(dir, "passwd"),
		GroupFile:  filepath.Join(dir, "group"),
		system:     sys,
	}
	for _, f := range tweak {
		f(&opts)
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	host, guest := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = agentapi.Serve(context.Background(), guest, srv.Handler())
	}()
	c, err := agentapi.Dial(t.Context(), host, agentapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := &testEnv{c: c, sys: sys, dir: dir}
	env.closeServer = sync.OnceFunc(func() {
		_ = c.Close()
		_ = guest.Close()
		<-served
		srv.Close()
		rp.Close()
	})
	t.Cleanup(env.closeServer)
	return env
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeSystem records what Sync and Shutdown asked of the machine.
type fakeSystem struct {
	mu       sync.Mutex
	clock    time.Time
	entropy  []byte
	hostname string
	grown    bool
	network  []netConfig
	volumes  []volumeMount
	powerOff chan struct{}
}

func (f *fakeSystem) MountVolumes(v []volumeMount) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.volumes = append(f.volumes, v...)
	return nil
}

func (f *fakeSystem) ConfigureNetwork(c netConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.network = append(f.network, c)
	return nil
}

func (f *fakeSystem) SetClock(t time.Time) error    { f.clock = t; return nil }
func (f *fakeSystem) AddEntropy(b []byte) error     { f.entropy = bytes.Clone(b); return nil }
func (f *fakeSystem) SetHostname(name string) error { f.hostname = name; return nil }
func (f *fakeSystem) GrowRoot(want uint64) error    { f.grown = true; return nil }
func (f *fakeSystem) RootSize() (uint64, error)     { return 1 << 30, nil }
func (f *fakeSystem) PowerOff()                     { f.powerOff <- struct{}{} }

func TestContainerTaskLimit(t *testing.T) {
	for _, mib := range []uint64{128, 256, 512, 4096, 65536} {
		got := cgroup.PidsMax(containerTaskLimit(mib << 20))
		want := mib / ContainerMiBPerTask
		if got < want*95/100 || got > want {
			t.Errorf("%d MiB: subtree pids.max %d, want about %d", mib, got, want)
		}
	}
}
