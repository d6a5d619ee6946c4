package shim

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestAuditLimitFoldsAFlood: past the burst, events are folded by kind;
// every event is either recorded singly or counted in its kind's row, and
// more kinds than rows are counted as dropped.
func TestAuditLimitFoldsAFlood(t *testing.T) {
	t.Parallel()
	l := newAuditLimit()
	sb := store.Sandbox{ID: "sb1", Tenant: "acme"}
	now := time.Unix(1000, 0)
	deny := func(i int, rule string) store.Event {
		return store.Event{Action: "net.deny", Detail: map[string]any{"proto": "udp", "dst": fmt.Sprintf("10.0.%d.%d:9", i/256%256, i%256), "rule": rule, "class": "private", "reason": "denied: private"}}
	}
	single := 0
	const n = 10000
	for i := range n {
		if l.admit(deny(i, "floor"), now) {
			single++
		}
	}
	if single != auditBurst {
		t.Fatalf("%d events recorded singly at one instant, want the burst %d", single, auditBurst)
	}
	rows := l.flush(sb.Tenant, sb.ID, now)
	if len(rows) != 1 {
		t.Fatalf("%d folded rows, want 1: %v", len(rows), rows)
	}
	d := rows[0].Detail
	if rows[0].Action != "net.deny" || d["count"] != uint64(n-auditBurst) || d["rule"] != "floor" || d["class"] != "private" || d["aggregated"] != true {
		t.Fatalf("folded row: %s %v", rows[0].Action, d)
	}
	if d["distinct"] != auditDistinct || d["distinct_at_least"] != true || len(d["samples"].([]string)) != auditSamples {
		t.Fatalf("distinct %v, samples %v", d["distinct"], d["samples"])
	}
	if rows[0].Tenant != "acme" || rows[0].SandboxID != "sb1" {
		t.Fatalf("folded row not attributed: %+v", rows[0])
	}
	if again := l.flush(sb.Tenant, sb.ID, now); len(again) != 0 {
		t.Fatalf("a flush with nothing folded wrote %v", again)
	}

	// The bucket refills at auditRate: one second later that many pass.
	now = now.Add(time.Second)
	single = 0
	for i := range 100 {
		if l.admit(deny(i, "floor"), now) {
			single++
		}
	}
	if single != auditRate {
		t.Fatalf("%d singles after a second, want %d", single, auditRate)
	}
	// More kinds than rows: the rest is counted, not lost.
	l.flush(sb.Tenant, sb.ID, now)
	for i := range auditMaxGroups + 10 {
		l.admit(deny(i, fmt.Sprintf("rule-%d", i)), now)
		l.admit(deny(i, fmt.Sprintf("rule-%d", i)), now)
	}
	rows = l.flush(sb.Tenant, sb.ID, now)
	if len(rows) != auditMaxGroups+1 {
		t.Fatalf("%d rows, want %d kinds and one overflow row", len(rows), auditMaxGroups)
	}
	last := rows[len(rows)-1]
	if last.Action != "net.audit.dropped" || last.Detail["count"] != uint64(20) {
		t.Fatalf("overflow row: %s %v", last.Action, last.Detail)
	}
}

// TestAuditorFloodBoundsCatalog: a flood of 200,000 denied destinations
// through the shim's auditor, as the egress engine delivers them, leaves
// a few hundred rows in a real catalog, and the counts add up to the flood.
// TestAuditLimitKeepsLimitEvents: the engine's net.limit rows are already
// folded; a flood that exhausted the bucket does not fold them again.
func TestAuditLimitKeepsLimitEvents(t *testing.T) {
	t.Parallel()
	l := newAuditLimit()
	now := time.Unix(1000, 0)
	for i := range auditBurst + 10 {
		l.admit(store.Event{Action: "net.allow", Detail: map[string]any{"dst": fmt.Sprint(i)}}, now)
	}
	if !l.admit(store.Event{Action: "net.limit", Detail: map[string]any{"rule": "limit:dests", "count": uint64(900), "aggregated": true}}, now) {
		t.Fatal("a net.limit row was folded")
	}
}

func TestAuditorFloodBoundsCatalog(t *testing.T) {
	t.Parallel()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sb := store.Sandbox{ID: "sbflood", Tenant: "acme"}
	clk := clock.NewFake(time.Now()) // recent: the catalog keeps 90 days
	a := newAuditor(st, sb.ID, newOwner(sb.Tenant, nil).tenant, slog.New(slog.DiscardHandler), clk)
	const n = 200000
	for i := range n {
		if i%1000 == 0 {
			clk.Advance(50 * time.Millisecond) // 200,000 events over 10 s
		}
		a.add(egress.Event{Action: "net.deny", Detail: map[string]any{"proto": "udp", "dst": fmt.Sprintf("10.%d.%d.%d:53", i>>16&255, i>>8&255, i&255), "rule": "floor", "class": "private"}})
	}
	a.close()
	evs, err := st.ListEvents(t.Context(), store.EventFilter{SandboxID: sb.ID, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var singles, folded, dropped uint64
	for _, e := range evs {
		switch {
		case e.Action == "net.audit.dropped":
			dropped += uint64(e.Detail["count"].(float64))
		case e.Detail["aggregated"] == true:
			folded += uint64(e.Detail["count"].(float64))
		default:
			singles++
		}
	}
	t.Logf("%d rows: %d single, %d folded, %d dropped", len(evs), singles, folded, dropped)
	if len(evs) > 500 {
		t.Errorf("a flood of %d events wrote %d rows", n, len(evs))
	}
	if singles+folded+dropped != n || folded == 0 {
		t.Errorf("the rows account for %d of %d events (single %d, folded %d, dropped %d)", singles+folded+dropped, n, singles, folded, dropped)
	}
}
