package shim

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// Guest-driven audit events (every network decision) are rate limited per
// sandbox: a guest that opens connections as fast as it can must not grow
// the host's catalog without bound (threat 17), and must not go unseen
// either. The first events, and a steady trickle after them, are recorded
// one by one; past that, events are folded into one row per kind (action,
// rule, destination class, protocol, secret names; for net.inbound the
// guest port, the way in and the result) per interval, with the count, the
// number of distinct destinations (peers, for net.inbound) and a few
// samples, and the bytes each way summed where events carry them (a folded
// row counts the events that were not recorded singly). More kinds
// in one interval than a row each are counted in a net.audit.dropped row.
// net.limit events (the outbound abuse limits) come folded from the engine,
// at most one per limit and window, and are recorded as they are.
const (
	auditBurst     = 200              // events recorded one by one before limiting
	auditRate      = 5                // then this many per second
	auditInterval  = 10 * time.Second // how often folded rows are written
	auditMaxGroups = 64               // kinds folded per interval; more are counted
	auditSamples   = 5                // destinations named in a folded row
	auditDistinct  = 4096             // distinct destinations counted exactly, per kind and interval
)

// auditKey is the kind of event rows are folded by: low-cardinality fields
// only (rule ids and classes come from a fixed set, secret names from the
// sandbox's spec; an inbound port is a published one or one the API's
// caller chose, and the groups are capped by auditMaxGroups anyway).
type auditKey struct{ action, rule, class, proto, secrets, port, via, result string }

type auditGroup struct {
	count       uint64
	first, last time.Time
	reason      string
	samples     []string
	distinct    map[string]struct{}
	moreThan    bool // distinct passed auditDistinct
	bytesIn     int64
	bytesOut    int64
	hasBytes    bool
}

// auditLimit decides which events are recorded singly and folds the rest.
// Safe for concurrent use; never blocks beyond a short mutex.
type auditLimit struct {
	mu       sync.Mutex
	lim      *rate.Limiter
	groups   map[auditKey]*auditGroup
	order    []auditKey
	overflow uint64
}

func newAuditLimit() *auditLimit {
	return &auditLimit{lim: rate.NewLimiter(auditRate, auditBurst), groups: map[auditKey]*auditGroup{}}
}

// admit reports whether e, seen at now, is recorded as it is; if not it
// has been folded into its kind's row for the current interval.
func (l *auditLimit) admit(e store.Event, now time.Time) bool {
	if e.Action == "net.limit" {
		// Already one row per limit and window (internal/egress): folding
		// it again would lose its counts.
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.AllowN(now, 1) {
		return true
	}
	k := auditKey{
		action: e.Action, rule: str(e.Detail["rule"]), class: str(e.Detail["class"]), proto: str(e.Detail["proto"]), secrets: str(e.Detail["secrets"]),
		port: str(e.Detail["port"]), via: str(e.Detail["via"]), result: str(e.Detail["result"]),
	}
	g := l.groups[k]
	if g == nil {
		if len(l.groups) >= auditMaxGroups {
			l.overflow++
			return false
		}
		g = &auditGroup{first: now, reason: str(e.Detail["reason"]), distinct: map[string]struct{}{}}
		l.groups[k] = g
		l.order = append(l.order, k)
	}
	g.count++
	g.last = now
	if in, ok := e.Detail["bytes_in"].(int64); ok {
		g.bytesIn += in
		g.hasBytes = true
	}
	if out, ok := e.Detail["bytes_out"].(int64); ok {
		g.bytesOut += out
		g.hasBytes = true
	}
	if dst := destination(e.Detail); dst != "" {
		if _, seen := g.distinct[dst]; !seen {
			if len(g.distinct) < auditDistinct {
				g.distinct[dst] = struct{}{}
			} else {
				g.moreThan = true
			}
			if len(g.samples) < auditSamples {
				g.samples = append(g.samples, dst)
			}
		}
	}
	return false
}

// flush returns the folded rows of the interval that ends now (under
// tenant and sandbox id) and starts the next one.
func (l *auditLimit) flush(tenant, id string, now time.Time) []store.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []store.Event
	for _, k := range l.order {
		g := l.groups[k]
		d := map[string]any{
			"aggregated": true,
			"count":      g.count,
			"distinct":   len(g.distinct),
			"first":      g.first.UTC().Format(time.RFC3339Nano),
			"last":       g.last.UTC().Format(time.RFC3339Nano),
			"reason":     g.reason,
		}
		if g.moreThan {
			d["distinct_at_least"] = true
		}
		if len(g.samples) > 0 {
			d["samples"] = g.samples
		}
		if g.hasBytes {
			d["bytes_in"], d["bytes_out"] = g.bytesIn, g.bytesOut
		}
		if p, err := strconv.Atoi(k.port); err == nil {
			d["port"] = p // a number, as in the rows recorded singly
		}
		for name, v := range map[string]string{"rule": k.rule, "class": k.class, "proto": k.proto, "secrets": k.secrets, "via": k.via, "result": k.result} {
			if v != "" {
				d[name] = v
			}
		}
		out = append(out, store.Event{Time: now, Tenant: tenant, SandboxID: id, Action: k.action, Detail: d})
	}
	if l.overflow > 0 {
		out = append(out, store.Event{Time: now, Tenant: tenant, SandboxID: id, Action: "net.audit.dropped",
			Detail: map[string]any{"count": l.overflow, "reason": fmt.Sprintf("more than %d kinds of network events in %s; counted, not recorded", auditMaxGroups, auditInterval)}})
	}
	clear(l.groups)
	l.order = l.order[:0]
	l.overflow = 0
	return out
}

// destination names where an event went (its address, DNS name or host)
// or, for an inbound connection, where it came from.
func destination(d map[string]any) string {
	for _, k := range []string{"dst", "name", "host", "peer"} {
		if s := str(d[k]); s != "" {
			return s
		}
	}
	return ""
}

// str renders a detail value as a key: strings as they are, string lists
// joined.
func str(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []string:
		return strings.Join(v, ",")
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}
