package store

import (
	"slices"
	"testing"
	"time"
)

// TestActivity counts creates and failures by hour, for one tenant and
// for all; events before the window, after it and of other actions are
// left out.
func TestActivity(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := Open(ctx, catalogAt(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	since := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	at := func(h, m int) time.Time { return since.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute) }
	for _, e := range []Event{
		{Time: at(-1, 0), Tenant: "a", Action: "sandbox.create"}, // before the window
		{Time: at(0, 0), Tenant: "a", Action: "sandbox.create"},
		{Time: at(0, 59), Tenant: "b", Action: "sandbox.create"},
		{Time: at(1, 5), Tenant: "a", Action: "exec.start"},
		{Time: at(2, 30), Tenant: "a", Action: "sandbox.fail"},
		{Time: at(2, 31), Tenant: "a", Action: "sandbox.create"},
		{Time: at(3, 0), Tenant: "a", Action: "sandbox.create"}, // after the window
	} {
		if _, err := s.AppendEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	f := ActivityFilter{Actions: []string{"sandbox.create", "sandbox.fail"}, Since: since, Step: time.Hour, Buckets: 3}
	got, err := s.Activity(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got["sandbox.create"], []int{2, 0, 1}) || !slices.Equal(got["sandbox.fail"], []int{0, 0, 1}) {
		t.Errorf("every tenant: %v", got)
	}
	f.Tenant = "a"
	got, err = s.Activity(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got["sandbox.create"], []int{1, 0, 1}) || !slices.Equal(got["sandbox.fail"], []int{0, 0, 1}) {
		t.Errorf("tenant a: %v", got)
	}
	// Every start of the search finds the window's first event.
	for h := -2; h <= 4; h++ {
		seq, err := s.firstSeqAt(ctx, at(h, 0).UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		evs, _ := s.ListEvents(ctx, EventFilter{})
		want := int64(len(evs) + 1)
		for _, e := range evs {
			if !e.Time.Before(at(h, 0)) {
				want = e.Seq
				break
			}
		}
		if seq != want {
			t.Errorf("first seq at %dh: %d, want %d", h, seq, want)
		}
	}
	if _, err := s.Activity(ctx, ActivityFilter{Actions: []string{"x"}, Step: time.Hour}); err == nil {
		t.Error("0 buckets accepted")
	}
}
