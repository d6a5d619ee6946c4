package api

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fake is an in-memory manager: sandboxes, files and exec sessions that
// echo their stdin/argv.
type fake struct {
	mu      sync.Mutex
	n       int
	sbs     map[string]store.Sandbox
	files   map[string][]byte // id + path
	starts  []fakeStart
	actors  []sandbox.Actor
	stdin   map[string][]byte
	created []sandbox.CreateOptions
	ctxReqs []guest.ContextSpec
	runs    []guest.CodeRequest
	// guest, if set, accepts the conns DialPort returns (an in-test HTTP
	// server on the other end of a pipe); dials records every DialPort.
	guest *memListener
	dials []string
	peers []string // the caller's Peer of every DialPort
	// pauses and touches record Pause (that did pause) and Touch calls.
	pauses, touches []string
	// snaps are the snapshots by tenant + "/" + name; forks records Fork
	// counts; pruned counts PruneSnapshots calls.
	snaps  map[string]store.Snapshot
	forks  []int
	pruned int
	// Like the manager, the fake decides for the caller: what it sees
	// (Caller.Sees), its quota (sandbox.Quotas) and the audit trail (ev).
	quota sandbox.Quotas
	ev    Events
}

// audit writes an event as the manager does: c's tenant, key and via.
func (f *fake) audit(c sandbox.Caller, id, action string, detail map[string]any) {
	if f.ev == nil {
		return
	}
	if detail == nil {
		detail = map[string]any{}
	}
	detail["via"] = c.Via
	_, _ = f.ev.AppendEvent(context.Background(), store.Event{Tenant: c.Tenant, KeyID: c.KeyID, SandboxID: id, Action: action, Detail: detail})
}

func (f *fake) auditCreate(c sandbox.Caller, sb store.Sandbox) {
	d := map[string]any{"image": sb.Image, "cpus": sb.CPUs, "memory_mb": sb.MemoryMiB, "disk_mb": sb.DiskMiB,
		"network": sandbox.NetworkAudit(sb.Network), "idle_pause_s": int64(sb.IdlePause / time.Second)}
	if sb.Source != "" {
		d["source"] = sb.Source
	}
	f.audit(c, sb.ID, "sandbox.create", d)
}

// lookup is the manager's: another tenant's sandbox is not found.
func (f *fake) lookup(c sandbox.Caller, id string) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok || !c.Sees(sb) {
		return store.Sandbox{}, fmt.Errorf("%w: %w", errdefs.ErrNotFound, sandbox.ErrNoSandbox)
	}
	return sb, nil
}

// reserve checks the quota of owner with c's limits, like the manager.
func (f *fake) reserve(c sandbox.Caller, owner string, n, cpus, mem, disk int) (func(), error) {
	f.mu.Lock()
	live := make([]store.Sandbox, 0, len(f.sbs))
	for _, sb := range f.sbs {
		live = append(live, sb)
	}
	f.mu.Unlock()
	return f.quota.Reserve(c, owner, live, 0, n, cpus, mem, disk)
}

// newFakeOnCatalog is a fake whose audit trail is a new catalog, which it
// returns too (for keys and events).
func newFakeOnCatalog(t *testing.T) (*fake, *store.Store) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := newFake()
	f.ev = st
	return f, st
}

func newFake() *fake {
	return &fake{sbs: map[string]store.Sandbox{}, files: map[string][]byte{}, stdin: map[string][]byte{}, snaps: map[string]store.Snapshot{}}
}

func (f *fake) add(id, tenant string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sbs[id] = store.Sandbox{ID: id, Tenant: tenant, Runtime: "qemu", State: store.StateRunning, CPUs: 1, MemoryMiB: 512, DiskMiB: 2048,
		Env: map[string]string{"A": "sandbox", "B": "sandbox"}}
}

func (f *fake) Create(_ context.Context, c sandbox.Caller, o sandbox.CreateOptions) (store.Sandbox, error) {
	o.Tenant = c.Tenant
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
	}
	release, err := f.reserve(c, c.Tenant, 1, o.CPUs, o.MemoryMiB, cmp.Or(o.DiskMiB, 2048))
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	sb, err := f.create(o)
	if err == nil {
		f.auditCreate(c, sb)
	}
	return sb, err
}

func (f *fake) create(o sandbox.CreateOptions) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	id := fmt.Sprintf("sbx%09d", f.n)
	// Like the manager: the catalog keeps the normalised spec, never values.
	spec, err := o.Network.Normalize(o.Secrets)
	if err != nil {
		return store.Sandbox{}, err
	}
	sb := store.Sandbox{ID: id, Tenant: o.Tenant, Runtime: "qemu", State: store.StateRunning, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, Env: o.Env, Metadata: o.Metadata, Image: "base", Network: spec}
	f.sbs[id] = sb
	f.created = append(f.created, o)
	return sb, nil
}

func (f *fake) Get(_ context.Context, c sandbox.Caller, id string) (store.Sandbox, error) {
	return f.lookup(c, id)
}

func (f *fake) List(_ context.Context, c sandbox.Caller) ([]store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Sandbox
	for _, sb := range f.sbs {
		if c.Sees(sb) {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (f *fake) Remove(_ context.Context, c sandbox.Caller, id string) error {
	if _, err := f.lookup(c, id); err != nil {
		return err
	}
	f.mu.Lock()
	delete(f.sbs, id)
	f.mu.Unlock()
	f.audit(c, id, "sandbox.delete", nil)
	return nil
}

func (f *fake) SetTimeout(_ context.Context, c sandbox.Caller, id string, d time.Duration) error {
	if _, err := f.lookup(c, id); err != nil {
		return err
	}
	f.mu.Lock()
	sb := f.sbs[id]
	sb.ExpiresAt = time.Now().Add(d)
	f.sbs[id] = sb
	f.mu.Unlock()
	f.audit(c, id, "sandbox.timeout", map[string]any{"timeout_s": int(d / time.Second)})
	return nil
}

// SetNetwork validates and floor-checks like the manager (with its own
// functions), stores the policy and audits the change.
func (f *fake) SetNetwork(_ context.Context, c sandbox.Caller, id string, p sandbox.EgressPolicy) (sandbox.NetworkChange, error) {
	sb, err := f.lookup(c, id)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	next, err := sb.Network.WithEgress(p.Mode, p.Allow)
	if err != nil {
		return sandbox.NetworkChange{}, err
	}
	if !c.Admin {
		if err := sandbox.CheckFloor(next); err != nil {
			return sandbox.NetworkChange{}, err
		}
	}
	f.mu.Lock()
	sb.Network = next
	f.sbs[id] = sb
	f.mu.Unlock()
	f.audit(c, id, "sandbox.network", map[string]any{"new": sandbox.PolicyAudit(next)})
	return sandbox.NetworkChange{Network: next, Applied: "running"}, nil
}

// Pause refuses a sandbox with a running exec ("busy" metadata) unless
// force, like the manager; pausing twice is a no-op (audited all the
// same).
func (f *fake) Pause(_ context.Context, c sandbox.Caller, id string, force bool) (sandbox.PauseResult, error) {
	was, err := f.lookup(c, id)
	if err != nil {
		return sandbox.PauseResult{}, err
	}
	res, err := f.pause(id, force)
	if err == nil {
		f.audit(c, id, "sandbox.pause", map[string]any{"force": force, "was": string(was.State),
			"state_bytes": res.StateBytes, "save_ms": res.Save.Milliseconds()})
	}
	return res, err
}

func (f *fake) pause(id string, force bool) (sandbox.PauseResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	switch {
	case !ok:
		return sandbox.PauseResult{}, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, id)
	case sb.State == store.StatePaused:
		return sandbox.PauseResult{}, nil
	case sb.State != store.StateRunning:
		return sandbox.PauseResult{}, fmt.Errorf("%w: sandbox %s is %s", errdefs.ErrFailedPrecondition, id, sb.State)
	case sb.Metadata["busy"] != "" && !force:
		return sandbox.PauseResult{}, fmt.Errorf("%w: sandbox %s has running commands; pause with force to end them", errdefs.ErrFailedPrecondition, id)
	}
	sb.State, sb.PausedAt, sb.LifetimeLeft = store.StatePaused, time.Now(), 10*time.Minute
	f.sbs[id] = sb
	f.pauses = append(f.pauses, id)
	return sandbox.PauseResult{StateBytes: 123 << 20, Save: 800 * time.Millisecond}, nil
}

func (f *fake) Resume(_ context.Context, c sandbox.Caller, id string) (store.Sandbox, error) {
	was, err := f.lookup(c, id)
	if err != nil {
		return was, err
	}
	f.mu.Lock()
	sb := f.sbs[id]
	if sb.State == store.StatePaused {
		sb.State, sb.ExpiresAt, sb.LifetimeLeft = store.StateRunning, time.Now().Add(sb.LifetimeLeft), 0
		f.sbs[id] = sb
	}
	f.mu.Unlock()
	f.audit(c, id, "sandbox.resume", map[string]any{"was": string(was.State), "duration_ms": 0})
	return sb, nil
}

func (f *fake) Usage(context.Context, sandbox.Caller, string) (guest.Usage, error) {
	return guest.Usage{}, errors.New("not used by the API's routes")
}

func (f *fake) Touch(_ context.Context, c sandbox.Caller, id string) error {
	if _, err := f.lookup(c, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sbs[id]; !ok {
		return fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, id)
	}
	f.touches = append(f.touches, id)
	return nil
}

func (f *fake) WriteFile(_ context.Context, c sandbox.Caller, id, p string, _ uint32, r io.Reader) (int64, error) {
	if _, err := f.lookup(c, id); err != nil {
		return 0, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	f.files[id+p] = b
	f.mu.Unlock()
	f.audit(c, id, "file.write", map[string]any{"path": p, "size": len(b)})
	return int64(len(b)), nil
}

func (f *fake) ReadFile(_ context.Context, c sandbox.Caller, id, p string, w io.Writer, info func(guest.FileInfo)) (int64, error) {
	if _, err := f.lookup(c, id); err != nil {
		return 0, err
	}
	f.mu.Lock()
	b, ok := f.files[id+p]
	f.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: read %s: no such file", errdefs.ErrNotFound, p)
	}
	info(guest.FileInfo{Path: p, Type: guest.FileRegular, Size: uint64(len(b)), Mtime: time.Unix(0, 0)})
	n, err := io.Copy(w, bytes.NewReader(b))
	return n, err
}

func (f *fake) StatFile(_ context.Context, c sandbox.Caller, id, p string) (guest.FileInfo, error) {
	if _, err := f.lookup(c, id); err != nil {
		return guest.FileInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[id+p]
	if !ok {
		return guest.FileInfo{}, fmt.Errorf("%w: stat %s", errdefs.ErrNotFound, p)
	}
	return guest.FileInfo{Path: p, Type: guest.FileRegular, Size: uint64(len(b)), Mtime: time.Unix(0, 0)}, nil
}

func (f *fake) ListFiles(_ context.Context, c sandbox.Caller, id, _ string, _ uint32) (guest.FileList, error) {
	if _, err := f.lookup(c, id); err != nil {
		return guest.FileList{}, err
	}
	return guest.FileList{Entries: []guest.FileInfo{{Path: "/x", Name: "x", Type: guest.FileDirectory, Mtime: time.Unix(0, 0)}}}, nil
}

func (f *fake) Mkdir(_ context.Context, c sandbox.Caller, id, _ string, _ bool) error {
	_, err := f.lookup(c, id)
	return err
}

func (f *fake) Rename(_ context.Context, c sandbox.Caller, id, from, to string) error {
	if _, err := f.lookup(c, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[id+from]
	if !ok {
		return fmt.Errorf("%w: rename %s: no such file", errdefs.ErrNotFound, from)
	}
	delete(f.files, id+from)
	f.files[id+to] = b
	return nil
}

func (f *fake) WatchDir(context.Context, sandbox.Caller, string, string, bool, func(), func(guest.FileEvent) error) error {
	return errors.New("not used by the API's routes")
}

func (f *fake) RemoveFile(_ context.Context, c sandbox.Caller, id, p string, _ bool) error {
	if _, err := f.lookup(c, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.files, id+p)
	return nil
}

const fakeExecID = "aaaaaaaaaaaaaaaa"

// fakeStart is what reached the fake's "shim" for an exec: the env merged
// as the shim merges it (the sandbox's under the request's).
type fakeStart struct {
	Argv  []string
	Env   []string
	Stdin bool
}

func (f *fake) Exec(_ context.Context, c sandbox.Caller, id string, spec guest.ExecSpec, _ bool) (guest.ExecStream, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	sb, err := f.lookup(c, id)
	if err != nil {
		return nil, err
	}
	env := maps.Clone(sb.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, spec.Env)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, fakeStart{Argv: spec.Argv, Env: guest.ExecSpec{Env: env}.EnvList(), Stdin: spec.Stdin})
	f.actors = append(f.actors, c.Actor())
	return &fakeStream{f: f, info: ExecInfo{ID: fakeExecID, Argv: spec.Argv, PID: 42, State: "running", StartedAt: time.Now()}, output: true}, nil
}

func (f *fake) attach(c sandbox.Caller, id, execID string, output bool) (guest.ExecStream, error) {
	if _, err := f.lookup(c, id); err != nil {
		return nil, err
	}
	if execID != fakeExecID {
		return nil, guest.ErrNoExec
	}
	return &fakeStream{f: f, info: ExecInfo{ID: fakeExecID, Argv: []string{"true"}, PID: 42, State: "running"}, output: output}, nil
}

func (f *fake) AttachExec(_ context.Context, c sandbox.Caller, id, execID string, _ bool) (guest.ExecStream, error) {
	return f.attach(c, id, execID, true)
}

func (f *fake) ExecControl(_ context.Context, c sandbox.Caller, id, execID string) (guest.ExecStream, error) {
	return f.attach(c, id, execID, false)
}

// fakeStream replays: stdout "out\xff" (not UTF-8), stderr (the stdin
// written so far), exit 3.
type fakeStream struct {
	f      *fake
	info   ExecInfo
	output bool
	evs    []guest.ExecEvent
	begun  bool
}

func (s *fakeStream) Info() guest.ExecInfo { return s.info }

func (s *fakeStream) Recv() (guest.ExecEvent, error) {
	if !s.output {
		return guest.ExecEvent{}, io.EOF
	}
	if !s.begun {
		s.begun = true
		s.f.mu.Lock()
		in := s.f.stdin[s.info.ID]
		s.f.mu.Unlock()
		s.evs = []guest.ExecEvent{
			{Kind: guest.ExecStdout, Data: []byte("out\xff")},
			{Kind: guest.ExecStderr, Data: in},
			{Kind: guest.ExecExited, Exit: &guest.ExitStatus{Code: 3, Duration: 5 * time.Millisecond}},
		}
	}
	if len(s.evs) == 0 {
		return guest.ExecEvent{}, io.EOF
	}
	ev := s.evs[0]
	s.evs = s.evs[1:]
	return ev, nil
}

func (s *fakeStream) Stdin(data []byte) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.stdin[s.info.ID] = append(s.f.stdin[s.info.ID], data...)
	return nil
}

func (s *fakeStream) CloseStdin() error           { return nil }
func (s *fakeStream) Resize(guest.TermSize) error { return nil }
func (s *fakeStream) Signal(sig int) error        { return nil }
func (s *fakeStream) Finish() error               { return nil }
func (s *fakeStream) Close()                      {}

func (f *fake) ListExecs(_ context.Context, c sandbox.Caller, id string) ([]ExecInfo, error) {
	if _, err := f.lookup(c, id); err != nil {
		return nil, err
	}
	return []ExecInfo{{ID: fakeExecID, Argv: []string{"true"}, State: "running"}}, nil
}

func (f *fake) GetExec(_ context.Context, c sandbox.Caller, id, execID string) (ExecInfo, error) {
	if _, err := f.lookup(c, id); err != nil {
		return ExecInfo{}, err
	}
	if execID != fakeExecID {
		return ExecInfo{}, guest.ErrNoExec
	}
	return ExecInfo{ID: fakeExecID, Argv: []string{"true"}, State: "running"}, nil
}

// serveGuest makes h the fake guest's server: DialPort connects to it
// over in-memory conns. It stops with the test.
func (f *fake) serveGuest(t *testing.T, h http.Handler) {
	g := httptest.NewUnstartedServer(h)
	l := newMemListener()
	g.Listener = l
	g.Start()
	t.Cleanup(g.Close)
	f.mu.Lock()
	f.guest = l
	f.mu.Unlock()
}

// DialPort hands the guest server one end of a pipe. Port 9 has nothing
// listening (ErrUnavailable), as has every port without a guest server.
func (f *fake) DialPort(ctx context.Context, caller sandbox.Caller, id string, port uint16) (net.Conn, error) {
	if _, err := f.lookup(caller, id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.dials = append(f.dials, fmt.Sprintf("%s:%d", id, port))
	f.peers = append(f.peers, caller.Peer)
	g := f.guest
	f.mu.Unlock()
	if g == nil || port == 9 {
		return nil, fmt.Errorf("%w: guest port %d: connection refused", errdefs.ErrUnavailable, port)
	}
	c, err := g.dial(ctx, "", "")
	if err == nil {
		return c, nil
	}
	return nil, fmt.Errorf("%w: guest server closed", errdefs.ErrUnavailable)
}

var (
	_ Sandboxes = (*fake)(nil)
	_ Files     = (*fake)(nil)
	_ Execs     = (*fake)(nil)
	_ Ports     = (*fake)(nil)
)

// --- Contexts: one context "c1"; RunCode replays a fixed run. ---

var fakePNG = []byte("\x89PNG\r\n\x1a\nfake")

func (f *fake) CreateContext(_ context.Context, c sandbox.Caller, sid string, req guest.ContextSpec) (guest.ContextInfo, error) {
	if _, err := f.lookup(c, sid); err != nil {
		return guest.ContextInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctxReqs = append(f.ctxReqs, req)
	id := req.ID
	if id == "" {
		id = "ctx-1"
	}
	lang := req.Language
	if lang == "" {
		lang = "python"
	}
	return guest.ContextInfo{ID: id, Language: lang, Cwd: "/root", State: "idle", CreatedAt: time.Unix(0, 1)}, nil
}

func (f *fake) ListContexts(_ context.Context, c sandbox.Caller, sid string) ([]guest.ContextInfo, error) {
	if _, err := f.lookup(c, sid); err != nil {
		return nil, err
	}
	return []guest.ContextInfo{
		{ID: "c1", Language: "python", Cwd: "/root", State: "idle", IsDefault: true, CreatedAt: time.Unix(0, 0)},
		{ID: "c9", Language: "python", Cwd: "/root", State: "dead", CreatedAt: time.Unix(0, 0), Exit: &guest.ContextExit{Code: -1, Signal: 9, OOMKilled: true}},
	}, nil
}

func (f *fake) checkCtx(id string) error {
	if id != "c1" {
		return fmt.Errorf("%w: no context %q", errdefs.ErrNotFound, id)
	}
	return nil
}

func (f *fake) DeleteContext(_ context.Context, c sandbox.Caller, sid, id string) error {
	if _, err := f.lookup(c, sid); err != nil {
		return err
	}
	return f.checkCtx(id)
}

func (f *fake) RestartContext(_ context.Context, c sandbox.Caller, sid, id string) (guest.ContextInfo, error) {
	if _, err := f.lookup(c, sid); err != nil {
		return guest.ContextInfo{}, err
	}
	if err := f.checkCtx(id); err != nil {
		return guest.ContextInfo{}, err
	}
	return guest.ContextInfo{ID: id, Language: "python", State: "idle", CreatedAt: time.Unix(0, 0)}, nil
}

func (f *fake) InterruptContext(_ context.Context, c sandbox.Caller, sid, id string) error {
	if _, err := f.lookup(c, sid); err != nil {
		return err
	}
	return f.checkCtx(id)
}

// RunCode: code "old" fails as an old agent; otherwise stdout "hi\n",
// stderr "warn\xff", a PNG display result, the main result "42", an error
// if the code is "1/0", and the end.
func (f *fake) RunCode(_ context.Context, c sandbox.Caller, sid string, req guest.CodeRequest, fn func(guest.CodeEvent) error) error {
	if _, err := f.lookup(c, sid); err != nil {
		return err
	}
	f.mu.Lock()
	f.runs = append(f.runs, req)
	f.mu.Unlock()
	if req.ContextID != "" {
		if err := f.checkCtx(req.ContextID); err != nil {
			return err
		}
	}
	if req.Code == "old" {
		return fmt.Errorf("%w: run code: the guest agent is too old", errdefs.ErrUnsupported)
	}
	var evs []guest.CodeEvent
	if req.Code == "cold" {
		evs = append(evs, guest.CodeEvent{Kind: guest.EventStatus, Status: "starting python context"})
	}
	evs = append(evs, []guest.CodeEvent{
		{Kind: guest.EventStdout, Data: []byte("hi\n")},
		{Kind: guest.EventStderr, Data: []byte("warn\xff")},
		{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": fakePNG, "text/plain": []byte("<Figure>")}}},
		{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"text/plain": []byte("42")}, Main: true}},
	}...)
	for _, p := range req.ReturnFiles {
		evs = append(evs, guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": fakePNG}, File: p}})
	}
	if req.Code == "1/0" {
		evs = append(evs, guest.CodeEvent{Kind: guest.EventError, Error: &guest.CodeError{
			Name: "ZeroDivisionError", Value: "division by zero", Traceback: []string{"Traceback", "ZeroDivisionError: division by zero"}}})
	}
	evs = append(evs, guest.CodeEvent{Kind: guest.EventEnd, End: &guest.CodeEnd{
		Duration: 7 * time.Millisecond, ExecutionCount: 3, ContextID: "python-default", TimedOut: req.Code == "while True: pass"}})
	for _, ev := range evs {
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

var _ Contexts = (*fake)(nil)

// Snapshot refuses a sandbox with secrets or, unless force, a "busy" one,
// like the manager; the snapshot belongs to the sandbox's tenant.
func (f *fake) Snapshot(_ context.Context, c sandbox.Caller, id, name string, force bool) (store.Snapshot, error) {
	if _, err := f.lookup(c, id); err != nil {
		return store.Snapshot{}, err
	}
	sn, err := f.snapshot(id, name, force)
	if err == nil {
		f.audit(c, id, "snapshot.create", map[string]any{"name": sn.Name, "snapshot_id": sn.ID, "force": force, "size_bytes": sn.Size, "duration_ms": 0})
	}
	return sn, err
}

func (f *fake) snapshot(id, name string, force bool) (store.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	switch {
	case !ok:
		return store.Snapshot{}, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, id)
	case len(sb.Network.Secrets) > 0:
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s has secrets", errdefs.ErrFailedPrecondition, id)
	case sb.Metadata["busy"] != "" && !force:
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s has running commands", errdefs.ErrFailedPrecondition, id)
	}
	if _, ok := f.snaps[sb.Tenant+"/"+name]; ok {
		return store.Snapshot{}, fmt.Errorf("%w: snapshot %q exists", errdefs.ErrConflict, name)
	}
	sn := store.Snapshot{Tenant: sb.Tenant, Name: name, ID: fmt.Sprintf("snap%012d", len(f.snaps)), SandboxID: id, Image: "base",
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, DiskMiB: sb.DiskMiB, Network: sb.Network, Env: sb.Env, Size: 64 << 20, Created: time.Now()}
	f.snaps[sb.Tenant+"/"+name] = sn
	return sn, nil
}

// CreateFromSnapshot checks the quota and audits like the manager; fork
// bases are not found.
func (f *fake) CreateFromSnapshot(_ context.Context, c sandbox.Caller, name string, o sandbox.CreateOptions) (store.Sandbox, error) {
	o.Tenant = c.Tenant
	f.mu.Lock()
	sn, ok := f.snaps[o.Tenant+"/"+name]
	f.mu.Unlock()
	if !ok || strings.HasPrefix(name, "_fork-") {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	release, err := f.reserve(c, c.Tenant, 1, sn.CPUs, sn.MemoryMiB, sn.DiskMiB)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer release()
	sb, err := f.materialize(name, o)
	if err == nil {
		f.auditCreate(c, sb)
	}
	return sb, err
}

func (f *fake) materialize(name string, o sandbox.CreateOptions) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sn := f.snaps[o.Tenant+"/"+name]
	if (o.CPUs != 0 && o.CPUs != sn.CPUs) || (o.Image != "" && o.Image != sn.Image) {
		return store.Sandbox{}, fmt.Errorf("%w: a sandbox from snapshot %q has its size and image", errdefs.ErrInvalid, name)
	}
	f.n++
	sb := store.Sandbox{ID: fmt.Sprintf("sbx%09d", f.n), Tenant: o.Tenant, Runtime: "qemu", State: store.StateRunning, CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB,
		DiskMiB: sn.DiskMiB, Env: sn.Env, Network: sn.Network, Metadata: o.Metadata, Image: sn.Image, Source: "snapshot:" + name}
	f.sbs[sb.ID] = sb
	f.created = append(f.created, o)
	return sb, nil
}

// Fork fails after two copies when the source's metadata says "fail";
// like the manager, it charges the source's tenant, removes partial
// copies and audits.
func (f *fake) Fork(_ context.Context, c sandbox.Caller, id string, o sandbox.ForkOptions) ([]store.Sandbox, error) {
	count, force := o.Count, o.Force
	src, err := f.lookup(c, id)
	if err != nil {
		return nil, err
	}
	release, err := f.reserve(c, src.Tenant, count, src.CPUs, src.MemoryMiB, src.DiskMiB)
	if err != nil {
		return nil, err
	}
	defer release()
	base := fmt.Sprintf("_fork-%d", len(f.forks))
	if _, err := f.snapshot(id, base, force); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.forks = append(f.forks, count)
	f.mu.Unlock()
	var out []store.Sandbox
	for i := range count {
		if i == 2 && src.Metadata["fail"] != "" {
			err = fmt.Errorf("%w: out of disk", errdefs.ErrResourceExhausted)
		}
		var sb store.Sandbox
		if err == nil {
			sb, err = f.materialize(base, sandbox.CreateOptions{Tenant: src.Tenant, Metadata: src.Metadata})
		}
		if err != nil {
			f.mu.Lock()
			for _, sb := range out {
				delete(f.sbs, sb.ID)
			}
			f.mu.Unlock()
			return nil, err
		}
		f.mu.Lock()
		sb.Source = "fork:" + id
		f.sbs[sb.ID] = sb
		f.mu.Unlock()
		out = append(out, sb)
	}
	ids := make([]string, 0, len(out))
	for _, sb := range out {
		f.auditCreate(c, sb)
		ids = append(ids, sb.ID)
	}
	f.audit(c, id, "sandbox.fork", map[string]any{"count": count, "force": force, "forks": ids})
	return out, nil
}

// snapshotTenant is the manager's: an admin may name a tenant.
func snapshotTenantOf(c sandbox.Caller, tenant string) string {
	if c.Admin && tenant != "" {
		return tenant
	}
	return c.Tenant
}

// RemoveSnapshot refuses while a sandbox made from the snapshot exists.
func (f *fake) RemoveSnapshot(_ context.Context, c sandbox.Caller, tenant, name string) error {
	tenant = snapshotTenantOf(c, tenant)
	f.mu.Lock()
	sn, ok := f.snaps[tenant+"/"+name]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	for _, sb := range f.sbs {
		if sb.Tenant == tenant && sb.Source == "snapshot:"+name {
			f.mu.Unlock()
			return fmt.Errorf("%w: snapshot %q backs the disks of %s", errdefs.ErrFailedPrecondition, name, sb.ID)
		}
	}
	delete(f.snaps, tenant+"/"+name)
	f.mu.Unlock()
	f.audit(c, sn.SandboxID, "snapshot.delete", map[string]any{"name": sn.Name, "snapshot_id": sn.ID, "size_bytes": sn.Size})
	return nil
}

func (f *fake) PruneSnapshots(_ context.Context, c sandbox.Caller) (int64, error) {
	if !c.Admin {
		return 0, sandbox.ErrNeedsAdmin
	}
	f.mu.Lock()
	f.pruned++
	f.mu.Unlock()
	f.audit(c, "", "snapshot.prune", map[string]any{"freed_bytes": 5 << 20})
	return 5 << 20, nil
}

func (f *fake) ListSnapshots(_ context.Context, c sandbox.Caller, tenant string, all bool) ([]store.Snapshot, error) {
	all = all && c.Admin
	tenant = snapshotTenantOf(c, tenant)
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Snapshot
	for _, sn := range f.snaps {
		if all || (sn.Tenant == tenant && !strings.HasPrefix(sn.Name, "_fork-")) {
			out = append(out, sn)
		}
	}
	return out, nil
}

func (f *fake) GetSnapshot(_ context.Context, c sandbox.Caller, tenant, name string) (store.Snapshot, error) {
	tenant = snapshotTenantOf(c, tenant)
	f.mu.Lock()
	defer f.mu.Unlock()
	sn, ok := f.snaps[tenant+"/"+name]
	if !ok {
		return sn, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	return sn, nil
}

func (f *fake) DiskUsage(id string) int64 { return int64(len(id)) << 20 }

// The fake's sandboxes have no browser (sandbox.ErrNoBrowser), and its
// browser ports are its guest ports.
func (f *fake) StartBrowser(_ context.Context, c sandbox.Caller, id string, _ sandbox.BrowserView) (sandbox.BrowserStatus, error) {
	if _, err := f.lookup(c, id); err != nil {
		return sandbox.BrowserStatus{}, err
	}
	return sandbox.BrowserStatus{}, sandbox.ErrNoBrowser
}

func (f *fake) BrowserStatus(ctx context.Context, c sandbox.Caller, id string) (sandbox.BrowserStatus, error) {
	return f.StartBrowser(ctx, c, id, sandbox.ViewBackground)
}

func (f *fake) DialBrowser(ctx context.Context, c sandbox.Caller, id string) (net.Conn, error) {
	return f.DialPort(ctx, c, id, sandbox.BrowserCDPPort)
}

func (f *fake) DialBrowserView(ctx context.Context, c sandbox.Caller, id string, interactive bool) (net.Conn, error) {
	if interactive {
		return f.DialPort(ctx, c, id, sandbox.BrowserInteractivePort)
	}
	return f.DialPort(ctx, c, id, sandbox.BrowserViewPort)
}
