package fake

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Runtime is the fake backend. Safe for concurrent use.
type Runtime struct {
	mu        sync.Mutex
	startHook func(runtime.Spec) error
	ctxHook   func(lang string)
	instances map[string]*Instance // live (created, not yet ended) by ID
	snapshots map[string]*fs       // by the token in a saved dir's marker file (see saved)
	saves     int                  // tokens handed out
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns an empty fake runtime.
func New() *Runtime {
	return &Runtime{instances: map[string]*Instance{}, snapshots: map[string]*fs{}}
}

// Name returns "fake".
func (r *Runtime) Name() string { return "fake" }

// Probe reports a host with snapshots and no acceleration.
func (r *Runtime) Probe(context.Context) (runtime.Capabilities, error) {
	return runtime.Capabilities{Accel: "none", AccelReason: "fake runtime", VMMVersion: "fake", Snapshots: true}, nil
}

// SetStartHook makes every later Start call hook first; a non-nil error
// fails that Start (after "acquiring" its resources, which it releases).
// nil removes the hook.
func (r *Runtime) SetStartHook(hook func(runtime.Spec) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.startHook = hook
}

// SetContextStartHook makes the fake guests call hook whenever they start
// a code context's interpreter (create, restart, a run that creates a
// default context or restarts a dead one), before the start completes; it
// may block, as a slow interpreter would. nil removes the hook.
func (r *Runtime) SetContextStartHook(hook func(lang string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctxHook = hook
}

func (r *Runtime) contextStarting(lang string) {
	r.mu.Lock()
	hook := r.ctxHook
	r.mu.Unlock()
	if hook != nil {
		hook(lang)
	}
}

// Instance returns the live instance with id, or nil.
func (r *Runtime) Instance(id string) *Instance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.instances[id]
}

// Live returns how many instances are created or running and not yet ended
// (the conformance suite checks that failures release them).
func (r *Runtime) Live() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.instances)
}

// Create validates spec and returns a new instance. A RestoreFrom must name
// a directory saved by this Runtime (SaveSnapshot, SaveState), where it was
// saved or wherever it was moved since.
func (r *Runtime) Create(_ context.Context, spec runtime.Spec) (runtime.Instance, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalid, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fsys := newFS()
	if spec.RestoreFrom != "" {
		snap := r.snapshots[savedToken(spec.RestoreFrom)]
		if snap == nil {
			return nil, fmt.Errorf("%w: snapshot %s", errdefs.ErrNotFound, spec.RestoreFrom)
		}
		fsys = snap.clone()
	}
	if _, dup := r.instances[spec.ID]; dup {
		return nil, fmt.Errorf("%w: instance %q exists", errdefs.ErrConflict, spec.ID)
	}
	in := &Instance{rt: r, spec: spec, fs: fsys, done: make(chan struct{})}
	r.instances[spec.ID] = in
	return in, nil
}

// savedMarker is the file a saved directory holds: the token of its
// filesystem copy in the Runtime. The token moves with the directory, as
// a real runtime's state files do.
const savedMarker = "fake-saved"

// save records snap under a new token and writes the token into dir.
func (r *Runtime) save(dir string, snap *fs) error {
	r.mu.Lock()
	r.saves++
	token := fmt.Sprintf("save-%d", r.saves)
	r.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, savedMarker), []byte(token+"\n"), 0o444); err != nil {
		return err
	}
	r.mu.Lock()
	r.snapshots[token] = snap
	r.mu.Unlock()
	return nil
}

// savedToken reads the token of a saved dir ("" if there is none).
func savedToken(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, savedMarker))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (r *Runtime) forget(in *Instance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.instances[in.spec.ID] == in {
		delete(r.instances, in.spec.ID)
	}
}

// Instance is one fake guest.
type Instance struct {
	rt   *Runtime
	spec runtime.Spec
	fs   *fs

	done chan struct{} // closed when ended

	mu         sync.Mutex
	state      int // 0 created, 1 running, 2 ended
	host       net.Conn
	guest      net.Conn
	agentTaken bool
	cancel     context.CancelFunc
	serving    sync.WaitGroup
	status     runtime.ExitStatus
	booted     time.Time
	saves      []SaveCall
}

// SaveCall records one StateSaver.SaveState call that succeeded.
type SaveCall struct {
	Dir  string
	Opts runtime.SaveOptions
}

// Saves returns the successful SaveState calls made on the instance.
func (in *Instance) Saves() []SaveCall {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]SaveCall(nil), in.saves...)
}

var (
	_ runtime.Instance    = (*Instance)(nil)
	_ runtime.Snapshotter = (*Instance)(nil)
	_ runtime.StateSaver  = (*Instance)(nil)
)

// ID returns Spec.ID.
func (in *Instance) ID() string { return in.spec.ID }

// Start "boots" the guest: the agent starts serving on the channel.
func (in *Instance) Start(ctx context.Context) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch in.state {
	case 1:
		return fmt.Errorf("%w: start called twice", errdefs.ErrConflict)
	case 2:
		return fmt.Errorf("start: %w", runtime.ErrNotRunning)
	}
	if err := ctx.Err(); err != nil {
		in.endLocked(runtime.ExitStatus{Code: -1, Reason: "VMM failed to start"})
		return fmt.Errorf("start fake vmm: %w", err)
	}
	in.rt.mu.Lock()
	hook := in.rt.startHook
	in.rt.mu.Unlock()
	if hook != nil {
		if err := hook(in.spec); err != nil {
			in.endLocked(runtime.ExitStatus{Code: 1, Reason: "VMM failed to start"})
			return fmt.Errorf("start fake vmm: %w", err)
		}
	}
	in.booted = time.Now()
	in.serveLocked()
	in.state = 1
	return nil
}

// serveLocked starts a fake agent on a new channel. in.mu is held.
func (in *Instance) serveLocked() {
	host, guest := net.Pipe()
	sctx, cancel := context.WithCancel(context.Background())
	a := &agent{fs: in.fs, cpus: in.spec.CPUs, memBytes: uint64(in.spec.MemoryMiB) << 20, booted: in.booted}
	a.powerOff = func() { in.end(runtime.ExitStatus{Code: 0, Reason: "guest powered off"}) }
	a.ctxs.starting, a.ctxs.fs = in.rt.contextStarting, in.fs
	in.host, in.guest, in.cancel, in.agentTaken = host, guest, cancel, false
	in.serving.Go(func() {
		h := agentapi.NewHandler(a, a, a)
		h.Handle(agentv1connect.NewContextServiceHandler(&a.ctxs))
		_ = agentapi.Serve(sctx, guest, h)
	})
}

// AgentConn returns the host end of the agent channel, once.
func (in *Instance) AgentConn(context.Context) (net.Conn, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.state != 1:
		return nil, fmt.Errorf("agent conn: %w", runtime.ErrNotRunning)
	case in.agentTaken:
		return nil, fmt.Errorf("%w: agent conn already taken", errdefs.ErrConflict)
	}
	in.agentTaken = true
	return in.host, nil
}

// Wait blocks until the instance has ended.
func (in *Instance) Wait(ctx context.Context) (runtime.ExitStatus, error) {
	select {
	case <-in.done:
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.status, nil
	case <-ctx.Done():
		return runtime.ExitStatus{}, fmt.Errorf("wait for fake vmm: %w", context.Cause(ctx))
	}
}

// Stop ends the instance as a requested stop. Idempotent.
func (in *Instance) Stop(context.Context) error {
	in.end(runtime.ExitStatus{Code: 0, Requested: true})
	<-in.done
	return nil
}

// Kill ends the instance as if SIGKILLed. Idempotent.
func (in *Instance) Kill() error {
	in.end(runtime.ExitStatus{Code: -1, Signal: "killed", Requested: true})
	return nil
}

// Crash makes a running instance's "VMM" exit unexpectedly with reason
// (as a guest kernel panic would). No-op if it is not running.
func (in *Instance) Crash(reason string) {
	in.mu.Lock()
	running := in.state == 1
	in.mu.Unlock()
	if running {
		in.end(runtime.ExitStatus{Code: 0, Reason: reason})
	}
}

// SaveSnapshot copies the filesystem under dir's path in the Runtime and
// writes a marker file into dir; the instance ends (Requested).
func (in *Instance) SaveSnapshot(ctx context.Context, dir string) error {
	if !in.spec.Snapshottable {
		return fmt.Errorf("%w: instance was not created Snapshottable", errdefs.ErrFailedPrecondition)
	}
	in.mu.Lock()
	running := in.state == 1
	in.mu.Unlock()
	if !running {
		return fmt.Errorf("snapshot: %w", runtime.ErrNotRunning)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("snapshot dir: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("%w: snapshot dir is not empty", errdefs.ErrInvalid)
	}
	if err := in.rt.save(dir, in.fs.clone()); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	in.end(runtime.ExitStatus{Code: 0, Requested: true})
	return nil
}

// SaveState records a copy of the filesystem under dir's path in the
// Runtime (restorable with RestoreFrom = dir, Snapshottable or not) and
// writes a marker file into dir. Without o.KeepRunning the instance ends
// (Requested). With it (o.NewRootDisk required, not opened) the instance
// keeps running with a new agent channel: AgentConn may be called again,
// and the previous one is closed. The fake has no RAM: a snapshot keeps
// files only.
func (in *Instance) SaveState(ctx context.Context, dir string, o runtime.SaveOptions) error {
	if o.KeepRunning && o.NewRootDisk == "" {
		return fmt.Errorf("%w: save state: KeepRunning needs NewRootDisk", errdefs.ErrInvalid)
	}
	in.mu.Lock()
	running := in.state == 1
	in.mu.Unlock()
	if !running {
		return fmt.Errorf("save state: %w", runtime.ErrNotRunning)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("save state dir: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("%w: save state dir is not empty", errdefs.ErrInvalid)
	}
	if err := in.rt.save(dir, in.fs.clone()); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if !o.KeepRunning {
		in.mu.Lock()
		in.saves = append(in.saves, SaveCall{Dir: dir, Opts: o})
		in.mu.Unlock()
		in.end(runtime.ExitStatus{Code: 0, Requested: true})
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.state != 1 {
		return fmt.Errorf("save state: %w", runtime.ErrNotRunning)
	}
	in.saves = append(in.saves, SaveCall{Dir: dir, Opts: o})
	// The old channel ends as a closed agent connection does; the guest
	// gets a new one.
	in.cancel()
	in.guest.Close()
	in.host.Close()
	in.serveLocked()
	return nil
}

// end moves the instance to ended once, with st.
func (in *Instance) end(st runtime.ExitStatus) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.endLocked(st)
}

func (in *Instance) endLocked(st runtime.ExitStatus) {
	if in.state == 2 {
		return
	}
	running := in.state == 1
	in.state = 2
	in.status = st
	if !running {
		in.rt.forget(in)
		close(in.done)
		return
	}
	// The "VMM" is gone: the guest end closes (the host reads EOF), and
	// the host end too unless a caller owns it.
	in.cancel()
	in.guest.Close()
	if !in.agentTaken {
		in.host.Close()
	}
	go func() {
		in.serving.Wait()
		in.rt.forget(in)
		close(in.done)
	}()
}
