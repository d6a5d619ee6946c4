package shim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// activity tracks what keeps a sandbox from being idle: requests in flight
// on shim.sock, execs the shim owns, inbound connections to published ports
// and the preview route, and the time the last of them ended.
type activity struct {
	clk      clock.Clock // set before first use (Run)
	inflight atomic.Int64
	last     atomic.Int64 // unix nanoseconds
	pausing  atomic.Bool  // new requests are refused
}

func (a *activity) touch() { a.last.Store(a.clk.Now().UnixNano()) }

func (a *activity) begin() { a.inflight.Add(1); a.touch() }

func (a *activity) end() { a.touch(); a.inflight.Add(-1) }

// idleFor is how long nothing has happened, or 0 while something runs.
func (a *activity) idleFor(now time.Time, busy int64) time.Duration {
	if a.inflight.Load()+busy > 0 {
		return 0
	}
	return now.Sub(time.Unix(0, a.last.Load()))
}

// track wraps the shim socket's handler: every request is activity.
func (a *activity) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.pausing.Load() {
			// Connect's wire form of an Unavailable error: clients retry,
			// and the control plane resumes the sandbox.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"code":"unavailable","message":"the sandbox is pausing; retry"}`))
			return
		}
		switch r.URL.Path {
		case shimv2connect.LifecycleServiceStatsProcedure, shimv2connect.LifecycleServiceUsageProcedure, shimv2connect.LifecycleServiceRefreshProcedure:
			// Looking is not activity: a poller must not keep the
			// sandbox from idling.
			h.ServeHTTP(w, r)
			return
		}
		a.begin()
		defer a.end()
		h.ServeHTTP(w, r)
	})
}

// pauseReq asks the shim's main loop to pause; it answers on reply.
type pauseReq struct {
	force bool
	reply chan loopResult[shimv2.PauseResponse]
}

// loopResult is the main loop's answer to a request.
type loopResult[R any] struct {
	resp *R
	err  error
}

// loopCall hands q to the shim's main loop over ch and waits for the
// answer on reply (which must have room for it).
func loopCall[Q, R any](ctx context.Context, ch chan<- Q, q Q, reply <-chan loopResult[R]) (*connect.Response[R], error) {
	select {
	case ch <- q:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	res := <-reply
	if res.err != nil {
		return nil, res.err
	}
	return connect.NewResponse(res.resp), nil
}

// lifecycleService serves LifecycleService (proto/airlock/shim/v2) on
// shim.sock: Pause and Shutdown go to the shim's main loop; Touch and Stats
// are answered here, without the guest.
type lifecycleService struct {
	s *shim
	// since is when the guest started running under this shim.
	since time.Time
}

var _ shimv2connect.LifecycleServiceHandler = lifecycleService{}

func (l lifecycleService) Pause(ctx context.Context, req *connect.Request[shimv2.PauseRequest]) (*connect.Response[shimv2.PauseResponse], error) {
	r := pauseReq{force: req.Msg.GetForce(), reply: make(chan loopResult[shimv2.PauseResponse], 1)}
	return loopCall(ctx, l.s.pauseReq, r, r.reply)
}

// Shutdown asks the main loop to delete the sandbox (teardown, then the
// shim exits); it does not wait for it.
func (l lifecycleService) Shutdown(context.Context, *connect.Request[shimv2.ShutdownRequest]) (*connect.Response[shimv2.ShutdownResponse], error) {
	l.s.stopOnce.Do(func() { close(l.s.stopReq) })
	return connect.NewResponse(&shimv2.ShutdownResponse{}), nil
}

// Touch is activity: the request itself (activity.track) and an explicit
// touch, for a handler that would run outside track.
func (l lifecycleService) Touch(context.Context, *connect.Request[shimv2.TouchRequest]) (*connect.Response[shimv2.TouchResponse], error) {
	l.s.act.touch()
	return connect.NewResponse(&shimv2.TouchResponse{}), nil
}

// Refresh asks the main loop to re-read the sandbox's row (its lifetime)
// and returns without waiting: a Refresh already queued covers this one.
func (l lifecycleService) Refresh(context.Context, *connect.Request[shimv2.RefreshRequest]) (*connect.Response[shimv2.RefreshResponse], error) {
	select {
	case l.s.refreshReq <- struct{}{}:
	default:
	}
	return connect.NewResponse(&shimv2.RefreshResponse{}), nil
}

// Stats reports the shim's own counters.
func (l lifecycleService) Stats(context.Context, *connect.Request[shimv2.StatsRequest]) (*connect.Response[shimv2.StatsResponse], error) {
	s := l.s
	resp := &shimv2.StatsResponse{
		Runtime: s.cfg.Runtime.Name(), Accel: s.accel, RunningSinceUnixNano: l.since.UnixNano(),
		// Stats requests are not tracked (see activity.track).
		RequestsInFlight: uint32(max(s.act.inflight.Load(), 0)), LastActivityUnixNano: s.act.last.Load(),
	}
	if s.execs != nil {
		resp.RunningExecs = uint32(s.execs.Running())
	}
	if s.net != nil {
		resp.InboundConnections = uint32(max(s.net.inbound.Load(), 0))
	}
	return connect.NewResponse(resp), nil
}

// Usage relays the guest's resource use and adds the network counters of
// the guest's link. The guest's numbers are its own account:
// informational, never used for a decision.
func (l lifecycleService) Usage(ctx context.Context, _ *connect.Request[shimv2.UsageRequest]) (*connect.Response[shimv2.UsageResponse], error) {
	a := l.s.agent
	if a == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the guest agent is not connected"))
	}
	if err := a.Require(agentapi.VersionWatch, "usage"); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	resp, err := a.Agent.Usage(ctx, connect.NewRequest(&agentv1.UsageRequest{}))
	if err != nil {
		return nil, relayErr("usage", err)
	}
	u := resp.Msg
	return connect.NewResponse(&shimv2.UsageResponse{
		CpuBusyNs: u.GetCpuBusyNs(), CpuTotalNs: u.GetCpuTotalNs(), Cpus: u.GetCpus(),
		MemTotalBytes: u.GetMemTotalBytes(), MemAvailableBytes: u.GetMemAvailableBytes(), MemCachedBytes: u.GetMemCachedBytes(),
		DiskTotalBytes: u.GetDiskTotalBytes(), DiskUsedBytes: u.GetDiskUsedBytes(),
		Network: l.s.net.usage(),
	}), nil
}

// preconditions for pause: nothing in flight that a pause would cut off
// (unless forced); live, for a live snapshot, lets connections to published
// ports be (they survive it). (Secret values survive: the control plane keeps them
// sealed and binds them again at the resume.) Running
// execs do not count when park is set (the pause parks them), nor do the
// client streams that follow them.
func (s *shim) pauseCheck(force, park, live bool, own int64) error {
	if s.noSave != "" {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New(s.noSave))
	}
	if force {
		return nil
	}
	pending := func() (requests, busy int64) {
		requests, busy = s.act.inflight.Load()-own, s.busy()
		if live && s.net != nil {
			// The guest keeps its connections through a live snapshot.
			busy -= s.net.inbound.Load()
		}
		if park && s.execs != nil {
			execs, streams := s.execs.Parkable()
			requests, busy = requests-streams, busy-execs
		}
		return requests, busy
	}
	// A request whose client just got its answer may still be finishing
	// on this side: give in-flight work a moment to end.
	for deadline := time.Now().Add(pauseDrain); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if r, b := pending(); r <= 0 && b <= 0 {
			break
		}
	}
	requests, busy := pending()
	if requests > 0 {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%d requests (code runs, file transfers) are in flight; wait for them, or use force", requests))
	}
	if busy > 0 {
		what := "commands or connections are running"
		if park {
			what = "connections to published ports are open"
		}
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%d %s; wait for them, or use force (they are ended)", busy, what))
	}
	return nil
}

// pauseDrain is how long a pause waits for in-flight work to end before
// it refuses (without force).
const pauseDrain = 2 * time.Second

// busy counts owned execs still running and open inbound connections.
func (s *shim) busy() int64 {
	var n int64
	if s.execs != nil {
		n += int64(s.execs.Running())
	}
	if s.net != nil {
		n += s.net.inbound.Load()
	}
	return n
}

// pause saves the guest to disk and leaves everything but the sandbox's
// disk and paused state behind; the shim exits after. On an error before
// the save started, the sandbox keeps running.
// own is how many requests in flight belong to the pause itself (1 for a
// Pause request, 0 for an idle pause). fatal reports an error after which
// the sandbox cannot go on running (its agent channel is closed or its VMM
// gone): the caller must fail it.
func (s *shim) pause(ctx context.Context, force bool, own int64) (resp *shimv2.PauseResponse, fatal bool, err error) {
	// What the runtime cannot do comes first: asking to wait for commands,
	// or to force, would not help.
	saver, ok := s.inst.(runtime.StateSaver)
	if !ok {
		return nil, false, connect.NewError(connect.CodeUnimplemented, errors.New("this sandbox's runtime cannot pause it"))
	}
	// Without force, running execs are parked in the guest and go on after
	// the resume (an agent older than protocol 8 cannot: they refuse the
	// pause as before).
	park := !force && s.execs != nil && s.execs.CanPark()
	if err := s.pauseCheck(force, park, false, own); err != nil {
		return nil, false, err
	}
	sb, err := s.st.GetSandbox(ctx, s.cfg.ID)
	if err != nil {
		return nil, false, err
	}
	left := sb.ExpiresAt.Sub(s.clk.Now())
	dir := s.l.PauseDir(s.cfg.ID)
	_ = os.RemoveAll(dir)
	stateDir := filepath.Join(dir, statedir.PauseStateDir)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, false, err
	}
	if _, err := s.st.Transition(ctx, s.cfg.ID, store.Change{To: store.StatePausing, Gen: s.gen}); err != nil {
		return nil, false, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("sandbox is not running (%v)", err))
	}
	// From here on new requests are refused (retry after the pause: the
	// control plane resumes the sandbox), and a failure is fatal.
	s.act.pausing.Store(true)
	defer func() {
		if err != nil {
			fatal = true
		}
	}()
	t0 := time.Now()
	if _, err := s.detachGuest(dir, park, "the sandbox was paused (force)"); err != nil {
		return nil, true, err
	}
	if err := saver.SaveState(ctx, stateDir, runtime.SaveOptions{}); err != nil {
		return nil, true, fmt.Errorf("save guest state: %w", err)
	}
	saveDur := time.Since(t0)
	size, err := s.writeManifest(dir)
	if err != nil {
		return nil, true, err
	}
	if _, err := s.st.Transition(ctx, s.cfg.ID, store.Change{To: store.StatePaused, Gen: s.gen, LifetimeLeft: left}); err != nil {
		return nil, true, fmt.Errorf("record paused: %w", err)
	}
	s.log.Info("paused", "save", saveDur, "total", time.Since(t0), "state_bytes", size)
	return &shimv2.PauseResponse{StateBytes: size, SaveMs: saveDur.Milliseconds()}, false, nil
}

// detachGuest readies the guest to be saved into dir: owned execs are
// parked (saved in dir) or, without park, end with forceNote; then the
// agent channel closes (the guest must see its EOF before it is frozen).
// It returns the parked execs.
func (s *shim) detachGuest(dir string, park bool, forceNote string) ([]savedExec, error) {
	var saved []savedExec
	if park {
		saved = s.execs.Park()
		if err := writeSavedExecs(dir, saved); err != nil {
			return nil, fmt.Errorf("save the execs: %w", err)
		}
		s.log.Info("execs parked", "execs", len(saved))
	}
	if s.execs != nil {
		s.execs.CloseFor(forceNote)
	}
	_ = s.agent.Close()
	return saved, nil
}

// writeManifest writes dir's PauseManifest for the state saved in
// dir/state and returns the state's size.
func (s *shim) writeManifest(dir string) (int64, error) {
	sum, size, err := statedir.HashDir(filepath.Join(dir, statedir.PauseStateDir))
	if err != nil {
		return 0, err
	}
	bc := s.boot
	m := statedir.PauseManifest{Version: 1, Kernel: bc.Kernel, Initrd: bc.Initrd, StateSHA256: sum, StateBytes: size, PausedAt: s.clk.Now().UTC(),
		Runtime: s.cfg.Runtime.Name(), Accel: s.accel, RootInState: s.cfg.RootDir != nil}
	b, _ := json.MarshalIndent(m, "", "  ")
	return size, os.WriteFile(filepath.Join(dir, statedir.PauseManifestFile), b, 0o400)
}

// snapReq asks the shim's main loop for a live snapshot; it answers on
// reply.
type snapReq struct {
	dir   string
	force bool
	reply chan loopResult[shimv2.SnapshotResponse]
}

// Snapshot is the live snapshot; the main loop takes it (so it never runs
// beside a pause or a stop).
func (l lifecycleService) Snapshot(ctx context.Context, req *connect.Request[shimv2.SnapshotRequest]) (*connect.Response[shimv2.SnapshotResponse], error) {
	r := snapReq{dir: req.Msg.GetDir(), force: req.Msg.GetForce(), reply: make(chan loopResult[shimv2.SnapshotResponse], 1)}
	return loopCall(ctx, l.s.snapReq, r, r.reply)
}

// snapshotLive saves the running guest into dir (see
// LifecycleService.Snapshot) and carries on: the root disk is frozen as
// dir's disk and the guest continues on a new overlay on it (on gVisor the
// root's writes are in the state, and there is no disk), the agent
// session is dialled again, the parked execs are adopted again and the
// process audit restarts (the trail records the gap). On an error before
// the guest was stopped the sandbox runs on untouched; fatal reports one
// after which it cannot (the caller fails it).
func (s *shim) snapshotLive(ctx context.Context, dir string, force bool) (resp *shimv2.SnapshotResponse, fatal bool, err error) {
	saver, ok := s.inst.(runtime.StateSaver)
	if !ok {
		return nil, false, connect.NewError(connect.CodeUnimplemented, errors.New("this sandbox's runtime cannot snapshot it while it runs"))
	}
	// The control plane names the directory; it must still be a new one
	// in this state dir's snapshots.
	if dir != filepath.Clean(dir) || filepath.Dir(dir) != s.l.SnapshotsDir() {
		return nil, false, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("snapshot dir %q is not in %s", dir, s.l.SnapshotsDir()))
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return nil, false, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("snapshot dir %q is not a new empty directory (%v)", dir, err))
	}
	park := !force && s.execs != nil && s.execs.CanPark()
	if err := s.pauseCheck(force, park, true, 1); err != nil {
		return nil, false, err
	}
	sb, err := s.st.GetSandbox(ctx, s.cfg.ID)
	if err != nil {
		return nil, false, err
	}
	t0 := time.Now()
	// A runtime whose root is a directory (gVisor) keeps the root's writes
	// in the state: no disk to freeze.
	disk := s.cfg.RootDir == nil
	root := s.l.RootDisk(s.cfg.ID)
	frozen := filepath.Join(dir, statedir.SnapshotDisk)
	next := root + ".next"
	if disk {
		_ = os.Remove(next)
		// The snapshot's disk is the root disk's inode under a second name
		// (the guest writes to it until the save switches it over), and the
		// new overlay is backed by that name, which outlives the sandbox.
		if err := os.Link(root, frozen); err != nil {
			return nil, false, fmt.Errorf("snapshot disk: %w", err)
		}
		if err := statedir.CreateOverlay(ctx, next, frozen, "qcow2", 0); err != nil {
			_ = os.Remove(frozen)
			return nil, false, err
		}
	}
	stateDir := filepath.Join(dir, statedir.PauseStateDir)
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		if disk {
			_ = errors.Join(os.Remove(frozen), os.Remove(next))
		}
		return nil, false, err
	}
	// New requests wait (they are refused with "retry") until the guest
	// answers again; until then a failure is fatal.
	s.act.pausing.Store(true)
	defer s.act.pausing.Store(false)
	risky := true
	defer func() {
		if err != nil && risky {
			fatal = true
		}
	}()
	auditOff := s.clk.Now()
	s.proc.close()
	s.proc = nil
	saved, err := s.detachGuest(dir, park, "the sandbox was snapshotted (force)")
	if err != nil {
		return nil, true, err
	}
	o := runtime.SaveOptions{KeepRunning: true}
	if disk {
		o.NewRootDisk = next
	}
	if err := saver.SaveState(ctx, stateDir, o); err != nil {
		return nil, true, fmt.Errorf("save guest state: %w", err)
	}
	if disk {
		if err := os.Rename(next, root); err != nil {
			return nil, true, fmt.Errorf("new root disk: %w", err)
		}
	}
	conn, err := s.inst.AgentConn(ctx)
	if err != nil {
		return nil, true, fmt.Errorf("agent after the snapshot: %w", err)
	}
	bootCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.agent.Redial(bootCtx, conn); err != nil {
		conn.Close()
		return nil, true, fmt.Errorf("agent after the snapshot: %w", err)
	}
	// A new clock reading and fresh entropy, as after any restore.
	if _, err := s.agent.SyncWith(bootCtx, agentapi.SyncOptions{}); err != nil {
		return nil, true, err
	}
	if s.execs != nil {
		s.execs.reopen()
		s.execs.restore(bootCtx, saved, false, sb.Tenant)
	}
	risky = false // the sandbox runs as before; only the snapshot can still fail
	if !s.cfg.NoProcAudit {
		s.proc = startProcAudit(s.agent, s.inst, s.st, sb.ID, s.own, s.log, s.clk)
		s.event(ctx, sb, "proc.audit.gap", map[string]any{"reason": "a live snapshot: programs the guest started while its agent reconnected are not recorded",
			"from": auditOff.UTC(), "to": s.clk.Now().UTC()})
	}
	total := time.Since(t0)
	size, err := s.writeManifest(dir)
	if err != nil {
		return nil, false, err
	}
	s.log.Info("live snapshot", "dir", dir, "state_bytes", size, "execs", len(saved), "total", total)
	return &shimv2.SnapshotResponse{StateBytes: size, TotalMs: total.Milliseconds()}, false, nil
}

// resumeSpec checks a paused sandbox's saved state and fills spec to
// restore it. The digest check runs concurrently with the restore: verify
// must return nil before the sandbox is marked running.
func (s *shim) resumeSpec(spec *runtime.Spec) (verify func() error, err error) {
	dir := s.l.PauseDir(s.cfg.ID)
	m, err := readManifest(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("paused state is missing (%v); the sandbox cannot be resumed", err)
	} else if err != nil {
		return nil, errors.New("paused state manifest is unreadable; the sandbox cannot be resumed")
	}
	if m.Runtime != "" && m.Runtime != s.cfg.Runtime.Name() {
		return nil, fmt.Errorf("the sandbox was paused under the %s runtime; this host runs %s", m.Runtime, s.cfg.Runtime.Name())
	}
	if m.Accel != "" && s.accel != "" && m.Accel != s.accel {
		// A saved CPU state restores only under the accelerator that saved
		// it (a bundle from another node, or KVM that came or went).
		return nil, fmt.Errorf("the sandbox was paused under %s; this host runs its guests under %s", m.Accel, s.accel)
	}
	for _, p := range []string{m.Kernel, m.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("the guest kernel or initramfs this sandbox was paused with is gone (%s)", p)
		}
	}
	if s.savedExecs, err = readSavedExecs(dir); err != nil {
		// The guest resumes; its parked execs are not adopted (the agent
		// kills them after a while).
		s.log.Warn("the execs the pause saved are unreadable", "err", err)
	}
	spec.Kernel, spec.Initrd = m.Kernel, m.Initrd
	spec.RestoreFrom = filepath.Join(dir, statedir.PauseStateDir)
	s.boot.Kernel, s.boot.Initrd = m.Kernel, m.Initrd
	return checkState(spec.RestoreFrom, m, "paused state is corrupt (its digest does not match the manifest); the sandbox cannot be resumed"), nil
}

// snapshotSpec fills spec to restore snapshot sid's state directly (a
// runtime whose root's writes are in the state, gVisor: no template, no
// disk). The digest check runs concurrently with the restore, as for a
// resume.
func (s *shim) snapshotSpec(spec *runtime.Spec, sid string) (verify func() error, err error) {
	dir := s.l.SnapshotDir(sid)
	m, err := readManifest(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the snapshot's manifest is missing (%v)", err)
	} else if err != nil {
		return nil, errors.New("the snapshot's manifest is unreadable")
	}
	if m.Runtime != s.cfg.Runtime.Name() || !m.RootInState {
		return nil, fmt.Errorf("the snapshot was taken under the %s runtime; this sandbox runs on %s", cmp.Or(m.Runtime, "qemu"), s.cfg.Runtime.Name())
	}
	spec.RestoreFrom = filepath.Join(dir, statedir.PauseStateDir)
	return checkState(spec.RestoreFrom, m, "the snapshot is corrupt (its state does not match its digest)"), nil
}

// readManifest reads dir's PauseManifest; an error wraps os.ErrNotExist
// when there is none, and says unreadable when it is not a version 1
// manifest with a state digest.
func readManifest(dir string) (statedir.PauseManifest, error) {
	var m statedir.PauseManifest
	b, err := os.ReadFile(filepath.Join(dir, statedir.PauseManifestFile))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 || len(m.StateSHA256) != 64 {
		return m, errors.New("unreadable manifest")
	}
	return m, nil
}

// checkState hashes the state in dir in the background; the func it
// returns waits for the result: nil if it matches m, else an error saying
// corrupt.
func checkState(dir string, m statedir.PauseManifest, corrupt string) func() error {
	done := make(chan error, 1)
	go func() {
		sum, size, err := statedir.HashDir(dir)
		switch {
		case err != nil:
			done <- err
		case sum != m.StateSHA256 || size != m.StateBytes:
			done <- errors.New(corrupt)
		default:
			done <- nil
		}
	}()
	var once sync.Once
	var verr error
	return func() error {
		once.Do(func() { verr = <-done })
		return verr
	}
}
