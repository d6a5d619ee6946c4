package clock

import (
	"slices"
	"sync"
	"time"
)

// Fake is a manual clock for tests: its time moves only in Advance, which
// fires the timers and tickers that fall due, in order. Safe for
// concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{} // pending
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock set to now.
func NewFake(now time.Time) *Fake {
	return &Fake{now: now, timers: map[*fakeTimer]struct{}{}}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Pending is the number of timers and tickers waiting to fire: a test
// waits for it to know that the code under test armed its timer before it
// calls Advance.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Deadlines returns when the pending timers and tickers fire next,
// earliest first: a test waits for a deadline to appear (or move) to know
// that the code under test armed (or reset) its timer.
func (f *Fake) Deadlines() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Time, 0, len(f.timers))
	for t := range f.timers {
		out = append(out, t.when)
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// Advance moves the time forward by d, firing every timer and tick due
// by then in time order (each at its own instant: Now, read by the code a
// timer wakes, may already be later). A timer's value is sent without
// blocking (a buffer of one, like the runtime's timers); an AfterFunc's
// function runs in a new goroutine.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	end := f.now.Add(d)
	for {
		var next *fakeTimer
		for t := range f.timers {
			if !t.when.After(end) && (next == nil || t.when.Before(next.when)) {
				next = t
			}
		}
		if next == nil {
			break
		}
		if next.when.After(f.now) {
			f.now = next.when
		}
		if next.period > 0 {
			next.when = next.when.Add(next.period)
		} else {
			delete(f.timers, next)
		}
		if next.fn != nil {
			go next.fn()
		} else {
			select {
			case next.ch <- f.now:
			default:
			}
		}
	}
	f.now = end
	f.mu.Unlock()
}

// NewTimer returns a timer of the fake clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	return f.add(&fakeTimer{f: f, ch: make(chan time.Time, 1)}, d)
}

// NewTicker returns a ticker of the fake clock; d must be positive.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	return fakeTicker{f.add(&fakeTimer{f: f, ch: make(chan time.Time, 1), period: d}, d)}
}

type fakeTicker struct{ t *fakeTimer }

func (k fakeTicker) C() <-chan time.Time { return k.t.ch }
func (k fakeTicker) Stop()               { k.t.Stop() }

// AfterFunc calls fn in a new goroutine once the fake time passed d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	return f.add(&fakeTimer{f: f, fn: fn}, d)
}

func (f *Fake) add(t *fakeTimer, d time.Duration) *fakeTimer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t.when = f.now.Add(d)
	f.timers[t] = struct{}{}
	if d <= 0 && t.period == 0 {
		// Due now: fire without waiting for an Advance.
		delete(f.timers, t)
		t.fireLocked(f.now)
	}
	return t
}

type fakeTimer struct {
	f      *Fake
	when   time.Time
	period time.Duration // tickers
	ch     chan time.Time
	fn     func()
}

func (t *fakeTimer) fireLocked(now time.Time) {
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.ch <- now:
	default:
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, pending := t.f.timers[t]
	delete(t.f.timers, t)
	t.drainLocked()
	return pending
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	_, pending := t.f.timers[t]
	delete(t.f.timers, t)
	t.drainLocked()
	t.f.mu.Unlock()
	t.f.add(t, d)
	return pending
}

// drainLocked drops a value sent but not received (Go 1.23 timers never
// deliver a stale one after Stop or Reset).
func (t *fakeTimer) drainLocked() {
	if t.ch == nil {
		return
	}
	select {
	case <-t.ch:
	default:
	}
}
