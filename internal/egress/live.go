package egress

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// livePolicy is the policy an engine decides with; SetPolicy replaces it
// whole, never in part.
type livePolicy struct {
	pol    policy.Policy
	domain map[string]bool // IDs of pol's domain rules
}

func newLivePolicy(pol policy.Policy) *livePolicy {
	lp := &livePolicy{pol: pol, domain: map[string]bool{}}
	for _, r := range pol.Rules() {
		if r.Domain != "" {
			lp.domain[r.ID] = true
		}
	}
	return lp
}

// decide decides one flow: the destination with the names the sandbox
// resolved to it and, when the flow sent a TLS ClientHello, its SNI.
func (lp *livePolicy) decide(network string, dst netip.AddrPort, names []string, sni string) policy.Decision {
	r := policy.Request{Proto: network, Dst: dst, SNI: sni}
	if len(names) > 0 {
		r.Name, r.Names = names[0], names[1:]
	}
	return policy.Decide(lp.pol, r)
}

// redecide decides an open flow as the engine would decide it new: at dial
// time without SNI, then, when a domain rule allows it and it sent one,
// with its SNI. A TCP connection that a domain rule allows and whose first
// bytes the engine has not read yet is kept when the engine will read them
// (checkHello then decides its SNI with the policy in force); one whose
// bytes the engine never reads (it was opened under a policy that needed
// no SNI check) cannot be checked and is denied (fail closed: the guest
// reconnects and is checked).
func (lp *livePolicy) redecide(f *flowRef) policy.Decision {
	d := lp.decide(f.proto, f.dst, f.names, "")
	if !d.Allow || !lp.domain[d.RuleID] || f.proto != "tcp" {
		return d
	}
	sni, inspected := f.hello()
	switch {
	case sni != "":
		if ds := lp.decide(f.proto, f.dst, f.names, sni); !ds.Allow {
			return withSNI(ds, sni)
		}
	case !inspected && !f.willInspect:
		return policy.Decision{RuleID: "sni:unchecked", Class: d.Class, Addr: d.Addr,
			Reason: "denied: " + d.RuleID + " is a domain rule, which checks a TLS connection's SNI, and this connection's was never read (it was opened under a policy that did not need it)"}
	}
	return d
}

// SetPolicy replaces the egress policy (mode and allow rules, as
// policy.ParsePolicy takes them; the host's addresses stay denied) at
// once: DNS queries, new flows and SNI checks are decided by it from now
// on, and every open TCP connection and UDP flow it would not allow if
// it were new is closed, each recorded as a "net.deny" event. It returns
// how many were closed. On an error nothing changes. Safe for concurrent
// use; concurrent calls apply in some order, the last one wins.
func (e *Engine) SetPolicy(mode string, allow []string) (closed int, err error) {
	pol, err := policy.ParsePolicy(mode, allow)
	if err != nil {
		return 0, err
	}
	pol = pol.WithHostAddrs(e.cfg.HostAddrs...)
	lp := newLivePolicy(pol)
	type victim struct {
		f *flowRef
		d policy.Decision
	}
	var victims []victim
	e.flowMu.Lock()
	e.live.Store(lp)
	if e.res != nil {
		e.res.SetPolicy(pol)
	}
	for f := range e.flows {
		if d := lp.redecide(f); !d.Allow {
			delete(e.flows, f)
			victims = append(victims, victim{f, d})
		}
	}
	e.flowMu.Unlock()
	// Closing outside flowMu: a conn's Close untracks it, which takes it.
	for _, v := range victims {
		v.f.close()
		v.d.Reason = "closed by a policy change: " + v.d.Reason
		e.audit("net.deny", v.f.proto, v.f.dst, v.f.names, v.d)
	}
	return len(victims), nil
}

// track records an allowed flow as open. decided is the policy that
// allowed it: if SetPolicy replaced it meanwhile, the flow is decided
// again and, when the new policy denies it, not tracked (ok false, with
// the denial). Holding flowMu across the check and the insert means a
// flow is either seen by SetPolicy's sweep or decided by its policy.
func (e *Engine) track(f *flowRef, decided *livePolicy) (policy.Decision, bool) {
	e.flowMu.Lock()
	defer e.flowMu.Unlock()
	if cur := e.live.Load(); cur != decided {
		if d := cur.redecide(f); !d.Allow {
			return d, false
		}
	}
	if f.sec != e.sec.Load() {
		// SetSecrets ran while the upstream was dialled; fail closed.
		return policy.Decision{RuleID: "secrets:changed", Reason: "denied: the sandbox's secrets changed while this connection was dialled (reconnect)"}, false
	}
	e.flows[f] = struct{}{}
	return policy.Decision{}, true
}

func (e *Engine) untrack(f *flowRef) {
	e.flowMu.Lock()
	delete(e.flows, f)
	e.flowMu.Unlock()
}

// openFlows counts the flows SetPolicy would look at (tests).
func (e *Engine) openFlows() int {
	e.flowMu.Lock()
	defer e.flowMu.Unlock()
	return len(e.flows)
}

// flowRef is one open flow as SetPolicy sees it.
type flowRef struct {
	proto string
	dst   netip.AddrPort
	names []string // the names pinned to dst when it was dialled
	// willInspect: the engine reads the guest's first bytes (SNI check or
	// placeholder scan) rather than copying them blindly.
	willInspect bool
	// sec is the secret set in force when it was dialled (SetSecrets).
	sec *secretSet

	intercepted atomic.Bool // the secret interceptor serves it

	mu        sync.Mutex
	sni       string   // the TLS SNI the guest sent, if any
	inspected bool     // the engine read the guest's first bytes (and SNI, if TLS)
	guest     net.Conn // the guest's end, once the engine handles it
	up        net.Conn // the upstream; set before the flow is tracked
}

func (f *flowRef) markIntercepted() { f.intercepted.Store(true) }

func (f *flowRef) wasIntercepted() bool { return f.intercepted.Load() }

func (f *flowRef) setSNI(sni string) {
	f.mu.Lock()
	f.sni = sni
	f.mu.Unlock()
}

func (f *flowRef) markInspected() {
	f.mu.Lock()
	f.inspected = true
	f.mu.Unlock()
}

// hello is the SNI the guest sent ("" if none or not read) and whether
// its first bytes were read.
func (f *flowRef) hello() (sni string, inspected bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sni, f.inspected || f.sni != ""
}

func (f *flowRef) setGuest(c net.Conn) {
	f.mu.Lock()
	f.guest = c
	f.mu.Unlock()
}

// close ends the flow: closing the upstream ends the stack's copy (which
// closes the guest's end); the guest's end is closed too when the engine
// holds it, so a flow still waiting for the guest's first bytes ends now.
func (f *flowRef) close() {
	f.mu.Lock()
	g, up := f.guest, f.up
	f.mu.Unlock()
	if up != nil {
		_ = up.Close()
	}
	if g != nil {
		_ = g.Close()
	}
}

// trackedConn is an allowed flow's upstream; closing it untracks the flow.
type trackedConn struct {
	net.Conn
	e    *Engine
	ref  *flowRef
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.e.untrack(c.ref) })
	return err
}

// CloseWrite half-closes the upstream when it can (TCP).
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
