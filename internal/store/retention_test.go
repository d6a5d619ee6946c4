package store

import (
	"strings"
	"testing"
	"time"
)

// TestRetentionByAge: events older than the max age go, younger stay; the
// setting is the catalog's (another Store on the same file reads it).
func TestRetentionByAge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := catalogAt(t)
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := s.Retention(ctx); err != nil || r != DefaultRetention {
		t.Fatalf("a new catalog's retention: %+v, %v", r, err)
	}
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	for i := range 12000 { // more than two delete batches of old events
		if _, err := s.AppendEvent(ctx, Event{Time: now.Add(-48 * time.Hour), SandboxID: "old", Action: "exec.start"}); err != nil {
			t.Fatal(err)
		}
		if i%4000 == 0 {
			if _, err := s.AppendEvent(ctx, Event{Time: now.Add(-time.Hour), SandboxID: "new", Action: "exec.start"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	other, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.SetRetention(ctx, Retention{MaxAge: 24 * time.Hour, MaxBytes: DefaultRetention.MaxBytes}); err != nil {
		t.Fatal(err)
	}
	n, err := s.PruneEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 12000 {
		t.Errorf("pruned %d events, want the 12000 older than a day", n)
	}
	evs, err := s.ListEvents(ctx, EventFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 3 {
		t.Fatalf("%d events left, want the 3 from an hour ago", len(evs))
	}
	for _, e := range evs {
		if e.SandboxID != "new" {
			t.Errorf("kept %+v", e)
		}
	}
	for _, bad := range []Retention{{MaxAge: time.Minute}, {MaxAge: -1}, {MaxBytes: 1 << 20}, {MaxBytes: -5}} {
		if err := s.SetRetention(ctx, bad); err == nil {
			t.Errorf("retention %+v accepted", bad)
		}
	}
}

// TestRetentionBySize: appending past the size bound keeps the catalog's
// used size near it (prunes run on their own every pruneEvery appends),
// the newest events stay, and the cut is recorded.
func TestRetentionBySize(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.SetRetention(ctx, Retention{MaxBytes: minRetentionBytes}); err != nil {
		t.Fatal(err)
	}
	pad := strings.Repeat("x", 4000)
	var last int64
	for range 12000 { // about 48 MB of events, three times the bound
		if last, err = s.AppendEvent(ctx, Event{SandboxID: "s", Action: "exec.start", Detail: map[string]any{"argv": pad}}); err != nil {
			t.Fatal(err)
		}
	}
	used, err := s.UsedBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Between two prunes at most pruneEvery events (4 MB here) are added.
	if limit := int64(minRetentionBytes + pruneEvery*4200); used > limit {
		t.Errorf("catalog uses %d bytes after 48 MB of events; bound %d", used, limit)
	}
	evs, err := s.ListEvents(ctx, EventFilter{Since: last - 1})
	if err != nil || len(evs) != 1 {
		t.Fatalf("the newest event is gone: %v %v", evs, err)
	}
	cuts, err := s.ListEvents(ctx, EventFilter{Type: "audit.prune"})
	if err != nil || len(cuts) == 0 {
		t.Fatalf("no audit.prune event: %v", err)
	}
	if cuts[0].Detail["deleted"].(float64) <= 0 {
		t.Errorf("prune event: %v", cuts[0].Detail)
	}
	t.Logf("used %d bytes, %d prune events", used, len(cuts))
}
