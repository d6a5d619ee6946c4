package clock

import (
	"slices"
	"testing"
	"time"
)

func TestFakeFiresInOrderOnlyWhenAdvanced(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := NewFake(t0)
	long := f.NewTimer(time.Hour)
	short := f.NewTimer(time.Minute)
	tick := f.NewTicker(20 * time.Second)
	fired := make(chan time.Time, 1)
	f.AfterFunc(30*time.Second, func() { fired <- f.Now() })
	if n := f.Pending(); n != 4 {
		t.Fatalf("pending %d, want 4", n)
	}
	want := []time.Time{t0.Add(20 * time.Second), t0.Add(30 * time.Second), t0.Add(time.Minute), t0.Add(time.Hour)}
	if got := f.Deadlines(); !slices.Equal(got, want) {
		t.Fatalf("deadlines %v, want %v", got, want)
	}
	select {
	case <-short.C():
		t.Fatal("a timer fired before the clock moved")
	default:
	}
	f.Advance(time.Minute)
	if got := <-short.C(); !got.Equal(t0.Add(time.Minute)) {
		t.Fatalf("short fired at %v", got)
	}
	if got := <-tick.C(); !got.Equal(t0.Add(20 * time.Second)) {
		// One slot: later ticks were dropped while nobody read.
		t.Fatalf("first kept tick at %v", got)
	}
	if got := <-fired; got.Before(t0.Add(30 * time.Second)) {
		t.Fatalf("AfterFunc ran at %v", got)
	}
	select {
	case <-long.C():
		t.Fatal("the hour timer fired after a minute")
	default:
	}
	if !f.Now().Equal(t0.Add(time.Minute)) {
		t.Fatalf("now %v", f.Now())
	}
	if !long.Reset(time.Second) {
		t.Fatal("Reset of a pending timer reported it stopped")
	}
	f.Advance(time.Second)
	if got := <-long.C(); !got.Equal(t0.Add(time.Minute + time.Second)) {
		t.Fatalf("reset timer fired at %v", got)
	}
	if long.Stop() {
		t.Fatal("Stop of a fired timer reported it pending")
	}
	tick.Stop()
	if n := f.Pending(); n != 0 {
		t.Fatalf("pending %d after everything fired or stopped", n)
	}
}

func TestFakeStopDropsAStaleValue(t *testing.T) {
	t.Parallel()
	f := NewFake(time.Unix(0, 0))
	tm := f.NewTimer(time.Second)
	f.Advance(time.Second) // fired, not received
	tm.Reset(time.Minute)
	select {
	case <-tm.C():
		t.Fatal("a stale value survived Reset")
	default:
	}
	if f.NewTimer(0); f.Pending() != 1 {
		t.Fatal("a timer due now stayed pending")
	}
}

func TestReal(t *testing.T) {
	t.Parallel()
	c := Or(nil)
	tm := c.AfterFunc(time.Hour, func() {})
	if !tm.Stop() {
		t.Fatal("Stop of a pending real timer")
	}
	if d := time.Since(c.Now()); d < 0 || d > time.Minute {
		t.Fatalf("Real.Now is %v away", d)
	}
}
