package egress

import (
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// Outbound abuse limits (netconf.Spec's ConnRate, DestsPerMin and UDPRate).
const (
	// defaultLimitWindow is how long the refusals of one limit are folded
	// into one net.limit event.
	defaultLimitWindow = 10 * time.Second
	// destWindow is the period DestsPerMin counts distinct destinations
	// over (fixed windows: a guest may reach twice the limit across a
	// window's edge).
	destWindow = time.Minute
	// limitSamples is how many distinct destinations a net.limit event
	// names.
	limitSamples = 5
)

// The rule ids of net.limit events.
const (
	LimitConnRate = "limit:conn_rate"
	LimitDests    = "limit:dests"
	LimitUDPRate  = "limit:udp_rate"
)

// limiter enforces one sandbox's outbound abuse limits and folds what they
// refuse into one audit event per limit and window. Safe for concurrent
// use; it never blocks beyond a short mutex.
type limiter struct {
	now    func() time.Time
	emit   func(Event)
	window time.Duration
	spec   netconf.Spec // the limits as configured, for the events

	conns    *rate.Limiter // nil: no connection rate limit
	udp      *rate.Limiter // nil: no UDP packet rate limit
	destsMax int           // 0: no destinations limit

	mu        sync.Mutex
	destStart time.Time
	dests     map[netip.AddrPort]struct{}
	refused   map[string]*refusals // by rule id
	order     []string
	timer     *time.Timer // armed while refused holds something
	closed    bool
	limited   uint64 // flows refused, ever
	dropped   uint64 // datagrams dropped, ever
}

// refusals are what one limit refused in the current window.
type refusals struct {
	count       uint64
	first, last time.Time
	protos      []string
	samples     []string
}

// newLimiter returns the limiter of spec (normalised: -1 means no limit).
func newLimiter(spec netconf.Spec, now func() time.Time, window time.Duration, emit func(Event)) *limiter {
	l := &limiter{now: now, emit: emit, window: window, spec: spec, dests: map[netip.AddrPort]struct{}{}, refused: map[string]*refusals{}}
	if spec.ConnRate > 0 {
		l.conns = rate.NewLimiter(rate.Limit(spec.ConnRate), spec.ConnRate*netconf.ConnBurstFactor)
	}
	if spec.UDPRate > 0 {
		l.udp = rate.NewLimiter(rate.Limit(spec.UDPRate), spec.UDPRate)
	}
	if spec.DestsPerMin > 0 {
		l.destsMax = spec.DestsPerMin
	}
	return l
}

// flow decides whether the guest may open a new flow to dst (one the
// policy allowed): "" if so, else the rule id of the limit that refuses it
// (recorded). A refused flow takes no token and adds no destination.
func (l *limiter) flow(proto string, dst netip.AddrPort) string {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.destsMax > 0 && now.Sub(l.destStart) >= destWindow {
		l.destStart = now
		clear(l.dests)
	}
	_, known := l.dests[dst]
	rule := ""
	switch {
	case l.destsMax > 0 && !known && len(l.dests) >= l.destsMax:
		rule = LimitDests
	case l.conns != nil && !l.conns.AllowN(now, 1):
		rule = LimitConnRate
	}
	if rule != "" {
		l.limited++
		l.refuseLocked(rule, proto, dst, now)
		return rule
	}
	if l.destsMax > 0 && !known {
		l.dests[dst] = struct{}{}
	}
	return ""
}

// datagram reports whether the guest may send one more UDP datagram to
// dst; a refused one is counted and recorded.
func (l *limiter) datagram(dst netip.AddrPort) bool { return l.packet("udp", dst) }

// packet takes one token of the packet rate limit (udp_pps) for a packet
// of proto to dst; a refused one is counted and recorded.
func (l *limiter) packet(proto string, dst netip.AddrPort) bool {
	if l.udp == nil {
		return true
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.udp.AllowN(now, 1) {
		return true
	}
	l.dropped++
	l.refuseLocked(LimitUDPRate, proto, dst, now)
	return false
}

func (l *limiter) refuseLocked(rule, proto string, dst netip.AddrPort, now time.Time) {
	r := l.refused[rule]
	if r == nil {
		r = &refusals{first: now}
		l.refused[rule] = r
		l.order = append(l.order, rule)
	}
	r.count++
	r.last = now
	if !slices.Contains(r.protos, proto) {
		r.protos = append(r.protos, proto)
	}
	if s := dst.String(); len(r.samples) < limitSamples && !slices.Contains(r.samples, s) {
		r.samples = append(r.samples, s)
	}
	if l.timer == nil && !l.closed {
		l.timer = time.AfterFunc(l.window, l.flush)
	}
}

// flush emits the folded events of the window that ends now.
func (l *limiter) flush() {
	l.mu.Lock()
	evs := l.takeLocked()
	l.timer = nil
	l.mu.Unlock()
	for _, e := range evs {
		l.emit(e)
	}
}

// close emits what is folded and stops the window timer; later refusals
// are counted but never emitted. Idempotent.
func (l *limiter) close() {
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	evs := l.takeLocked()
	l.mu.Unlock()
	for _, e := range evs {
		l.emit(e)
	}
}

func (l *limiter) takeLocked() []Event {
	var out []Event
	for _, rule := range l.order {
		r := l.refused[rule]
		d := map[string]any{
			"aggregated": true,
			"rule":       rule,
			"count":      r.count,
			"first":      r.first.UTC().Format(time.RFC3339Nano),
			"last":       r.last.UTC().Format(time.RFC3339Nano),
			"protos":     r.protos,
			"samples":    r.samples,
			"reason":     l.reason(rule),
		}
		out = append(out, Event{Action: "net.limit", Detail: d})
	}
	clear(l.refused)
	l.order = l.order[:0]
	return out
}

func (l *limiter) reason(rule string) string {
	switch rule {
	case LimitDests:
		return "refused: the sandbox reached its limit of " + strconv.Itoa(l.spec.DestsPerMin) + " distinct destinations (address:port) per minute; new connections to other destinations were reset"
	case LimitConnRate:
		return "refused: the sandbox opened new connections faster than its limit of " + strconv.Itoa(l.spec.ConnRate) + " per second; they were reset"
	default:
		return "dropped: the sandbox sent UDP datagrams faster than its limit of " + strconv.Itoa(l.spec.UDPRate) + " per second"
	}
}

// counts returns the flows refused and the datagrams dropped so far.
func (l *limiter) counts() (flows, datagrams uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limited, l.dropped
}
