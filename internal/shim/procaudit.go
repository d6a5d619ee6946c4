package shim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Process audit: the programs the guest runs (agentapi ProcEvents: every
// execve, and the exit of each process seen exec'ing) become proc.exec
// and proc.exit events in the audit trail. The guest is untrusted: what it
// reports is best effort (a compromised guest kernel can lie or stay
// silent), and the host bounds everything it keeps of it:
//
//   - at most agentapi.MaxProcEvents events per message and procMaxRate
//     events per second are looked at; the rest are counted as dropped;
//   - strings are escaped (guest.Text) and cut: a path at procMaxPath
//     bytes, argv at procMaxArgs arguments and procMaxArgvBytes in all;
//   - rows are rate limited and folded like the network events': an exec
//     is recorded by itself while the sandbox's token bucket allows
//     (procBurst, then procRate a second) and its kind (program and uid)
//     has had fewer than procPerKind rows of its own this interval; an
//     exit is recorded by itself when its exec was (and the bucket
//     allows). The others are folded into one row per kind (action,
//     program, uid, exit status) per procInterval, with the count and a
//     few argv samples; more kinds than procMaxGroups in an interval are
//     counted in a proc.audit.dropped row, which also counts what the
//     guest said it lost and what the host dropped. So a sandbox writes at
//     most procBurst + procRate rows a second (past the burst) +
//     (procMaxGroups + 1) rows per interval, whatever its guest does; a
//     loop running one program writes 2*procPerKind + 2 rows per interval;
//     and the counts of the rows add up to the events the guest reported
//     (a row of its own counts one).
const (
	procBurst        = 200
	procRate         = 5
	procInterval     = 30 * time.Second
	procPerKind      = 3
	procMaxTracked   = 4096 // pids whose exec was recorded by itself
	procMaxGroups    = 64
	procSamples      = 3
	procMaxRate      = 20000
	procQueueLen     = 4096
	procMaxPath      = 256
	procMaxArgs      = 32
	procMaxArgvBytes = 1024
	// procStartTimeout bounds the wait for the agent's first message.
	procStartTimeout = 10 * time.Second
)

// procRecord is one guest process event after the host's checks.
type procRecord struct {
	exit          bool
	pid, ppid     uint32
	uid, euid     uint32
	path, cwd     string
	argv          []string
	argvTruncated bool
	gone, agent   bool
	code, signal  int32
	guestTime     time.Time
}

// procRecordFrom checks and bounds a guest event; ok is false for an
// event of no known kind.
func procRecordFrom(e *agentv1.ProcEvent) (r procRecord, ok bool) {
	switch e.GetKind() {
	case agentv1.ProcEvent_KIND_EXEC:
	case agentv1.ProcEvent_KIND_EXIT:
		r.exit = true
	default:
		return r, false
	}
	r.pid, r.ppid, r.uid, r.euid = e.GetPid(), e.GetPpid(), e.GetUid(), e.GetEuid()
	r.path = guest.Text(e.GetPath(), procMaxPath)
	r.cwd = guest.Text(e.GetCwd(), procMaxPath)
	r.gone, r.agent = e.GetGone(), e.GetAgent()
	r.code, r.signal = e.GetExitCode(), e.GetSignal()
	if ns := e.GetUnixNano(); ns > 0 {
		r.guestTime = time.Unix(0, ns)
	}
	r.argvTruncated = e.GetArgvTruncated()
	left := procMaxArgvBytes
	for i, a := range e.GetArgv() {
		if i == procMaxArgs || left <= 0 {
			r.argvTruncated = true
			break
		}
		t := guest.Text(a, left)
		if t != a {
			r.argvTruncated = true
		}
		left -= len(t)
		r.argv = append(r.argv, t)
	}
	return r, true
}

// minRedacted is the shortest environment value envRedactor hides: a
// shorter one ("1", "true", a port) is not a credential, and hiding it
// would garble every argv.
const minRedacted = 8

// envRedactor replaces each value of the sandbox's environment (the
// create's -e, a secret's placeholder; minRedacted bytes or more) with
// "[env NAME]": a credential handed to a sandbox in its environment and
// then put on a command line (curl -H "Authorization: Bearer $TOKEN")
// does not land in the audit trail. Nil when there is nothing to hide.
func envRedactor(env map[string]string) *strings.Replacer {
	var pairs []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if v := env[k]; len(v) >= minRedacted {
			pairs = append(pairs, v, "[env "+k+"]")
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	return strings.NewReplacer(pairs...)
}

// redactWith applies an envRedactor to what the guest reported.
func (r *procRecord) redactWith(rp *strings.Replacer) {
	for i, a := range r.argv {
		r.argv[i] = rp.Replace(a)
	}
	r.path, r.cwd = rp.Replace(r.path), rp.Replace(r.cwd)
}

func (r procRecord) action() string {
	if r.exit {
		return "proc.exit"
	}
	return "proc.exec"
}

// status is how an exit ended: "code N" or "signal N" ("" for an exec).
func (r procRecord) status() string {
	switch {
	case !r.exit:
		return ""
	case r.signal != 0:
		return fmt.Sprintf("signal %d", r.signal)
	default:
		return fmt.Sprintf("code %d", r.code)
	}
}

// event is r's row when it is recorded by itself.
func (r procRecord) event(tenant, id string, now time.Time) store.Event {
	d := map[string]any{"pid": r.pid, "path": r.path}
	if !r.guestTime.IsZero() {
		d["guest_time"] = r.guestTime.UTC().Format(time.RFC3339Nano)
	}
	if r.exit {
		if r.signal != 0 {
			d["signal"] = r.signal
		} else {
			d["exit_code"] = r.code
		}
	} else {
		d["ppid"], d["uid"], d["argv"], d["cwd"] = r.ppid, r.uid, r.argv, r.cwd
		if r.argv == nil {
			d["argv"] = []string{}
		}
		if r.euid != r.uid {
			d["euid"] = r.euid
		}
		if r.argvTruncated {
			d["argv_truncated"] = true
		}
		if r.gone {
			d["gone"] = true
		}
		if r.agent {
			d["agent"] = true
		}
	}
	return store.Event{Time: now, Tenant: tenant, SandboxID: id, Action: r.action(), Detail: d}
}

// procKey is the kind rows are folded by.
type procKey struct {
	action, path string
	uid          uint32
	status       string
}

type procGroup struct {
	count       uint64
	first, last time.Time
	samples     [][]string
}

// procFold decides which events are recorded singly and folds the rest.
// Safe for concurrent use.
type procFold struct {
	mu     sync.Mutex
	lim    *rate.Limiter
	groups map[procKey]*procGroup
	order  []procKey
	// singles counts the rows of their own each kind had this interval;
	// singled holds the pids whose exec had one (their exit may too).
	singles  map[procKey]int
	singled  map[uint32]struct{}
	overflow uint64 // events of kinds past procMaxGroups
	lost     uint64 // events the guest said it lost
	dropped  uint64 // events the host dropped (too many, too fast, malformed)
}

func newProcFold() *procFold {
	return &procFold{lim: rate.NewLimiter(procRate, procBurst), groups: map[procKey]*procGroup{},
		singles: map[procKey]int{}, singled: map[uint32]struct{}{}}
}

// admit reports whether r, seen at now, is recorded as it is; if not it
// has been folded into its kind's row for the current interval.
func (f *procFold) admit(r procRecord, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := procKey{action: r.action(), path: r.path, status: r.status()}
	if !r.exit {
		k.uid = r.uid
	}
	if r.exit {
		_, was := f.singled[r.pid]
		delete(f.singled, r.pid)
		if was && f.lim.AllowN(now, 1) {
			return true
		}
	} else if f.singles[k] < procPerKind && f.lim.AllowN(now, 1) {
		f.singles[k]++
		if len(f.singled) < procMaxTracked {
			f.singled[r.pid] = struct{}{}
		}
		return true
	}
	g := f.groups[k]
	if g == nil {
		if len(f.groups) >= procMaxGroups {
			f.overflow++
			return false
		}
		g = &procGroup{first: now}
		f.groups[k] = g
		f.order = append(f.order, k)
	}
	g.count++
	g.last = now
	if !r.exit && len(g.samples) < procSamples {
		g.samples = append(g.samples, r.argv)
	}
	return false
}

// drop counts events the guest lost and the host dropped.
func (f *procFold) drop(lost, dropped uint64) {
	f.mu.Lock()
	f.lost += lost
	f.dropped += dropped
	f.mu.Unlock()
}

// flush returns the folded rows of the interval that ends now and starts
// the next one.
func (f *procFold) flush(tenant, id string, now time.Time) []store.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Event
	for _, k := range f.order {
		g := f.groups[k]
		d := map[string]any{
			"aggregated": true,
			"count":      g.count,
			"first":      g.first.UTC().Format(time.RFC3339Nano),
			"last":       g.last.UTC().Format(time.RFC3339Nano),
			"path":       k.path,
		}
		if k.action == "proc.exec" {
			d["uid"] = k.uid
			d["samples"] = g.samples
		} else {
			d["status"] = k.status
		}
		out = append(out, store.Event{Time: now, Tenant: tenant, SandboxID: id, Action: k.action, Detail: d})
	}
	if n := f.overflow + f.lost + f.dropped; n > 0 {
		d := map[string]any{"count": n, "reason": fmt.Sprintf("process events not recorded in %s: of more kinds than %d, lost by the guest, or more or faster than the host takes", procInterval, procMaxGroups)}
		for name, v := range map[string]uint64{"kinds_over": f.overflow, "guest_lost": f.lost, "host_dropped": f.dropped} {
			if v > 0 {
				d[name] = v
			}
		}
		out = append(out, store.Event{Time: now, Tenant: tenant, SandboxID: id, Action: "proc.audit.dropped", Detail: d})
	}
	clear(f.groups)
	clear(f.singles)
	f.order = f.order[:0]
	f.overflow, f.lost, f.dropped = 0, 0, 0
	return out
}

// procAudit reads the guest's process events and writes them to the
// catalog: one goroutine reads the agent's stream, folds and queues; one
// writes the queue and the folded rows every procInterval.
type procAudit struct {
	st     *store.Store
	id     string // the sandbox
	own    *owner // its tenant, and the environment values to hide
	log    *slog.Logger
	clk    clock.Clock
	fold   *procFold
	read   *rate.Limiter // procMaxRate: events looked at
	ch     chan store.Event
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// owner is whom a sandbox belongs to now, as the shim's audit writers
// read it: its tenant, and a replacer hiding the values of its default
// environment (envRedactor) in what the guest reports. Both change while
// the sandbox runs: a live secrets change replaces the environment, and a
// create that claims a warm pool's sandbox gives it its tenant.
type owner struct {
	t      atomic.Pointer[string]
	redact atomic.Pointer[strings.Replacer] // nil: nothing to hide
}

func newOwner(tenant string, env map[string]string) *owner {
	o := &owner{}
	o.setTenant(tenant)
	o.setEnv(env)
	return o
}

func (o *owner) tenant() string               { return *o.t.Load() }
func (o *owner) setTenant(tenant string)      { o.t.Store(&tenant) }
func (o *owner) setEnv(env map[string]string) { o.redact.Store(envRedactor(env)) }

// startProcAudit starts the process audit of sb's guest: from the
// runtime when it sees the guest's execs itself (runtime.ProcWatcher:
// gVisor's Sentry), else from the agent. It returns nil when neither can:
// an older agent (logged), a guest kernel without the process-events
// connector, a runtime monitor or an agent that does not start (recorded
// in the trail as proc.audit.off). Close it with close.
func startProcAudit(agent *agentapi.Client, inst runtime.Instance, st *store.Store, id string, own *owner, log *slog.Logger, clk clock.Clock) *procAudit {
	ctx, cancel := context.WithCancel(context.Background())
	p := &procAudit{st: st, id: id, own: own, log: log, clk: clk, fold: newProcFold(), read: rate.NewLimiter(procMaxRate, procMaxRate),
		ch: make(chan store.Event, procQueueLen), cancel: cancel}
	if w, ok := inst.(runtime.ProcWatcher); ok {
		if !p.fromRuntime(ctx, w, agent) {
			return nil
		}
		return p
	}
	// The agent sends its first (empty) message once it listens: the
	// sandbox is marked running after that, so its first exec is on
	// record. An error here is its refusal (Unimplemented under gVisor);
	// a guest that does not answer in time has no audit.
	slow := time.AfterFunc(procStartTimeout, cancel)
	stream, err := agent.ProcEvents(ctx)
	if err == nil && !stream.Receive() {
		err = cmp.Or(stream.Err(), errors.New("the stream ended at once"))
		_ = stream.Close()
	}
	if !slow.Stop() && err == nil {
		err = errors.New("the guest agent did not start its process-event stream in time")
		_ = stream.Close()
	}
	if err != nil {
		cancel()
		log.Info("no process audit", "err", err)
		if errors.Is(err, agentapi.ErrUnsupported) {
			// An agent from before process audit (and the fake runtime's):
			// nothing to say in the trail that the version does not.
			return nil
		}
		reason := "the guest agent did not start its process-event stream"
		if connect.CodeOf(err) == connect.CodeUnimplemented {
			reason = "the guest kernel has no process-events connector (gVisor has none)"
		}
		p.off(reason)
		return nil
	}
	p.wg.Go(p.write)
	p.wg.Go(func() {
		defer close(p.ch)
		defer stream.Close()
		for stream.Receive() {
			p.take(stream.Msg())
		}
		if ctx.Err() == nil && agent.Alive() {
			// The guest ended the stream while the sandbox runs: what it
			// runs from now on is not on record; say so.
			log.Warn("process audit stream ended", "err", stream.Err())
			p.append(store.Event{Time: clk.Now(), Tenant: own.tenant(), SandboxID: id, Action: "proc.audit.end",
				Detail: map[string]any{"reason": "the guest agent ended its process-event stream; later programs are not recorded"}})
		}
	})
	return p
}

// fromRuntime audits with the runtime's own stream (gVisor's Sentry),
// through the same checks, limits and folding as the agent's. It reports
// whether the audit runs; if not, the trail says so (proc.audit.off).
func (p *procAudit) fromRuntime(ctx context.Context, w runtime.ProcWatcher, agent *agentapi.Client) bool {
	startCtx, cancel := context.WithTimeout(ctx, procStartTimeout)
	stream, err := w.ProcEvents(startCtx)
	cancel()
	if err != nil {
		p.cancel()
		// The error names host paths: the log has it, the trail does not.
		p.log.Warn("no process audit", "err", err)
		p.off("the runtime's process monitor did not start")
		return false
	}
	stop := context.AfterFunc(ctx, func() { _ = stream.Close() })
	p.wg.Go(p.write)
	p.wg.Go(func() {
		defer close(p.ch)
		defer stream.Close()
		defer stop()
		var err error
		for {
			var e runtime.ProcEvent
			var lost uint64
			if e, lost, err = stream.Next(); err != nil {
				break
			}
			p.take(&agentv1.ProcEventsResponse{Events: []*agentv1.ProcEvent{procEventOf(e)}, Lost: lost})
		}
		if ctx.Err() == nil && agent.Alive() {
			p.log.Warn("process audit stream ended", "err", err)
			p.append(store.Event{Time: p.clk.Now(), Tenant: p.own.tenant(), SandboxID: p.id, Action: "proc.audit.end",
				Detail: map[string]any{"reason": "the runtime's process monitor ended its stream; later programs are not recorded"}})
		}
	})
	return true
}

// procEventOf is a runtime's event in the agent's form, for the same
// checks (procRecordFrom) as the agent's.
func procEventOf(e runtime.ProcEvent) *agentv1.ProcEvent {
	k := agentv1.ProcEvent_KIND_EXEC
	if e.Exit {
		k = agentv1.ProcEvent_KIND_EXIT
	}
	var ns int64
	if !e.Time.IsZero() {
		ns = e.Time.UnixNano()
	}
	return &agentv1.ProcEvent{Kind: k, UnixNano: ns, Pid: e.PID, Ppid: e.PPID, Uid: e.UID, Euid: e.EUID,
		Path: e.Path, Argv: e.Argv, Cwd: e.Cwd, Agent: e.Agent, ExitCode: e.ExitCode, Signal: e.Signal}
}

// off records that the sandbox has no process audit, and why.
func (p *procAudit) off(reason string) {
	p.append(store.Event{Time: p.clk.Now(), Tenant: p.own.tenant(), SandboxID: p.id, Action: "proc.audit.off", Detail: map[string]any{"reason": reason}})
}

// take checks, bounds and folds one message of the guest's.
func (p *procAudit) take(msg *agentv1.ProcEventsResponse) {
	now := p.clk.Now()
	events := msg.GetEvents()
	var dropped uint64
	if n := len(events); n > agentapi.MaxProcEvents {
		dropped += uint64(n - agentapi.MaxProcEvents)
		events = events[:agentapi.MaxProcEvents]
	}
	for _, e := range events {
		if !p.read.AllowN(now, 1) {
			dropped++
			continue
		}
		r, ok := procRecordFrom(e)
		if !ok {
			dropped++
			continue
		}
		if rp := p.own.redact.Load(); rp != nil {
			r.redactWith(rp)
		}
		if !p.fold.admit(r, now) {
			continue
		}
		select {
		case p.ch <- r.event(p.own.tenant(), p.id, now):
		default:
			dropped++
		}
	}
	if lost := msg.GetLost(); lost > 0 || dropped > 0 {
		p.fold.drop(min(lost, 1<<40), dropped)
	}
}

// write appends queued rows, and every procInterval the folded ones,
// until the queue closes.
func (p *procAudit) write() {
	tick := p.clk.NewTicker(procInterval)
	defer tick.Stop()
	flush := func() {
		for _, e := range p.fold.flush(p.own.tenant(), p.id, p.clk.Now()) {
			p.append(e)
		}
	}
	for {
		select {
		case e, ok := <-p.ch:
			if !ok {
				flush()
				return
			}
			p.append(e)
		case <-tick.C():
			flush()
		}
	}
}

func (p *procAudit) append(e store.Event) {
	if _, err := p.st.AppendEvent(context.Background(), e); err != nil {
		p.log.Error("audit", "action", e.Action, "err", err)
	}
}

// close stops the audit and writes what it holds. Safe on nil, and more
// than once.
func (p *procAudit) close() {
	if p == nil {
		return
	}
	p.cancel()
	p.wg.Wait()
}
