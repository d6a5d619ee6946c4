package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Harness adapts one runtime to the suite.
type Harness struct {
	// Runtime is the runtime under test.
	Runtime runtime.Runtime
	// Spec returns a new valid Spec for a cold boot, with its own ID,
	// RunDir and root disk.
	Spec func(t *testing.T) runtime.Spec
	// CloneSpec returns a Spec that restores the snapshot in dir, taken
	// from an instance of template, with its own ID, RunDir and a root
	// disk backed by template's (which the suite no longer writes). Only
	// used if the runtime reports Capabilities.Snapshots.
	CloneSpec func(t *testing.T, template runtime.Spec, dir string) runtime.Spec
	// BrokenSpec returns a Spec that Create accepts but whose Start fails
	// after the runtime has acquired resources for it.
	BrokenSpec func(t *testing.T) runtime.Spec
	// InUse returns how many resources (VMM processes, uids, live
	// instances) the runtime holds now; the suite checks that a failed
	// Start brings it back to where it was.
	InUse func(t *testing.T) int
	// BootTimeout bounds a start up to the agent's answer (default 10 s;
	// give TCG more).
	BootTimeout time.Duration
	// SnapshotDir returns a new empty directory for a snapshot
	// (default t.TempDir()).
	SnapshotDir func(t *testing.T) string
}

func (h *Harness) bootTimeout() time.Duration {
	if h.BootTimeout > 0 {
		return h.BootTimeout
	}
	return 10 * time.Second
}

// Run runs the suite as subtests of t, one instance at a time.
func Run(t *testing.T, h Harness) {
	t.Run("StartAgentStop", func(t *testing.T) { testStartAgentStop(t, &h) })
	t.Run("Kill", func(t *testing.T) { testKill(t, &h) })
	t.Run("ConcurrentWait", func(t *testing.T) { testConcurrentWait(t, &h) })
	t.Run("StopBeforeStart", func(t *testing.T) { testStopBeforeStart(t, &h) })
	t.Run("FailedStartReleases", func(t *testing.T) { testFailedStart(t, &h) })
	t.Run("SnapshotRestore", func(t *testing.T) { testSnapshot(t, &h) })
}

// start creates and starts an instance of spec; a cleanup kills it.
func start(t *testing.T, h *Harness, spec runtime.Spec) runtime.Instance {
	t.Helper()
	in, err := h.Runtime.Create(t.Context(), spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), h.bootTimeout())
	defer cancel()
	if err := in.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		_ = in.Kill()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := in.Wait(ctx); err != nil {
			t.Errorf("wait in cleanup: %v", err)
		}
	})
	return in
}

// dial takes the agent channel and completes the agent handshake.
func dial(t *testing.T, h *Harness, in runtime.Instance) *agentapi.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), h.bootTimeout())
	defer cancel()
	conn, err := in.AgentConn(ctx)
	if err != nil {
		t.Fatalf("agent conn: %v", err)
	}
	c, err := agentapi.Dial(ctx, conn, agentapi.Options{})
	if err != nil {
		conn.Close()
		t.Fatalf("agent dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if c.Info.GetProtocolVersion() < 1 {
		t.Fatalf("agent info: %v", c.Info)
	}
	if _, err := c.Sync(ctx, "", 0); err != nil {
		t.Fatalf("agent sync: %v", err)
	}
	return c
}

func wait(t *testing.T, in runtime.Instance) runtime.ExitStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := in.Wait(ctx)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	return st
}

func testStartAgentStop(t *testing.T, h *Harness) {
	in := start(t, h, h.Spec(t))
	if in.ID() == "" {
		t.Error("empty ID")
	}
	c := dial(t, h, in)
	if _, err := in.AgentConn(t.Context()); err == nil {
		t.Error("second AgentConn succeeded")
	}
	if err := in.Start(t.Context()); err == nil {
		t.Error("second Start succeeded")
	}
	// Wait honours its context while the VMM runs.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	_, err := in.Wait(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait on a running instance = %v, want deadline exceeded", err)
	}

	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := in.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	st := wait(t, in)
	if !st.Requested || st.Reason != "" {
		t.Errorf("exit after Stop = %+v, want Requested and no Reason", st)
	}
	if err := in.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := in.Kill(); err != nil {
		t.Errorf("Kill after exit: %v", err)
	}
	if _, err := in.AgentConn(t.Context()); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("AgentConn after exit = %v, want ErrNotRunning", err)
	}
	// The guest is gone: the agent session fails.
	ictx, icancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer icancel()
	if _, err := c.Agent.Info(ictx, connect.NewRequest(&agentv1.InfoRequest{})); err == nil {
		t.Error("agent answered after Stop")
	}
}

func testKill(t *testing.T, h *Harness) {
	in := start(t, h, h.Spec(t))
	if err := in.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := in.Kill(); err != nil {
		t.Fatal("second Kill:", err)
	}
	st := wait(t, in)
	if !st.Requested {
		t.Errorf("exit after Kill = %+v, want Requested", st)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := in.Stop(ctx); err != nil {
		t.Errorf("Stop after Kill: %v", err)
	}
}

func testConcurrentWait(t *testing.T, h *Harness) {
	in := start(t, h, h.Spec(t))
	const n = 8
	var wg sync.WaitGroup
	results := make([]runtime.ExitStatus, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			results[i], errs[i] = in.Wait(ctx)
		})
	}
	time.Sleep(20 * time.Millisecond)
	var kills sync.WaitGroup
	for range 3 {
		kills.Go(func() { _ = in.Kill() })
	}
	kills.Wait()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || results[i] != results[0] || !results[i].Requested {
			t.Errorf("waiter %d: %+v, %v (waiter 0: %+v)", i, results[i], errs[i], results[0])
		}
	}
	// And once more after the fact.
	if st := wait(t, in); st != results[0] {
		t.Errorf("late Wait = %+v, want %+v", st, results[0])
	}
}

func testStopBeforeStart(t *testing.T, h *Harness) {
	before := h.InUse(t)
	in, err := h.Runtime.Create(t.Context(), h.Spec(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := in.Stop(ctx); err != nil {
		t.Fatalf("Stop before Start: %v", err)
	}
	st := wait(t, in)
	if !st.Requested {
		t.Errorf("exit = %+v, want Requested", st)
	}
	if err := in.Start(ctx); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("Start after Stop = %v, want ErrNotRunning", err)
	}
	if err := in.Kill(); err != nil {
		t.Errorf("Kill: %v", err)
	}
	if _, err := in.AgentConn(ctx); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("AgentConn = %v, want ErrNotRunning", err)
	}
	if after := h.InUse(t); after != before {
		t.Errorf("resources in use: %d before, %d after", before, after)
	}
}

func testFailedStart(t *testing.T, h *Harness) {
	before := h.InUse(t)
	in, err := h.Runtime.Create(t.Context(), h.BrokenSpec(t))
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), h.bootTimeout())
	defer cancel()
	if err := in.Start(ctx); err == nil {
		_ = in.Kill()
		wait(t, in)
		t.Fatal("Start of a broken spec succeeded")
	}
	// Wait returns at once: nothing is left running.
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer wcancel()
	st, err := in.Wait(wctx)
	if err != nil {
		t.Fatalf("Wait after a failed Start: %v", err)
	}
	if st.Requested || st.Reason == "" {
		t.Errorf("exit after a failed Start = %+v, want a Reason and not Requested", st)
	}
	if err := in.Stop(ctx); err != nil {
		t.Errorf("Stop after a failed Start: %v", err)
	}
	if after := h.InUse(t); after != before {
		t.Errorf("resources in use: %d before, %d after a failed Start", before, after)
	}
}

func testSnapshot(t *testing.T, h *Harness) {
	caps, err := h.Runtime.Probe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Snapshots {
		t.Skipf("%s reports no snapshot support", h.Runtime.Name())
	}
	spec := h.Spec(t)
	spec.Snapshottable = true
	tmpl := start(t, h, spec)
	snapper, ok := tmpl.(runtime.Snapshotter)
	if !ok {
		t.Fatal("a Snapshottable instance does not implement runtime.Snapshotter")
	}
	c := dial(t, h, tmpl)
	const path = "/airlock-conformance.txt"
	want := []byte("written before the snapshot\n")
	writeFile(t, c, path, want)
	if err := c.Close(); err != nil {
		t.Fatalf("close agent session: %v", err)
	}

	dir := t.TempDir()
	if h.SnapshotDir != nil {
		dir = h.SnapshotDir(t)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if err := snapper.SaveSnapshot(ctx, dir); err != nil {
		t.Fatalf("save snapshot: %v", err)
	}
	if st := wait(t, tmpl); !st.Requested {
		t.Errorf("template exit = %+v, want Requested", st)
	}

	// Two clones: each sees the template's file, neither sees the other's.
	var clients []*agentapi.Client
	for i := range 2 {
		cs := h.CloneSpec(t, spec, dir)
		t0 := time.Now()
		clone := start(t, h, cs)
		cc := dial(t, h, clone)
		t.Logf("clone %d answered %v after Create", i, time.Since(t0).Round(time.Millisecond))
		if got := ReadFile(t, cc, path); !bytes.Equal(got, want) {
			t.Fatalf("clone %d reads %q, want %q", i, got, want)
		}
		clients = append(clients, cc)
	}
	writeFile(t, clients[0], "/clone-0-only", []byte("x"))
	rctx, rcancel := context.WithTimeout(t.Context(), h.bootTimeout())
	defer rcancel()
	_, err = clients[1].Files.Stat(rctx, connect.NewRequest(&agentv1.StatRequest{Path: "/clone-0-only"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("clone 1 stat of clone 0's file = %v, want not found", err)
	}
}

func writeFile(t *testing.T, c *agentapi.Client, path string, data []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st := c.Files.Write(ctx)
	if err := st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Header{Header: &agentv1.WriteHeader{Path: path, Mode: 0o644}}}); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if err := st.Send(&agentv1.WriteRequest{Msg: &agentv1.WriteRequest_Data{Data: data}}); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	resp, err := st.CloseAndReceive()
	if err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	if resp.Msg.GetBytesWritten() != uint64(len(data)) {
		t.Fatalf("write %s: %d bytes written, want %d", path, resp.Msg.GetBytesWritten(), len(data))
	}
}

// ReadFile reads path from the guest through c's file service, failing t
// on any error (60 s at most).
func ReadFile(t *testing.T, c *agentapi.Client, path string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	st, err := c.Files.Read(ctx, connect.NewRequest(&agentv1.ReadRequest{Path: path}))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	defer st.Close()
	var out []byte
	for st.Receive() {
		out = append(out, st.Msg().GetData()...)
	}
	if err := st.Err(); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return out
}
