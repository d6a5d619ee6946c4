package mcp

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fake is an in-memory Service: exec echoes its argv, run_code answers
// canned events, files live in a map.
type fake struct {
	mu     sync.Mutex
	n      int
	sbs    map[string]store.Sandbox
	files  map[string][]byte // sandbox id + path
	events []store.Event
	execs  map[string]guest.ExecSpec
	// resumes records the sandboxes a call resumed (like the manager, any
	// call on a paused sandbox resumes it).
	resumes []string
	// snaps are the snapshots by tenant + "/" + name.
	snaps map[string]store.Snapshot
	// browserAddr is the DevTools address (host:port) of the browser of
	// every sandbox of the image "browser": a Chromium the test started.
	browserAddr string
}

func newFake() *fake {
	return &fake{sbs: map[string]store.Sandbox{}, files: map[string][]byte{}, execs: map[string]guest.ExecSpec{}, snaps: map[string]store.Snapshot{}}
}

var _ Service = (*fake)(nil)

func (f *fake) blindCreate(_ context.Context, o sandbox.CreateOptions) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o.Image != "" && o.Image != "base" && o.Image != "browser" {
		return store.Sandbox{}, fmt.Errorf("%w: unknown image %q", errdefs.ErrNotFound, o.Image)
	}
	f.n++
	sb := store.Sandbox{ID: fmt.Sprintf("sb%014d", f.n), State: store.StateRunning, Image: cmp.Or(o.Image, "base"), CPUs: o.CPUs,
		MemoryMiB: o.MemoryMiB, Tenant: o.Tenant, Env: o.Env, Metadata: o.Metadata, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
		IdlePause: o.IdlePause, Network: o.Network}
	for _, v := range o.Volumes {
		if v.Name == "busy" {
			return store.Sandbox{}, fmt.Errorf("%w: volume %q is mounted read-write by sandbox sb0", errdefs.ErrConflict, v.Name)
		}
		sb.Mounts = append(sb.Mounts, store.Mount{VolumeID: "vol" + v.Name, VolumeName: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	sb.Network = o.Network
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fake) blindGet(_ context.Context, id string) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return sb, fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	return sb, nil
}

func (f *fake) blindList(context.Context) ([]store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Sandbox
	for _, sb := range f.sbs {
		out = append(out, sb)
	}
	return out, nil
}

func (f *fake) blindRemove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sbs, id)
	return nil
}

func (f *fake) blindSetTimeout(_ context.Context, id string, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	if !ok {
		return errdefs.ErrNotFound
	}
	sb.ExpiresAt = time.Now().Add(d)
	f.sbs[id] = sb
	return nil
}

func (f *fake) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sortedKeys(maps.Collect(func(yield func(string, string) bool) {
		for id := range f.sbs {
			if !yield(id, "") {
				return
			}
		}
	}))
}

// Pause: a sandbox with metadata busy=1 runs a command (refused without
// force).
func (f *fake) blindPause(_ context.Context, id string, force bool) (sandbox.PauseResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	switch {
	case !ok:
		return sandbox.PauseResult{}, fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	case sb.State == store.StatePaused:
		return sandbox.PauseResult{}, nil
	case sb.Metadata["busy"] == "1" && !force:
		return sandbox.PauseResult{}, fmt.Errorf("%w: sandbox %s has running commands; pause with force to end them", errdefs.ErrFailedPrecondition, id)
	}
	sb.State, sb.PausedAt, sb.LifetimeLeft = store.StatePaused, time.Now(), time.Until(sb.ExpiresAt)
	f.sbs[id] = sb
	return sandbox.PauseResult{StateBytes: 64 << 20, Save: 300 * time.Millisecond}, nil
}

func (f *fake) blindResume(_ context.Context, id string) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.resumeLocked(id); err != nil {
		return store.Sandbox{}, err
	}
	return f.sbs[id], nil
}

func (f *fake) resumeLocked(id string) error {
	sb, ok := f.sbs[id]
	if !ok {
		return fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	}
	if sb.State == store.StatePaused {
		sb.State, sb.ExpiresAt = store.StateRunning, time.Now().Add(sb.LifetimeLeft)
		f.sbs[id] = sb
		f.resumes = append(f.resumes, id)
	}
	return nil
}

func (f *fake) Exec(_ context.Context, c sandbox.Caller, id string, spec guest.ExecSpec, _ bool) (guest.ExecStream, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb, ok := f.sbs[id]; ok && !c.Sees(sb) {
		return nil, fmt.Errorf("%w: sandbox not found", errdefs.ErrNotFound)
	}
	if err := f.resumeLocked(id); err != nil {
		return nil, err
	}
	f.execs["abcdefghijklmnop"] = spec
	return newFakeStream(spec.Argv), nil
}

// fakeStream: stdout is the argv joined; "fail" exits 3 with stderr; "big"
// prints 1 MiB; "balloon" is killed by the OOM killer.
type fakeStream struct{ evs []guest.ExecEvent }

func newFakeStream(argv []string) *fakeStream {
	code := 0
	var evs []guest.ExecEvent
	if argv[0] == "balloon" {
		evs = append(evs, guest.ExecEvent{Kind: guest.ExecExited, Exit: &guest.ExitStatus{Code: -1, Signal: 9, OOMKilled: true}})
		return &fakeStream{evs: evs}
	}
	switch argv[0] {
	case "fail":
		evs = append(evs, guest.ExecEvent{Kind: guest.ExecStderr, Data: []byte("boom\n")})
		code = 3
	case "big":
		evs = append(evs, guest.ExecEvent{Kind: guest.ExecStdout, Data: bytes.Repeat([]byte("x"), 1<<20)})
	default:
		evs = append(evs, guest.ExecEvent{Kind: guest.ExecStdout, Data: []byte(strings.Join(argv, " ") + "\n")})
	}
	evs = append(evs, guest.ExecEvent{Kind: guest.ExecExited, Exit: &guest.ExitStatus{Code: code}})
	return &fakeStream{evs: evs}
}

func (s *fakeStream) Info() guest.ExecInfo { return guest.ExecInfo{ID: "abcdefghijklmnop"} }
func (s *fakeStream) Recv() (guest.ExecEvent, error) {
	if len(s.evs) == 0 {
		return guest.ExecEvent{}, io.EOF
	}
	ev := s.evs[0]
	s.evs = s.evs[1:]
	return ev, nil
}
func (s *fakeStream) Stdin([]byte) error          { return nil }
func (s *fakeStream) CloseStdin() error           { return nil }
func (s *fakeStream) Resize(guest.TermSize) error { return nil }
func (s *fakeStream) Signal(int) error            { return nil }
func (s *fakeStream) Finish() error               { return nil }
func (s *fakeStream) Close()                      {}

// browser checks that c's sandbox id has a browser (the image "browser")
// and returns its address.
func (f *fake) browser(c sandbox.Caller, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	switch {
	case !ok || !c.Sees(sb):
		return "", fmt.Errorf("%w: sandbox not found", errdefs.ErrNotFound)
	case sb.Image != "browser":
		return "", sandbox.ErrNoBrowser // the manager's answer: the launcher's exec did not start
	case f.browserAddr == "":
		return "", fmt.Errorf("%w: the browser did not start", errdefs.ErrUnavailable)
	}
	return f.browserAddr, f.resumeLocked(id)
}

func (f *fake) StartBrowser(_ context.Context, c sandbox.Caller, id string, _ sandbox.BrowserView) (sandbox.BrowserStatus, error) {
	if _, err := f.browser(c, id); err != nil {
		return sandbox.BrowserStatus{}, err
	}
	return sandbox.BrowserStatus{Running: true, CDPPort: sandbox.BrowserCDPPort}, nil
}

func (f *fake) DialBrowser(ctx context.Context, c sandbox.Caller, id string) (net.Conn, error) {
	addr, err := f.browser(c, id)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (f *fake) WriteFile(_ context.Context, _ sandbox.Caller, id, p string, _ uint32, r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[id+p] = b
	return int64(len(b)), err
}

func (f *fake) ReadFile(_ context.Context, _ sandbox.Caller, id, p string, w io.Writer, info func(guest.FileInfo)) (int64, error) {
	f.mu.Lock()
	b, ok := f.files[id+p]
	f.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: read %s: no such file", errdefs.ErrNotFound, p)
	}
	info(guest.FileInfo{Path: p, Size: uint64(len(b))})
	n, err := w.Write(b)
	return int64(n), err
}

func (f *fake) ListFiles(_ context.Context, _ sandbox.Caller, id, p string, _ uint32) (guest.FileList, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out guest.FileList
	for k, b := range f.files {
		if name, ok := strings.CutPrefix(k, id+p); ok {
			out.Entries = append(out.Entries, guest.FileInfo{Path: p + name, Type: guest.FileRegular, Size: uint64(len(b)), Mode: 0o644})
		}
	}
	return out, nil
}

func (f *fake) CreateContext(_ context.Context, _ sandbox.Caller, _ string, req guest.ContextSpec) (guest.ContextInfo, error) {
	return guest.ContextInfo{ID: req.ID, Language: "python", State: "idle", CreatedAt: time.Unix(0, 0)}, nil
}

func (f *fake) ListContexts(context.Context, sandbox.Caller, string) ([]guest.ContextInfo, error) {
	return []guest.ContextInfo{{ID: "python", Language: "python", State: "idle", IsDefault: true, CreatedAt: time.Unix(0, 0)}}, nil
}

func (f *fake) RestartContext(_ context.Context, _ sandbox.Caller, _, id string) (guest.ContextInfo, error) {
	if id == "nope" {
		return guest.ContextInfo{}, fmt.Errorf("%w: no context %q", errdefs.ErrNotFound, id)
	}
	return guest.ContextInfo{ID: id, Language: "python", State: "idle", CreatedAt: time.Unix(0, 0)}, nil
}

var png = []byte("\x89PNG\r\n\x1a\nfakepng")

// RunCode: "raise" gives an error with traceback; anything else prints the
// code, displays a PNG and returns 42.
func (f *fake) RunCode(_ context.Context, _ sandbox.Caller, id string, req guest.CodeRequest, fn func(guest.CodeEvent) error) error {
	f.mu.Lock()
	err := f.resumeLocked(id)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if req.Code == "cold" {
		// A context that does not start before the deadline.
		_ = fn(guest.CodeEvent{Kind: guest.EventStatus, Status: "still starting python context (25s)"})
		return fmt.Errorf("start the python context: %w", context.DeadlineExceeded)
	}
	for _, p := range req.ReturnFiles {
		_ = fn(guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": png}, File: p}})
	}
	if req.Code == "raise" {
		_ = fn(guest.CodeEvent{Kind: guest.EventError, Error: &guest.CodeError{Name: "ValueError", Value: "bad", Traceback: []string{"Traceback (most recent call last):", "  line 1"}}})
	} else {
		_ = fn(guest.CodeEvent{Kind: guest.EventStdout, Data: []byte("ran " + req.Code + "\n")})
		_ = fn(guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"image/png": png, "text/plain": []byte("<Figure>")}}})
		_ = fn(guest.CodeEvent{Kind: guest.EventResult, Result: &guest.CodeResult{Data: map[string][]byte{"text/plain": []byte("42")}, Main: true}})
	}
	return fn(guest.CodeEvent{Kind: guest.EventEnd, End: &guest.CodeEnd{ContextID: "python", ExecutionCount: 1}})
}

func (f *fake) AppendEvent(_ context.Context, e store.Event) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, e)
	return int64(len(f.events)), nil
}

func (f *fake) actions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.events {
		out = append(out, e.Action+":"+e.KeyID)
	}
	return out
}

func (f *fake) blindSnapshot(_ context.Context, id, name string, force bool) (store.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb, ok := f.sbs[id]
	switch {
	case !ok:
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s", errdefs.ErrNotFound, id)
	case sb.Metadata["busy"] == "1" && !force:
		return store.Snapshot{}, fmt.Errorf("%w: sandbox %s has running commands; use force to end them", errdefs.ErrFailedPrecondition, id)
	}
	if _, ok := f.snaps[sb.Tenant+"/"+name]; ok {
		return store.Snapshot{}, fmt.Errorf("%w: snapshot %q exists", errdefs.ErrConflict, name)
	}
	sn := store.Snapshot{Tenant: sb.Tenant, Name: name, ID: fmt.Sprintf("snap%d", len(f.snaps)), SandboxID: id, Image: sb.Image,
		CPUs: sb.CPUs, MemoryMiB: sb.MemoryMiB, Env: sb.Env, Size: 32 << 20, Created: time.Now()}
	f.snaps[sb.Tenant+"/"+name] = sn
	return sn, nil
}

func (f *fake) GetSnapshot(_ context.Context, tenant, name string) (store.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sn, ok := f.snaps[tenant+"/"+name]
	if !ok {
		return sn, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	return sn, nil
}

func (f *fake) blindCreateFromSnapshot(_ context.Context, name string, o sandbox.CreateOptions) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sn, ok := f.snaps[o.Tenant+"/"+name]
	if !ok {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	f.n++
	sb := store.Sandbox{ID: fmt.Sprintf("sb%014d", f.n), State: store.StateRunning, Image: sn.Image, CPUs: sn.CPUs,
		MemoryMiB: sn.MemoryMiB, Tenant: o.Tenant, Env: sn.Env, Metadata: o.Metadata, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
		IdlePause: o.IdlePause, Source: "snapshot:" + name}
	f.sbs[sb.ID] = sb
	return sb, nil
}

func (f *fake) blindFork(ctx context.Context, id string, count int, force bool) ([]store.Sandbox, error) {
	base := fmt.Sprintf("_fork-%s-%d", id, time.Now().UnixNano())
	sn, err := f.blindSnapshot(ctx, id, base, force)
	if err != nil {
		return nil, err
	}
	var out []store.Sandbox
	for range count {
		sb, err := f.blindCreateFromSnapshot(ctx, base, sandbox.CreateOptions{Tenant: sn.Tenant})
		if err != nil {
			return out, err
		}
		f.mu.Lock()
		sb.Source = "fork:" + id
		f.sbs[sb.ID] = sb
		f.mu.Unlock()
		out = append(out, sb)
	}
	return out, nil
}

// The Service methods decide like the manager: what the caller sees
// (another tenant's sandbox is not found) and the audit trail (AppendEvent
// as the caller, with via). The blind methods above act.

func (f *fake) audit(c sandbox.Caller, id, action string, detail map[string]any) {
	if detail == nil {
		detail = map[string]any{}
	}
	detail["via"] = c.Via
	_, _ = f.AppendEvent(context.Background(), store.Event{Tenant: c.Tenant, KeyID: c.KeyID, SandboxID: id, Action: action, Detail: detail})
}

func (f *fake) Get(ctx context.Context, c sandbox.Caller, id string) (store.Sandbox, error) {
	sb, err := f.blindGet(ctx, id)
	if err == nil && !c.Sees(sb) {
		return store.Sandbox{}, fmt.Errorf("%w: sandbox not found", errdefs.ErrNotFound)
	}
	return sb, err
}

func (f *fake) List(ctx context.Context, c sandbox.Caller) ([]store.Sandbox, error) {
	sbs, err := f.blindList(ctx)
	return slices.DeleteFunc(sbs, func(sb store.Sandbox) bool { return !c.Sees(sb) }), err
}

func (f *fake) Create(ctx context.Context, c sandbox.Caller, o sandbox.CreateOptions) (store.Sandbox, error) {
	o.Tenant = c.Tenant
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
	}
	sb, err := f.blindCreate(ctx, o)
	if err == nil {
		f.audit(c, sb.ID, "sandbox.create", map[string]any{"image": sb.Image})
	}
	return sb, err
}

func (f *fake) Remove(ctx context.Context, c sandbox.Caller, id string) error {
	if _, err := f.Get(ctx, c, id); err != nil {
		return err
	}
	if err := f.blindRemove(ctx, id); err != nil {
		return err
	}
	f.audit(c, id, "sandbox.delete", nil)
	return nil
}

func (f *fake) SetTimeout(ctx context.Context, c sandbox.Caller, id string, d time.Duration) error {
	if _, err := f.Get(ctx, c, id); err != nil {
		return err
	}
	if err := f.blindSetTimeout(ctx, id, d); err != nil {
		return err
	}
	f.audit(c, id, "sandbox.timeout", map[string]any{"timeout_s": int(d / time.Second)})
	return nil
}

// SetNetwork validates and floor-checks like the manager, stores the
// policy and audits the change.
func (f *fake) SetNetwork(ctx context.Context, c sandbox.Caller, id string, p sandbox.EgressPolicy) (sandbox.NetworkChange, error) {
	sb, err := f.Get(ctx, c, id)
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
	sb = f.sbs[id]
	sb.Network = next
	f.sbs[id] = sb
	f.mu.Unlock()
	f.audit(c, id, "sandbox.network", map[string]any{"new": sandbox.PolicyAudit(next)})
	return sandbox.NetworkChange{Network: next, Applied: "running"}, nil
}

func (f *fake) Pause(ctx context.Context, c sandbox.Caller, id string, force bool) (sandbox.PauseResult, error) {
	was, err := f.Get(ctx, c, id)
	if err != nil {
		return sandbox.PauseResult{}, err
	}
	res, err := f.blindPause(ctx, id, force)
	if err == nil {
		f.audit(c, id, "sandbox.pause", map[string]any{"force": force, "was": string(was.State)})
	}
	return res, err
}

func (f *fake) Resume(ctx context.Context, c sandbox.Caller, id string) (store.Sandbox, error) {
	was, err := f.Get(ctx, c, id)
	if err != nil {
		return was, err
	}
	sb, err := f.blindResume(ctx, id)
	if err == nil {
		f.audit(c, id, "sandbox.resume", map[string]any{"was": string(was.State)})
	}
	return sb, err
}

func (f *fake) Snapshot(ctx context.Context, c sandbox.Caller, id, name string, force bool) (store.Snapshot, error) {
	if _, err := f.Get(ctx, c, id); err != nil {
		return store.Snapshot{}, err
	}
	sn, err := f.blindSnapshot(ctx, id, name, force)
	if err == nil {
		f.audit(c, id, "snapshot.create", map[string]any{"name": sn.Name, "snapshot_id": sn.ID})
	}
	return sn, err
}

func (f *fake) CreateFromSnapshot(ctx context.Context, c sandbox.Caller, name string, o sandbox.CreateOptions) (store.Sandbox, error) {
	o.Tenant = c.Tenant
	if strings.HasPrefix(name, "_fork-") {
		return store.Sandbox{}, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	sb, err := f.blindCreateFromSnapshot(ctx, name, o)
	if err == nil {
		f.audit(c, sb.ID, "sandbox.create", map[string]any{"image": sb.Image, "source": sb.Source})
	}
	return sb, err
}

// Fork is all or nothing, like the manager.
func (f *fake) Fork(ctx context.Context, c sandbox.Caller, id string, o sandbox.ForkOptions) ([]store.Sandbox, error) {
	count, force := o.Count, o.Force
	if _, err := f.Get(ctx, c, id); err != nil {
		return nil, err
	}
	forks, err := f.blindFork(ctx, id, count, force)
	if err != nil {
		for _, sb := range forks {
			_ = f.blindRemove(ctx, sb.ID)
		}
		return nil, err
	}
	ids := make([]string, 0, len(forks))
	for _, sb := range forks {
		f.audit(c, sb.ID, "sandbox.create", map[string]any{"image": sb.Image, "source": sb.Source})
		ids = append(ids, sb.ID)
	}
	f.audit(c, id, "sandbox.fork", map[string]any{"count": count, "force": force, "forks": ids})
	return forks, nil
}
