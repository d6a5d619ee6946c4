// Package shim is the per-sandbox supervisor (`airlock shim`, hidden). It
// owns the sandbox's VMM and agent channel for the sandbox's whole life and
// outlives the CLI that started it.
//
// Contract with the manager (internal/sandbox):
//   - start: the manager creates the catalog row (state creating) and the
//     sandbox dir, then starts the shim detached with fd 3 a pipe, its
//     configuration document on fd 4 (internal/shimconf: every setting,
//     the secret values included; `airlock shim` reads it into Config) and
//     the shim lock on fd 5. The shim
//     takes an exclusive flock on shim.lock (held until it exits), boots or
//     restores the guest, serves its services on shim.sock, marks the
//     row running and writes "ok\n" to fd 3; on failure it marks the row
//     failed and writes "error: <reason>\n".
//   - delete: LifecycleService.Shutdown (proto/airlock/shim/v2) on
//     shim.sock stops the guest; the shim exits and the manager removes the
//     files and the row.
//   - lifetime: at the row's expires_at (re-read every second, so
//     store.SetExpiry moves it) the shim stops the guest and deletes the
//     sandbox itself.
//   - execs: the shim serves ExecService (proto/airlock/shim/v2): execs it
//     owns, started and attached on one stream per client, which outlive
//     their callers (unless kill_on_detach), keep their output (capped)
//     and exit status, and are audited in the catalog (exec.start,
//     exec.exit).
//   - crash: if the VMM dies, the row becomes failed with the reason from
//     the guest console; the disk is freed, logs are kept until `rm`. If the
//     shim dies, its VMM dies with it (parent-death signal) and the manager
//     marks the row failed when it finds the lock free.
package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/hostcg"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// Config is one shim's configuration.
type Config struct {
	StateDir string
	ID       string
	// Ready receives "ok\n" or "error: ...\n" once; may be nil.
	Ready io.WriteCloser
	// Runtime runs the guest.
	Runtime runtime.Runtime
	// Exe is the airlock binary, for starting template holders ("" to not
	// share template RAM across processes).
	Exe string
	// RootDir, when set, gives the sandbox's root as a read-only directory
	// (runtimes like gvisor that run on a directory, not a disk image):
	// then there is no disk overlay and no template.
	RootDir func(context.Context, store.Sandbox) (string, error)
	// BuildRoot, with RootDir set, is instead the sandbox's root written in
	// place (shimconf.Doc.BuildRoot: a gvisor template build's step).
	BuildRoot string
	// Secrets are the values of the sandbox's secrets (shimconf.Doc).
	Secrets netconf.Values
	// Lock, if set, is the sandbox's shim lock, already taken by the
	// control plane that claimed the sandbox's generation and started this
	// shim (inherited on statedir.ShimLockFD; see store.Transition). It is
	// used if it is that file and is locked; otherwise the shim takes the
	// lock itself.
	Lock *os.File
	// DNS lists the resolvers ("ip[:port],...") guest DNS queries are
	// forwarded to; "" means the nameservers of /etc/resolv.conf.
	DNS string
	// UpstreamCAFile is a PEM file of extra CAs trusted for the upstreams
	// of intercepted connections ("" for none).
	UpstreamCAFile string
	// TestDialMap is a TEST HOOK ("a.b.c.d=w.x.y.z,..."): where the policy
	// allowed a flow to a.b.c.d the shim dials w.x.y.z instead. `airlock
	// shim` sets it from its configuration document (shimconf), which the
	// control plane's command fills from envknob.TestDialMap.
	TestDialMap string
	// HostCgroupParent, if set, is the host cgroup under which the shim
	// makes the sandbox's envelope (hostcg: memory and pids limits
	// from its size) and enters it before the VMM or sentry starts.
	HostCgroupParent string
	// HostCgroupRequired fails the start when the envelope cannot be
	// made; otherwise the sandbox runs without one and the shim logs why.
	HostCgroupRequired bool
	// DiskReserve is the state dir's free-space reserve, as
	// sandbox.Manager.DiskReserve: an idle pause that could take the
	// filesystem below it is skipped (the sandbox keeps running).
	DiskReserve int64
	// NoProcAudit turns the guest process audit off (procaudit.go):
	// the shim does not ask the agent for the programs the guest runs.
	NoProcAudit bool
	Log         *slog.Logger
	// Clock is the time of the shim's timers and timestamps: the
	// lifetime (expires_at and its re-reads), the idle pause and the
	// activity that defers it, the audit trail's rate limit and folding,
	// the host-side deadlines of execs and code runs, exec start and end
	// times. nil: the system clock. Deadlines of I/O (sockets, RPCs to the
	// guest, the pause's short drain) and durations measured for logs stay
	// on the system clock.
	Clock clock.Clock

	// serving, if set, is called with the shim once its tables exist and
	// before it serves anything (in-package tests look inside through it).
	serving func(*shim)
}

// ramSharer is implemented by runtimes that can map a template's RAM from a
// memfd made by another process (qemu.Runtime).
type ramSharer interface {
	UseSnapshotRAM(dir string, f *os.File) error
}

type shim struct {
	cfg   Config
	clk   clock.Clock // cfg.Clock or the system clock
	l     statedir.Layout
	st    *store.Store
	log   *slog.Logger
	inst  runtime.Instance
	agent *agentapi.Client
	srv   *http.Server
	tmpl  *template.Template // the template this sandbox was cloned from, if any
	// noSave, if set, is why the guest cannot be saved (pause refuses).
	noSave string
	execs  *sessions // execs the shim owns (ExecService)
	// savedExecs are the execs the pause being resumed saved (park.go).
	savedExecs []savedExec
	contexts   *contextRelay       // ContextService
	net        *network            // the guest's network
	env        map[string]string   // default environment of execs and contexts, at start
	defEnv     *defaultEnv         // the same, as execs get it (a live secrets change replaces it)
	boot       statedir.BootConfig // kernel and initramfs the guest runs
	accel      string              // "kvm" or "tcg"
	act        activity            // what keeps the sandbox from idling
	pauseReq   chan pauseReq       // LifecycleService.Pause asks the main loop
	snapReq    chan snapReq        // LifecycleService.Snapshot asks it
	refreshReq chan struct{}       // LifecycleService.Refresh asks it to re-read the row
	gen        int64               // the generation this shim owns (store.Transition)
	envelope   *hostcg.Envelope    // the host cgroup this shim and its VMM run in; nil if none
	proc       *procAudit          // the guest's process audit; nil if off
	// own is whom the shim's own audit rows and egress usage are
	// recorded for, and the environment values its process audit hides.
	own *owner

	stopOnce sync.Once
	stopReq  chan struct{}
}

// enterEnvelope moves this shim into the sandbox's host cgroup
// (Config.HostCgroupParent), before the VMM or sentry starts so that it is
// inside from its first instruction. Without one it fails only if
// Config.HostCgroupRequired.
func (s *shim) enterEnvelope(sb store.Sandbox) error {
	if s.cfg.HostCgroupParent == "" {
		return nil
	}
	env, err := hostcg.Enter(s.cfg.HostCgroupParent, s.cfg.ID, hostcg.For(sb.MemoryMiB))
	switch {
	case err == nil:
		s.envelope = env
		return nil
	case s.cfg.HostCgroupRequired:
		return fmt.Errorf("host cgroup: %w", err)
	}
	s.log.Warn("no host cgroup: the sandbox's VMM and shim run without host memory and pids limits", "err", err)
	return nil
}

// envelopeOOM reports whether the sandbox's VMM or sentry has been ended
// by the host at its envelope's memory limit, and that limit: the kernel
// counted an OOM kill in it, or its memory reached the limit (v1 counts a
// kill only in the victim's own cgroup, which runsc removes on its way
// out).
func (s *shim) envelopeOOM() (int64, bool) {
	if s.envelope == nil {
		return 0, false
	}
	st, err := s.envelope.Stats()
	if err != nil {
		s.log.Warn("host cgroup stats", "err", err)
		return 0, false
	}
	return int64(st.MemoryMaxBytes), st.OOMKills > 0 || (st.MemoryMaxBytes > 0 && st.MemoryPeakBytes >= st.MemoryMaxBytes)
}

// leaveEnvelope moves the shim out of its envelope and removes it, once
// the VMM is gone.
func (s *shim) leaveEnvelope() {
	if s.envelope == nil {
		return
	}
	if err := s.envelope.Leave(); err != nil {
		s.log.Warn("host cgroup left behind", "err", err)
	}
}

// Run is the shim's whole life. It returns when the sandbox is gone.
func Run(ctx context.Context, cfg Config) (err error) {
	if err := statedir.ValidateID(cfg.ID); err != nil {
		return err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	clk := clock.Or(cfg.Clock)
	s := &shim{cfg: cfg, clk: clk, l: statedir.Layout{Root: cfg.StateDir}, log: cfg.Log.With("sandbox_id", cfg.ID), stopReq: make(chan struct{}), pauseReq: make(chan pauseReq), snapReq: make(chan snapReq), refreshReq: make(chan struct{}, 1)}
	s.act.clk = clk
	ready := func(msg string) {
		if cfg.Ready != nil {
			_, _ = io.WriteString(cfg.Ready, msg+"\n")
			_ = cfg.Ready.Close()
			cfg.Ready = nil
		}
	}
	defer func() {
		if err != nil {
			ready("error: " + oneLine(err.Error()))
		}
	}()

	lock, err := shimLock(s.l.ShimLock(cfg.ID), cfg.Lock)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", cfg.ID, err)
	}
	defer lock.Close()
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)

	s.st, err = store.Open(ctx, s.l.Catalog())
	if err != nil {
		return err
	}
	defer s.st.Close()
	sb, err := s.st.GetSandbox(ctx, cfg.ID)
	if err != nil {
		return err
	}
	// Holding the lock, this shim owns the row's generation: whoever
	// claimed it (create, resume) held the lock since and handed it over.
	if sb.State != store.StateCreating && sb.State != store.StateResuming {
		return fmt.Errorf("sandbox %s is %s, not creating or resuming", cfg.ID, sb.State)
	}
	s.gen = sb.Gen

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)

	s.env = sb.Env
	s.defEnv = newDefaultEnv(sb.Env)
	s.own = newOwner(sb.Tenant, sb.Env)
	defer s.leaveEnvelope()
	err = s.enterEnvelope(sb)
	if err == nil {
		err = s.start(ctx, sb)
	}
	if err != nil {
		bg := context.WithoutCancel(ctx)
		if sb.State == store.StateResuming {
			// The saved state and disk stay: the sandbox is still paused,
			// and says why the resume failed.
			err = fmt.Errorf("resume: %w", err)
			s.teardownPaused(bg)
			_, _ = s.st.Transition(bg, cfg.ID, store.Change{To: store.StatePaused, Gen: s.gen, Reason: oneLine("last resume failed: " + err.Error())})
			return err
		}
		err = fmt.Errorf("start: %w", err)
		s.fail(bg, err.Error())
		s.teardown(bg, false)
		return err
	}
	s.act.touch()
	ready("ok")
	s.log.Info("sandbox running")
	if s.tmpl != nil {
		// A spare overlay for the next create, out of this one's latency
		// path; the shim waits for it before it exits.
		spareCtx, cancelSpare := context.WithCancel(context.WithoutCancel(ctx))
		var spare sync.WaitGroup
		spare.Go(func() {
			after := clk.NewTimer(time.Second)
			defer after.Stop()
			select {
			case <-after.C():
				s.tmpl.MakeSpare(spareCtx)
			case <-spareCtx.Done():
			}
		})
		defer spare.Wait()
		defer cancelSpare()
	}

	exited := make(chan runtime.ExitStatus, 1)
	go func() {
		st, _ := s.inst.Wait(context.Background())
		exited <- st
	}()
	// The lifetime follows the row's expires_at, which the control plane
	// moves (store.SetExpiry) and then asks for a Refresh; lifetimePoll is
	// the backstop for a Refresh that never came.
	expiresAt := sb.ExpiresAt
	if sb.State == store.StateResuming {
		// The lifetime counts running time only: what was left at pause.
		expiresAt = clk.Now().Add(sb.LifetimeLeft)
	}
	expiry := clk.NewTimer(expiresAt.Sub(clk.Now()))
	defer expiry.Stop()
	poll := clk.NewTicker(lifetimePoll)
	defer poll.Stop()
	// The idle check sleeps until the sandbox could have been idle for
	// its idle pause, then looks again: nothing wakes an idle shim
	// before that.
	idlePause := sb.IdlePause
	var idleC <-chan time.Time
	var idle clock.Timer
	setIdle := func() {
		switch {
		case idlePause > 0 && idle == nil:
			idle = clk.NewTimer(idlePause)
			idleC = idle.C()
		case idlePause > 0:
			idle.Reset(idlePause)
		case idle != nil:
			idle.Stop()
			idle, idleC = nil, nil
		}
	}
	setIdle()
	defer func() {
		if idle != nil {
			idle.Stop()
		}
	}()
	// refresh re-reads the row: its lifetime, and, for a warm pool's
	// sandbox that a create claimed, its new owner and idle pause.
	refresh := func() {
		at, err := s.st.GetSandbox(ctx, cfg.ID)
		if err != nil {
			return
		}
		if !at.ExpiresAt.Equal(expiresAt) {
			expiresAt = at.ExpiresAt
			s.log.Info("lifetime changed", "expires_at", expiresAt)
			expiry.Reset(expiresAt.Sub(clk.Now()))
		}
		if at.Tenant != s.own.tenant() {
			s.own.setTenant(at.Tenant)
			s.log.Info("owner changed", "tenant", at.Tenant, "source", at.Source)
		}
		if at.IdlePause != idlePause {
			idlePause = at.IdlePause
			s.log.Info("idle pause changed", "idle_pause", idlePause)
			setIdle()
		}
	}

	bg := context.WithoutCancel(ctx)
	for {
		select {
		case st := <-exited:
			reason := "guest stopped unexpectedly: " + st.String()
			if lim, ok := s.envelopeOOM(); ok {
				reason = fmt.Sprintf("out of memory: the host killed the sandbox's VMM at its host memory envelope (%d MiB, from its --memory); %s", lim>>20, st.String())
			}
			s.log.Error("vmm exited", "reason", reason)
			s.fail(bg, reason)
			s.teardown(bg, false)
			return nil
		case <-s.stopReq:
			s.log.Info("stop requested")
			s.teardown(bg, true)
			return nil
		case r := <-s.pauseReq:
			resp, fatal, err := s.pause(bg, r.force, 1)
			r.reply <- loopResult[shimv2.PauseResponse]{resp: resp, err: err}
			if err == nil {
				s.teardownPaused(bg)
				return nil
			}
			if s.pauseFailed(bg, "pause", err, fatal) {
				return nil
			}
		case r := <-s.snapReq:
			resp, fatal, err := s.snapshotLive(bg, r.dir, r.force)
			r.reply <- loopResult[shimv2.SnapshotResponse]{resp: resp, err: err}
			if err != nil && s.pauseFailed(bg, "live snapshot", err, fatal) {
				return nil
			}
		case <-poll.C():
			refresh()
		case <-s.refreshReq:
			refresh()
		case <-idleC:
			if d := s.act.idleFor(clk.Now(), s.busy()); d < idlePause {
				idle.Reset(idlePause - d)
				continue
			}
			idle.Reset(idlePause) // for a skipped or refused pause: another idle period
			if err := s.l.CheckSpace(s.cfg.DiskReserve, "an idle pause", int64(sb.MemoryMiB)<<20); err != nil {
				s.log.Warn("idle pause skipped", "err", err)
				s.event(bg, sb, "sandbox.pause.skipped", map[string]any{"reason": err.Error()})
				s.act.touch() // try again after another idle period
				continue
			}
			s.log.Info("idle; pausing", "idle_pause", idlePause)
			r, fatal, err := s.pause(bg, false, 0)
			if err == nil {
				s.event(bg, sb, "sandbox.pause", map[string]any{"reason": "idle", "idle_pause_s": idlePause.Seconds(), "state_bytes": r.GetStateBytes(), "save_ms": r.GetSaveMs()})
				s.teardownPaused(bg)
				return nil
			}
			if s.pauseFailed(bg, "idle pause", err, fatal) {
				return nil
			}
			s.act.touch() // try again after another idle period
		case <-expiry.C():
			s.log.Info("lifetime timeout reached; removing sandbox")
			s.event(bg, sb, "sandbox.expire", map[string]any{"reason": "its lifetime ended", "expires_at": expiresAt.UTC()})
			s.teardown(bg, true)
			_ = os.RemoveAll(s.l.Dir(cfg.ID))
			_ = s.st.DeleteSandbox(bg, cfg.ID)
			// What only this sandbox held (a fork base) goes with it.
			if _, _, err := template.Collect(bg, s.l, s.st); err != nil {
				s.log.Warn("collect after lifetime end", "err", err)
			}
			return nil
		case sig := <-sigs:
			s.log.Warn("terminated by signal", "signal", sig.String())
			s.fail(bg, "supervisor terminated by "+sig.String())
			s.teardown(bg, false)
			return nil
		}
	}
}

// pauseFailed logs a refused or failed pause; a fatal one fails the
// sandbox and tears it down, and it reports true: the shim is done.
func (s *shim) pauseFailed(ctx context.Context, what string, err error, fatal bool) bool {
	s.log.Warn(what+" refused or failed", "err", err)
	if !fatal {
		return false
	}
	s.fail(ctx, what+" failed: "+err.Error())
	s.teardown(ctx, false)
	return true
}

// lifetimePoll is how often the shim re-reads its sandbox's expires_at
// without being asked to (LifecycleService.Refresh), on Config.Clock. An
// idle shim wakes for nothing else.
const lifetimePoll = 30 * time.Second

func (s *shim) fail(ctx context.Context, reason string) {
	sb, err := s.st.Transition(ctx, s.cfg.ID, store.Change{To: store.StateFailed, Gen: s.gen, Reason: oneLine(reason)})
	if err != nil {
		s.log.Error("record failure", "err", err)
		return
	}
	detail := map[string]any{"reason": sb.Reason}
	if strings.HasPrefix(reason, "out of memory") {
		detail["oom_killed"] = true
	}
	s.event(ctx, sb, "sandbox.fail", detail)
}

// event records an action the shim took on its own (no API key) in the
// audit trail, under the sandbox's tenant.
func (s *shim) event(ctx context.Context, sb store.Sandbox, action string, detail map[string]any) {
	if _, err := s.st.AppendEvent(context.WithoutCancel(ctx), store.Event{Tenant: s.own.tenant(), SandboxID: sb.ID, Action: action, Detail: detail}); err != nil {
		s.log.Error("audit", "action", action, "err", err)
	}
}

func (s *shim) start(ctx context.Context, sb store.Sandbox) (err error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Millisecond)) }
	defer func() { s.log.Info("start phases", phases...) }()
	bc, err := s.l.LoadBootConfig()
	if err != nil {
		return err
	}
	s.boot = bc
	caps, err := s.cfg.Runtime.Probe(ctx)
	if err != nil {
		return fmt.Errorf("probe runtime: %w", err)
	}
	s.accel = caps.Accel
	imgPath := s.l.ImagePath(sb.ImageDigest)
	if _, err := os.Stat(imgPath); err != nil {
		return fmt.Errorf("image %q is missing its file (rebuild or re-import it): %w", sb.Image, err)
	}
	spec := runtime.Spec{
		ID:             sb.ID,
		CPUs:           sb.CPUs,
		MemoryMiB:      sb.MemoryMiB,
		Kernel:         bc.Kernel,
		Initrd:         bc.Initrd,
		RootDisk:       s.l.RootDisk(sb.ID),
		RootDiskFormat: "qcow2",
		RunDir:         s.l.RunDir(sb.ID),
		Network:        true,
		ProcAudit:      !s.cfg.NoProcAudit,
	}
	if s.envelope != nil {
		spec.HostCgroup = s.envelope.Path()
	}
	if spec.Mounts, err = s.specMounts(sb); err != nil {
		return err
	}
	if s.cfg.RootDir == nil && slices.ContainsFunc(spec.Mounts, func(m runtime.Mount) bool { return m.Dir != "" }) {
		s.noSave = "a microVM with a host directory mounted cannot be paused (virtio-fs has no migration); remove it instead, or use a volume"
	}
	mode := "cold"
	fi, err := os.Stat(imgPath)
	if err != nil {
		return err
	}
	tmplDisk := template.DiskMiB(fi.Size())
	var verify func() error
	defer func() {
		// A restore of a corrupt state may fail before its digest check
		// ends: the check says why.
		if err != nil && verify != nil {
			if verr := verify(); verr != nil {
				err = verr
			}
		}
	}()
	fromSnap, err := template.OriginSnapshot(ctx, s.st, sb.ID)
	if err != nil {
		return err
	}
	if s.cfg.RootDir != nil {
		if s.cfg.BuildRoot != "" {
			spec.RootDisk, spec.RootInPlace = s.cfg.BuildRoot, true
		} else if spec.RootDisk, err = s.cfg.RootDir(ctx, sb); err != nil {
			return fmt.Errorf("image root: %w", err)
		}
		spec.WritableBytes = int64(sb.DiskMiB) << 20
		mode = s.cfg.Runtime.Name()
		mark("rootfs")
		switch {
		case sb.State == store.StateResuming:
			// The image's tree again; memory and the writes to the root
			// come from the saved state.
			if verify, err = s.resumeSpec(&spec); err != nil {
				return err
			}
			mode = "resume"
			mark("check")
		case fromSnap != "":
			// A fork or a sandbox from a snapshot: its state, restored as
			// it was saved (the size is the snapshot's).
			if verify, err = s.snapshotSpec(&spec, fromSnap); err != nil {
				return err
			}
			mode = "snapshot"
			mark("check")
		}
	} else if sb.State == store.StateResuming {
		// Resume: the paused disk stays the root disk; RAM and devices
		// come from the saved state.
		if verify, err = s.resumeSpec(&spec); err != nil {
			return err
		}
		mode = "resume"
		mark("check")
	} else if fromSnap != "" || (caps.Snapshots && sb.DiskMiB >= tmplDisk && len(spec.Mounts) == 0) {
		// (A sandbox with mounts has devices its template lacks: cold boot.)
		// A disk smaller than the template's cannot be a clone of it: cold boot.
		key := template.Key{
			ImageDigest: sb.ImageDigest, ImagePath: imgPath, Kernel: bc.Kernel, Initrd: bc.Initrd,
			CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: tmplDisk, Runtime: s.cfg.Runtime.Name(), Accel: caps.Accel, VMM: caps.VMMVersion,
		}
		var t template.Template
		if fromSnap != "" {
			// A fork or a sandbox from a snapshot: clone the snapshot's own
			// template, whose disk has the snapshot's size.
			key.DiskMiB = sb.DiskMiB
			t, err = template.EnsureSnapshot(ctx, s.l, s.cfg.Runtime, fromSnap, key, s.log)
			if err == nil {
				bc.Kernel, bc.Initrd = t.Key.Kernel, t.Key.Initrd
				spec.Kernel, spec.Initrd = bc.Kernel, bc.Initrd
				s.boot = bc
				tmplDisk = sb.DiskMiB
			}
		} else {
			t, err = template.Ensure(ctx, s.l, s.cfg.Runtime, key, s.log)
		}
		if err != nil {
			return err
		}
		// Same size as the template's disk: the restored guest's virtio-blk
		// state carries that size; the disk grows after the restore.
		if err := t.TakeOverlay(ctx, spec.RootDisk); err != nil {
			return err
		}
		s.tmpl = &t
		// The sandbox's disk is backed by the template's: a disk
		// reference keeps it (sandbox/collect.go).
		if err := s.st.AddRefs(ctx, store.SandboxObj(sb.ID), store.RoleDisk, store.TemplateObj(filepath.Base(t.Dir))); err != nil {
			return err
		}
		// Map the template's RAM from its holder, shared with every other
		// clone, rather than from a private copy in this process.
		if sharer, ok := s.cfg.Runtime.(ramSharer); ok && s.cfg.Exe != "" {
			if f, err := template.SharedRAM(ctx, s.l, t, s.cfg.Exe); err != nil {
				s.log.Warn("shared template RAM unavailable; using a private copy", "err", err)
			} else {
				err := sharer.UseSnapshotRAM(t.Snapshot, f)
				f.Close()
				if err != nil {
					s.log.Warn("shared template RAM rejected; using a private copy", "err", err)
				}
			}
		}
		spec.RestoreFrom = t.Snapshot
		mode = "template"
		mark("overlay")
	} else if err := statedir.CreateOverlay(ctx, spec.RootDisk, imgPath, "raw", sb.DiskMiB); err != nil {
		return err
	}
	if err := os.MkdirAll(spec.RunDir, 0o755); err != nil {
		return err
	}
	inst, err := s.cfg.Runtime.Create(ctx, spec)
	if err != nil {
		return err
	}
	s.inst = inst
	if err := inst.Start(ctx); err != nil {
		return err
	}
	mark("vmm")
	s.net, err = s.startNetwork(ctx, sb, inst)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	conn, err := inst.AgentConn(ctx)
	if err != nil {
		return err
	}
	bootCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	s.agent, err = template.DialAgent(bootCtx, inst, conn)
	if err != nil {
		return err
	}
	mark("agent")
	diskBytes := uint64(sb.DiskMiB) << 20
	if mode == "resume" || s.cfg.RootDir != nil {
		diskBytes = 0 // paused with its size, or a directory root (no disk)
	} else if mode == "template" && sb.DiskMiB == tmplDisk {
		diskBytes = 0 // the template's filesystem already fills this size
	} else if mode == "template" {
		r, ok := inst.(runtime.DiskResizer)
		if !ok {
			return errors.New("runtime cannot resize a restored disk")
		}
		if err := r.ResizeRootDisk(bootCtx, int64(diskBytes)); err != nil {
			return err
		}
	}
	mark("resize")
	hostname := "airlock"
	if mode == "template" || mode == "resume" {
		hostname = "" // set in the template already; rewriting it costs a disk write
	}
	var vols []*agentv1.VolumeMount
	if mode != "resume" && mode != "template" {
		// After a resume they are mounted already (in the guest's RAM).
		for i, m := range spec.Mounts {
			v := &agentv1.VolumeMount{Path: m.Target, ReadOnly: m.ReadOnly}
			if ms, ok := inst.(runtime.MountStager); ok {
				v.Staged = ms.StagedMountPath(i)
			} else if gm, ok := inst.(runtime.GuestMounter); ok && gm.GuestMountsVolumes() && m.Dir != "" {
				v.Tag = runtime.MountTag(i)
			} else if gm, ok := inst.(runtime.GuestMounter); ok && gm.GuestMountsVolumes() {
				v.Serial = runtime.MountSerial(i)
			} else {
				continue // the runtime mounted it at its target
			}
			vols = append(vols, v)
		}
	}
	if _, err := s.agent.SyncWith(bootCtx, agentapi.SyncOptions{Hostname: hostname, DiskBytes: diskBytes, Network: s.net.guestConfig(), Volumes: vols}); err != nil {
		return err
	}
	mark("sync")
	if !s.cfg.NoProcAudit {
		s.proc = startProcAudit(s.agent, s.inst, s.st, sb.ID, s.own, s.log, s.clk)
		mark("audit")
	}
	if verify != nil {
		if err := verify(); err != nil {
			return err
		}
		mark("verified")
	}
	if mode == "resume" {
		if err := s.st.SetExpiry(ctx, sb.ID, s.clk.Now().Add(sb.LifetimeLeft)); err != nil {
			return err
		}
	}
	if mode != "resume" {
		if err := s.st.SetRuntimeInfo(ctx, sb.ID, caps.Accel, guest.Text(s.agent.Info.GetKernelRelease(), 128), mode); err != nil {
			return err
		}
	}
	if err := s.serve(); err != nil {
		return err
	}
	if fromSnap != "" {
		// The execs parked in the snapshot's memory, as its pause saved
		// them (none for a snapshot older than parking).
		if s.savedExecs, err = readSavedExecs(s.l.SnapshotDir(fromSnap)); err != nil {
			s.log.Warn("the snapshot's saved execs are unreadable", "err", err)
		}
	}
	if s.savedExecs != nil || fromSnap != "" {
		// Execs a pause parked go on (a fork's too: parked in its
		// snapshot's memory).
		s.execs.restore(bootCtx, s.savedExecs, fromSnap != "", sb.Tenant)
		mark("adopt")
	}
	if _, err := s.st.Transition(ctx, sb.ID, store.Change{To: store.StateRunning, Gen: s.gen}); err != nil {
		return fmt.Errorf("mark running: %w", err)
	}
	mark("ready")
	if mode == "resume" {
		// The guest runs from RAM now; its saved state is no longer needed
		// (deleting ~100 MB takes a while: not on the resume's path).
		go func() { _ = os.RemoveAll(s.l.PauseDir(sb.ID)) }()
	}
	return nil
}

// serve listens on shim.sock and serves the shim's services.
func (s *shim) serve() error {
	sock := s.l.Socket(s.cfg.ID)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen %s: %w", filepath.Base(sock), err)
	}
	_ = os.Chmod(sock, 0o600)
	env := s.defEnv
	mux := http.NewServeMux()
	// The shim's own contract (proto/airlock/shim/v2), mapped to the guest
	// protocol inside.
	mux.Handle(shimv2connect.NewFileServiceHandler(fileService{agent: s.agent}))
	s.contexts = &contextRelay{agent: s.agent, env: env, clk: s.clk, grace: timeoutGrace}
	mux.Handle(shimv2connect.NewContextServiceHandler(s.contexts))
	mux.Handle(shimv2connect.NewLifecycleServiceHandler(lifecycleService{s: s, since: s.clk.Now()}))
	mux.Handle(shimv2connect.NewNetworkServiceHandler(networkService{s: s}))
	s.execs = newSessions(s.agent, s.st, s.cfg.ID, env, s.log, s.clk)
	if c, ok := s.inst.(runtime.HostOOMCounter); ok {
		s.execs.hostOOM = c.HostOOMKills
	}
	if s.cfg.serving != nil {
		s.cfg.serving(s)
	}
	mux.Handle(shimv2connect.NewExecServiceHandler(execService{t: s.execs, log: s.log}, connect.WithReadMaxBytes(maxInputMessage)))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	s.srv = &http.Server{Handler: s.act.track(mux), Protocols: &p, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("shim socket", "err", err)
		}
	}()
	return nil
}

// teardownPaused ends a sandbox that was just paused: its VMM has exited;
// the root disk and the saved state stay for the resume.
func (s *shim) teardownPaused(ctx context.Context) {
	s.proc.close()
	s.stopServing(ctx)
	if s.net != nil {
		s.net.close()
	}
	s.endVMM(ctx)
}

// stopServing lets replies in flight (the request that asked for the end)
// finish, then cuts the rest off and removes the socket.
func (s *shim) stopServing(ctx context.Context) {
	if s.srv == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	_ = s.srv.Shutdown(sctx)
	cancel()
	_ = s.srv.Close()
	_ = os.Remove(s.l.Socket(s.cfg.ID))
}

// endVMM kills the VMM and waits for it to be gone.
func (s *shim) endVMM(ctx context.Context) {
	if s.inst == nil {
		return
	}
	_ = s.inst.Kill()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if _, err := s.inst.Wait(wctx); err != nil {
		s.log.Error("vmm did not exit", "err", err)
	}
	cancel()
}

// teardown ends the guest and frees everything but the logs. The guest is
// killed, not shut down: its disk is discarded right after, so there is
// nothing to flush (a clean power-off cost ~150 ms per rm); a guest with a
// writable volume or host mount is powered off first (flushGuest), since
// those outlive it. removing marks the sandbox stopping first (rm,
// lifetime).
func (s *shim) teardown(ctx context.Context, removing bool) {
	if removing {
		_, _ = s.st.Transition(ctx, s.cfg.ID, store.Change{To: store.StateStopping, From: store.StateRunning, Gen: s.gen})
	}
	if s.execs != nil {
		// Owned execs end first, so their exits reach attachers and the
		// audit trail while the socket and the catalog still work.
		s.execs.Close()
	}
	s.stopServing(ctx)
	s.proc.close()
	s.flushGuest(ctx)
	if s.agent != nil {
		_ = s.agent.Close()
	}
	if s.net != nil {
		s.net.close()
	}
	s.endVMM(ctx)
	_ = os.Remove(s.l.RootDisk(s.cfg.ID))
	// Keep console.log; drop anything else the runtime left (memory
	// files). Mounts the runtime left are taken off first: removing never
	// reaches into a volume or a host directory.
	run := s.l.RunDir(s.cfg.ID)
	if entries, err := os.ReadDir(run); err == nil {
		for _, e := range entries {
			if e.Name() != "console.log" {
				if err := statedir.RemoveAllNoMounts(filepath.Join(run, e.Name())); err != nil {
					s.log.Error("clean up the run dir", "err", err)
				}
			}
		}
	}
}

// flushGuest powers the guest off through its agent when it has a
// writable mount, so that what it wrote there (its page cache, the
// journal) reaches the volume or host directory; bounded, the VMM is
// killed after it either way.
func (s *shim) flushGuest(ctx context.Context) {
	if s.agent == nil || s.inst == nil {
		return
	}
	sb, err := s.st.GetSandbox(ctx, s.cfg.ID)
	if err != nil || !slices.ContainsFunc(sb.Mounts, func(m store.Mount) bool { return !m.ReadOnly }) {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guestFlushTimeout)
	defer cancel()
	if _, err := s.agent.Agent.Shutdown(sctx, connect.NewRequest(&agentv1.ShutdownRequest{})); err != nil {
		s.log.Warn("power off for the volumes failed; killing the guest", "err", err)
		return
	}
	if _, err := s.inst.Wait(sctx); err != nil {
		s.log.Warn("the guest did not power off in time; killing it", "err", err)
	}
}

// guestFlushTimeout bounds flushGuest.
const guestFlushTimeout = 15 * time.Second

// shimLock returns the sandbox's shim lock at path, locked: inherited if
// it is that file and this process's lock on it holds (a lock taken on the
// same open file description is re-taken at once), else taken here. The
// inherited descriptor is made close-on-exec: the VMM and the other
// processes the shim starts must not keep the lock after the shim exits.
func shimLock(path string, inherited *os.File) (*os.File, error) {
	if inherited != nil {
		var a, b unix.Stat_t
		if unix.Fstat(int(inherited.Fd()), &a) == nil && unix.Stat(path, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino &&
			unix.Flock(int(inherited.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			unix.CloseOnExec(int(inherited.Fd()))
			return inherited, nil
		}
		_ = inherited.Close()
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shim lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, errors.New("another shim runs it")
	}
	return f, nil
}

func oneLine(s string) string {
	for i, r := range s {
		if r == '\n' || r == '\r' {
			s = s[:i]
			break
		}
	}
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// specMounts turns the sandbox's mounts into the runtime's: a volume's
// image by its id in the state dir, a host directory as resolved at
// create.
func (s *shim) specMounts(sb store.Sandbox) ([]runtime.Mount, error) {
	var out []runtime.Mount
	for _, m := range sb.Mounts {
		rm := runtime.Mount{Target: m.Path, ReadOnly: m.ReadOnly}
		if m.VolumeID != "" {
			if err := statedir.ValidateVolumeID(m.VolumeID); err != nil {
				return nil, err
			}
			rm.Image = s.l.VolumeImage(m.VolumeID)
		} else {
			rm.Dir = m.HostPath
		}
		out = append(out, rm)
	}
	return out, nil
}
