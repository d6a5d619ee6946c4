// Package clock is the time source that components with timers take in
// their Config (shim.Config.Clock): Real is the system clock, and Fake is a
// manual clock for tests, whose timers fire only when the test moves it
// (Advance), so that a test of a lifetime, an idle pause or a timeout waits
// for nothing and can run beside others.
//
// Only deadlines a component decides on go through a Clock. Deadlines
// handed to the kernel or the network (net.Conn.SetDeadline,
// context.WithTimeout around an RPC) stay on the system clock: they bound
// real I/O.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and makes timers. Implementations are safe for
// concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that sends the time on its channel once,
	// after d.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that sends the time on its channel every
	// d (d > 0), dropping ticks a slow reader misses.
	NewTicker(d time.Duration) Ticker
	// AfterFunc calls f in its own goroutine after d. The returned timer's
	// channel is nil.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer, as time.Timer (Go 1.23 semantics: after Stop
// or Reset no stale value is received).
type Timer interface {
	// C is the channel the time is sent on (nil for AfterFunc).
	C() <-chan time.Time
	// Stop stops the timer; it reports whether it was still pending.
	Stop() bool
	// Reset makes the timer fire after d from now; it reports whether it
	// was still pending.
	Reset(d time.Duration) bool
}

// Ticker is a periodic timer, as time.Ticker.
type Ticker interface {
	// C is the channel the ticks are sent on.
	C() <-chan time.Time
	// Stop stops the ticker.
	Stop()
}

// Real is the system clock.
type Real struct{}

var _ Clock = Real{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// NewTimer is time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker is time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// AfterFunc is time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Or returns c, or Real when c is nil (a Config's default).
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Sleep waits d on the system clock, or until ctx is done (then it returns
// the context's cause).
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
