package shim

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func execEvent(path string, uid uint32, argv ...string) *agentv1.ProcEvent {
	return &agentv1.ProcEvent{Kind: agentv1.ProcEvent_KIND_EXEC, Pid: 100, Ppid: 1, Uid: uid, Euid: uid, Path: path, Argv: argv, Cwd: "/"}
}

// counts sums what a sandbox's proc.* rows account for: events recorded
// singly, folded (their count) and dropped.
func procCounts(t *testing.T, evs []store.Event) (single, folded, dropped uint64, rows int) {
	t.Helper()
	for _, e := range evs {
		if !strings.HasPrefix(e.Action, "proc.") {
			continue
		}
		rows++
		n, _ := e.Detail["count"].(float64)
		switch {
		case e.Action == "proc.audit.dropped":
			dropped += uint64(n)
		case e.Detail["aggregated"] == true:
			folded += uint64(n)
		case e.Action == "proc.exec" || e.Action == "proc.exit":
			single++
		}
	}
	return single, folded, dropped, rows
}

func TestProcRecordFromBoundsGuestData(t *testing.T) {
	t.Parallel()
	huge := strings.Repeat("A", 100<<10)
	e := &agentv1.ProcEvent{Kind: agentv1.ProcEvent_KIND_EXEC, Path: "/bin/\x1b[2Jevil" + huge, Cwd: huge}
	for range 1000 {
		e.Argv = append(e.Argv, huge)
	}
	r, ok := procRecordFrom(e)
	if !ok {
		t.Fatal("refused an exec")
	}
	total := 0
	for _, a := range r.argv {
		total += len(a)
	}
	if len(r.argv) > procMaxArgs || total > procMaxArgvBytes+len("...")*len(r.argv) || !r.argvTruncated {
		t.Errorf("argv kept %d args, %d bytes, truncated %v", len(r.argv), total, r.argvTruncated)
	}
	if len(r.path) > procMaxPath+3 || len(r.cwd) > procMaxPath+3 || strings.Contains(r.path, "\x1b") {
		t.Errorf("path %d bytes (%q...), cwd %d bytes", len(r.path), r.path[:20], len(r.cwd))
	}
	if _, ok := procRecordFrom(&agentv1.ProcEvent{Kind: 99}); ok {
		t.Error("took an event of no known kind")
	}
	x, _ := procRecordFrom(&agentv1.ProcEvent{Kind: agentv1.ProcEvent_KIND_EXIT, Signal: 9, Path: "/bin/sleep"})
	if d := x.event("", "s", time.Now()).Detail; d["signal"] != int32(9) || d["path"] != "/bin/sleep" {
		t.Errorf("exit detail %v", d)
	}
}

// TestProcFoldCountsAddUp runs a shell loop's worth of execs and exits
// through the fold: past the burst and the rate they become one row per
// kind, the counts add up, and more kinds than a row each are counted.
func TestProcFoldCountsAddUp(t *testing.T) {
	t.Parallel()
	f := newProcFold()
	sb := store.Sandbox{ID: "sbx", Tenant: "alice"}
	now := time.Unix(1_700_000_000, 0)
	single := 0
	const loops = 5000
	for i := range loops {
		at := now.Add(time.Duration(i) * time.Millisecond) // 5 s in all
		pid := uint32(1000 + i)
		for _, r := range []procRecord{
			{pid: pid, path: "/usr/bin/true", argv: []string{"true"}},
			{pid: pid, exit: true, path: "/usr/bin/true"},
		} {
			if f.admit(r, at) {
				single++
			}
		}
	}
	// One program: its first execs and their exits have rows of their
	// own, the rest are folded.
	if single != 2*procPerKind {
		t.Errorf("%d recorded singly, want %d", single, 2*procPerKind)
	}
	// Many programs: the token bucket bounds the rows of their own.
	for i := range 2 * procBurst {
		if f.admit(procRecord{pid: uint32(i), path: fmt.Sprintf("/bin/p%d", i)}, now.Add(5*time.Second)) {
			single++
		}
	}
	if single > 2*procPerKind+procBurst+5*procRate+1 {
		t.Errorf("%d recorded singly past the token bucket", single)
	}
	// Far more kinds than rows: the rest are counted.
	for i := range 4 * procMaxGroups {
		if f.admit(procRecord{path: "/tmp/p" + strings.Repeat("x", i)}, now.Add(5*time.Second)) {
			single++
		}
	}
	f.drop(3, 4)
	rows := f.flush(sb.Tenant, sb.ID, now.Add(10*time.Second))
	var folded, dropped uint64
	var trueExec map[string]any
	for _, e := range rows {
		n := e.Detail["count"].(uint64)
		if e.Action == "proc.audit.dropped" {
			dropped += n
			if e.Detail["guest_lost"] != uint64(3) || e.Detail["host_dropped"] != uint64(4) {
				t.Errorf("dropped row %v", e.Detail)
			}
			continue
		}
		folded += n
		if e.Action == "proc.exec" && e.Detail["path"] == "/usr/bin/true" {
			trueExec = e.Detail
		}
		if e.Tenant != "alice" || e.SandboxID != "sbx" {
			t.Errorf("row %+v not the sandbox's", e)
		}
	}
	if len(rows) > procMaxGroups+1 {
		t.Errorf("%d rows for one interval, at most %d", len(rows), procMaxGroups+1)
	}
	if trueExec == nil || len(trueExec["samples"].([][]string)) != procSamples || trueExec["uid"] != uint32(0) {
		t.Errorf("the loop's exec row: %v", trueExec)
	}
	if got, want := uint64(single)+folded+dropped, uint64(2*loops+2*procBurst+4*procMaxGroups+3+4); got != want {
		t.Errorf("counts add up to %d (single %d, folded %d, dropped %d), want %d", got, single, folded, dropped, want)
	}
	if again := f.flush(sb.Tenant, sb.ID, now.Add(20*time.Second)); len(again) != 0 {
		t.Errorf("a quiet interval wrote %d rows", len(again))
	}
}

// procAgent is a guest agent whose ProcEvents sends msgs, then ends the
// stream (or, with hang, waits for the host to end it).
type procAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	agentv1connect.UnimplementedExecServiceHandler
	agentv1connect.UnimplementedFileServiceHandler
	version uint32
	msgs    []*agentv1.ProcEventsResponse
	refuse  bool
}

func (a procAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{ProtocolVersion: a.version}), nil
}

func (a procAgent) ProcEvents(_ context.Context, _ *connect.Request[agentv1.ProcEventsRequest], st *connect.ServerStream[agentv1.ProcEventsResponse]) error {
	if a.refuse {
		return connect.NewError(connect.CodeUnimplemented, nil)
	}
	if err := st.Send(&agentv1.ProcEventsResponse{}); err != nil {
		return err
	}
	for _, m := range a.msgs {
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return nil
}

func dialProcAgent(t *testing.T, a procAgent) (*agentapi.Client, *store.Store) {
	t.Helper()
	host, gconn := net.Pipe()
	go func() { _ = agentapi.Serve(context.Background(), gconn, agentapi.NewHandler(a, a, a)) }()
	ac, err := agentapi.Dial(t.Context(), host, agentapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ac.Close(); gconn.Close(); st.Close() })
	return ac, st
}

// TestProcAuditBoundsAFloodingGuest: a guest that sends more events per
// message than allowed, events of no kind and a lost count, then ends its
// stream: the trail holds a bounded number of rows whose counts add up to
// everything it sent, and says the stream ended.
func TestProcAuditBoundsAFloodingGuest(t *testing.T) {
	t.Parallel()
	var msgs []*agentv1.ProcEventsResponse
	sent := 0
	for range 10 {
		m := &agentv1.ProcEventsResponse{}
		for range 500 {
			m.Events = append(m.Events, execEvent("/usr/bin/true", 1000, "true"))
		}
		sent += len(m.Events)
		msgs = append(msgs, m)
	}
	over := &agentv1.ProcEventsResponse{}
	for range agentapi.MaxProcEvents + 88 {
		over.Events = append(over.Events, execEvent("/bin/sh", 0, "sh", "-c", "true"))
	}
	sent += len(over.Events)
	msgs = append(msgs, over, &agentv1.ProcEventsResponse{Events: []*agentv1.ProcEvent{{Kind: 99}}, Lost: 7})
	sent += 1 + 7
	ac, st := dialProcAgent(t, procAgent{version: agentapi.VersionProcAudit, msgs: msgs})
	sb := store.Sandbox{ID: "floodfloodfloodflood", Tenant: "alice"}
	// (Now: the catalog prunes rows older than its retention.)
	clk := clock.NewFake(time.Now())
	p := startProcAudit(ac, nil, st, sb.ID, newOwner(sb.Tenant, sb.Env), slog.New(slog.DiscardHandler), clk)
	if p == nil {
		t.Fatal("no audit")
	}
	list := func() []store.Event {
		evs, err := st.ListEvents(t.Context(), store.EventFilter{SandboxID: sb.ID, Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	testutil.WaitFor(t, 30*time.Second, func() bool {
		evs := list()
		return len(evs) > 0 && evs[len(evs)-1].Action == "proc.audit.dropped"
	})
	p.close()
	evs := list()
	single, folded, dropped, rows := procCounts(t, evs)
	if got := single + folded + dropped; got != uint64(sent) {
		t.Errorf("counts add up to %d (single %d, folded %d, dropped %d), want %d", got, single, folded, dropped, sent)
	}
	// Two programs: procPerKind rows of their own each, then one folded
	// row each, the dropped row and the end.
	if single != 2*procPerKind || rows != 2*procPerKind+4 {
		t.Errorf("%d rows, %d singly: want %d singly and the rest folded", rows, single, 2*procPerKind)
	}
	var ended bool
	for _, e := range evs {
		ended = ended || e.Action == "proc.audit.end"
		if e.Action == "proc.audit.dropped" && (e.Detail["guest_lost"] != float64(7) || e.Detail["host_dropped"] != float64(89)) {
			t.Errorf("dropped row %v, want 7 lost by the guest and 89 dropped by the host", e.Detail)
		}
	}
	if !ended {
		t.Error("no proc.audit.end row for a stream the guest ended")
	}
}

func TestProcAuditOffWhereTheGuestCannot(t *testing.T) {
	t.Parallel()
	sb := store.Sandbox{ID: "offoffoffoffoffoffof"}
	// An older agent: nothing to ask, nothing recorded.
	ac, st := dialProcAgent(t, procAgent{version: agentapi.VersionPark})
	if p := startProcAudit(ac, nil, st, sb.ID, newOwner(sb.Tenant, sb.Env), slog.New(slog.DiscardHandler), clock.Real{}); p != nil {
		p.close()
		t.Fatal("audit on an agent before protocol 9")
	}
	if evs, _ := st.ListEvents(t.Context(), store.EventFilter{SandboxID: sb.ID}); len(evs) != 0 {
		t.Errorf("events for an old agent: %v", evs)
	}
	// A guest kernel without the connector (gVisor): the trail says so.
	ac, st = dialProcAgent(t, procAgent{version: agentapi.VersionProcAudit, refuse: true})
	if p := startProcAudit(ac, nil, st, sb.ID, newOwner(sb.Tenant, sb.Env), slog.New(slog.DiscardHandler), clock.Real{}); p != nil {
		p.close()
		t.Fatal("audit where the agent refused")
	}
	evs, _ := st.ListEvents(t.Context(), store.EventFilter{SandboxID: sb.ID})
	if len(evs) != 1 || evs[0].Action != "proc.audit.off" || !strings.Contains(evs[0].Detail["reason"].(string), "connector") {
		t.Errorf("events where the agent refused: %v", evs)
	}
}

// TestProcAuditRedactsTheEnvironment: a value of the sandbox's
// environment put on a command line (or in a path) is on record as its
// name, not its value; short values are left alone.
func TestProcAuditRedactsTheEnvironment(t *testing.T) {
	t.Parallel()
	rp := envRedactor(map[string]string{"OPENAI_API_KEY": "sk-live-0123456789abcdef", "DEBUG": "1", "TOKEN": "tok-98765432"})
	if rp == nil {
		t.Fatal("no redactor for an environment with values to hide")
	}
	r, ok := procRecordFrom(&agentv1.ProcEvent{Kind: agentv1.ProcEvent_KIND_EXEC, Pid: 7, Path: "/usr/bin/curl",
		Cwd:  "/tmp/tok-98765432",
		Argv: []string{"curl", "-H", "Authorization: Bearer sk-live-0123456789abcdef", "-d", "debug=1"}})
	if !ok {
		t.Fatal("a valid exec event was refused")
	}
	r.redactWith(rp)
	want := []string{"curl", "-H", "Authorization: Bearer [env OPENAI_API_KEY]", "-d", "debug=1"}
	if !slices.Equal(r.argv, want) || r.cwd != "/tmp/[env TOKEN]" || r.path != "/usr/bin/curl" {
		t.Fatalf("redacted argv %q cwd %q path %q; want %q", r.argv, r.cwd, r.path, want)
	}
	if envRedactor(map[string]string{"A": "short", "B": ""}) != nil {
		t.Error("a redactor for values too short to hide")
	}
}
