// Package egress is one sandbox's network as the shim runs it: the
// user-space stack (internal/netstack) on the guest's link, the DNS server
// (internal/dns) on port 53 of every address, the egress policy
// (internal/policy) decided on the resolved destination at dial time, the
// secret interceptor (internal/secrets) for hosts that have secrets, byte-rate
// limits, the outbound abuse limits (limits.go), and an audit event for every
// decision.
//
// # A guest TCP flow
//
//  1. Port 53 (any address) goes to the DNS server.
//  2. policy.Decide on the destination the guest addressed, with the names
//     this sandbox resolved to that address (DNS pins) and the host's own
//     addresses. A denial is an RST the guest sees at once ("net.deny").
//  3. The outbound abuse limits (netconf.Spec's ConnRate and DestsPerMin)
//     count the flow; over either, the flow gets an RST and is folded into
//     one "net.limit" event per limit and LimitWindow (count, a few sample
//     destinations), never one event per attempt.
//  4. The engine dials the destination ("net.allow", or "net.error" with
//     the dial error, also an RST). Only then does the guest's handshake
//     complete.
//  5. When the flow was allowed by a domain rule, or the sandbox has
//     secrets, the engine looks at the guest's first bytes before it
//     forwards any: a TLS ClientHello's SNI must satisfy the policy (same
//     rule, pinned name); a ClientHello whose SNI is a secret's host and is
//     pinned to this destination is intercepted (secrets.Interceptor);
//     every other flow is relayed with its guest-to-upstream bytes scanned
//     for placeholders, and a placeholder ends the flow
//     ("net.secret.block"). If the guest says nothing for firstByteWait
//     (secretFirstByteWait to an address pinned to a secret's host),
//     upstream bytes start to flow (server-first protocols) but guest bytes
//     are still checked before they are forwarded.
//
// UDP flows are decided the same way per flow; each datagram the guest sends
// takes a token of the packet rate limit (UDPRate; excess datagrams are
// dropped, counted and folded into "net.limit" events) and is scanned for
// placeholders when the sandbox has secrets. Mail ports (25, 465, 587) are
// the policy's business: closed in mode public unless a rule names the port
// (policy "mail:closed").
//
// # Live policy
//
// [Engine.SetPolicy] replaces the egress policy while the guest runs: the
// new policy decides every flow, DNS query and SNI check from then on, and
// each open TCP connection or UDP flow (DNS excepted: its answers are
// decided per query) is decided again, as a new one to the same
// destination with the names it was pinned to and the SNI it sent would
// be; those the new policy denies are closed, each with a "net.deny" event
// whose reason says the policy changed (live.go). A connection that only a
// domain rule allows needs its SNI checked: one whose bytes were copied
// blindly (opened when no check was needed) is closed ("sni:unchecked").
package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-sandbox/airlock/internal/dns"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/netstack"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/secrets"
)

const (
	// firstByteWait is how long an inspected flow waits for the guest to
	// speak before upstream bytes may flow to the guest.
	firstByteWait = 300 * time.Millisecond
	// secretFirstByteWait replaces it for a flow to an address pinned to a
	// secret's host: once upstream bytes flow the flow can no longer be
	// intercepted, and a TLS client speaks first, however slowly (a
	// loaded or emulated guest can take well over firstByteWait between
	// its connect and its ClientHello).
	secretFirstByteWait = helloTimeout
	// helloTimeout bounds reading a whole ClientHello.
	helloTimeout = 10 * time.Second
	// helloBuf holds the largest ClientHello PeekClientHello accepts.
	helloBuf = 16<<10 + 5 + 512
	// Pin lifetimes: guests may cache answers longer than the TTL they
	// were given, so pins outlive it.
	pinMinTTL  = 10 * time.Minute
	pinMaxTTL  = time.Hour
	pinEntries = 4096
)

// DialFunc dials the real destination ("tcp" or "udp", "ip:port").
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Config configures an Engine.
type Config struct {
	// Spec is the sandbox's normalised network spec (netconf.Spec.Normalize).
	Spec netconf.Spec
	// Secrets are the values of Spec.Secrets.
	Secrets netconf.Values
	// HostAddrs are the host's own addresses, denied like the floor.
	HostAddrs []netip.Addr
	// DNSUpstream are the resolvers queries are forwarded to ("ip:port").
	DNSUpstream []string
	// Dial reaches real destinations; nil uses a net.Dialer.
	Dial DialFunc
	// Ping sends the ICMP echo requests the policy allows (icmp.go); nil
	// uses SystemPing.
	Ping PingFunc
	// UpstreamRoots verifies intercepted upstreams' certificates; nil
	// means the system pool.
	UpstreamRoots *x509.CertPool
	// Audit receives one event per decision, synchronously: it must not
	// block. May be nil.
	Audit func(Event)
	// Logger receives debug logs; nil discards.
	Logger *slog.Logger
	// Clock gives the time for pins, DNS and the outbound abuse limits;
	// nil means time.Now.
	Clock func() time.Time
	// LimitWindow is how long the refusals of one outbound abuse limit are
	// folded into one net.limit event (0: 10 s). The window's end is timed
	// on the real clock.
	LimitWindow time.Duration
}

// Event is one audit record. Action starts with "net."; Detail never holds
// a secret value.
type Event struct {
	Action string
	Detail map[string]any
}

// Engine is one sandbox's network.
type Engine struct {
	cfg    Config
	live   atomic.Pointer[livePolicy] // swapped whole by SetPolicy, under flowMu
	pins   *policy.PinSet
	res    *dns.Resolver
	stack  *netstack.Stack
	sec    atomic.Pointer[secretSet] // swapped whole by SetSecrets, under flowMu
	secMu  sync.Mutex                // serializes SetSecrets
	up     *rate.Limiter
	down   *rate.Limiter
	lim    *limiter
	sent   atomic.Uint64 // bytes written upstream
	ctx    context.Context
	cancel context.CancelFunc

	flowMu sync.Mutex
	flows  map[*flowRef]struct{} // open TCP connections and UDP flows (not DNS)
}

// New builds the engine; ServeLink then runs it on the guest's link.
func New(cfg Config) (*Engine, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if cfg.Audit == nil {
		cfg.Audit = func(Event) {}
	}
	if cfg.Ping == nil {
		cfg.Ping = SystemPing
	}
	pol, err := cfg.Spec.Policy()
	if err != nil {
		return nil, err
	}
	pol = pol.WithHostAddrs(cfg.HostAddrs...)
	e := &Engine{cfg: cfg, pins: policy.NewPinSet(pinMinTTL, pinMaxTTL, pinEntries), flows: map[*flowRef]struct{}{}}
	e.live.Store(newLivePolicy(pol))
	if cfg.LimitWindow <= 0 {
		cfg.LimitWindow = defaultLimitWindow
	}
	lspec, err := netconf.Spec{ConnRate: cfg.Spec.ConnRate, DestsPerMin: cfg.Spec.DestsPerMin, UDPRate: cfg.Spec.UDPRate}.Normalize(nil)
	if err != nil {
		return nil, err
	}
	e.lim = newLimiter(lspec, cfg.Clock, cfg.LimitWindow, cfg.Audit)
	e.ctx, e.cancel = context.WithCancel(context.Background())

	if len(cfg.DNSUpstream) > 0 {
		e.res, err = dns.New(dns.Config{
			Policy:   pol,
			Pins:     e.pins,
			Upstream: cfg.DNSUpstream,
			Clock:    cfg.Clock,
			Audit:    e.auditDNS,
			Logger:   cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("dns: %w", err)
		}
	}

	set, err := e.newSecretSet(cfg.Spec.Secrets, cfg.Secrets, nil)
	if err != nil {
		return nil, err
	}
	e.sec.Store(set)
	if r := cfg.Spec.RateBytes; r > 0 {
		burst := int(min(max(r, 64<<10), 4<<20))
		e.up = rate.NewLimiter(rate.Limit(r), burst)
		e.down = rate.NewLimiter(rate.Limit(r), burst)
	}
	maxConns := cfg.Spec.MaxConns
	if maxConns == 0 {
		maxConns = netconf.DefaultMaxConns
	}
	guestMAC, err := net.ParseMAC(netconf.GuestMAC)
	if err != nil {
		return nil, err
	}
	e.stack, err = netstack.New(netstack.Config{
		GatewayIP: netconf.GatewayIP,
		GuestIP:   netconf.GuestIP,
		GuestMAC:  guestMAC,
		Dial:      e.dial,
		Ping:      e.ping,
		MaxConns:  maxConns,
		Busy:      e.auditBusy,
		Logger:    cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// ServeLink runs the network on the guest's link until ctx ends, the link
// fails or Close.
func (e *Engine) ServeLink(ctx context.Context, link io.ReadWriter) error {
	return e.stack.ServeLink(ctx, link)
}

// DialGuest opens a TCP stream to a guest port, from the gateway.
func (e *Engine) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	return e.stack.DialGuest(ctx, port)
}

// CACertPEM is the certificate of the interception CA the guest must trust,
// or nil when the sandbox has no secrets. SetSecrets may change it.
func (e *Engine) CACertPEM() []byte {
	if ca := e.sec.Load().ca; ca != nil {
		return ca.CertPEM()
	}
	return nil
}

// Stats returns the stack's counters.
func (e *Engine) Stats() netstack.Stats { return e.stack.Stats() }

// Usage is what the engine counts beyond the stack's counters.
type Usage struct {
	// EgressBytes is the payload the host sent upstream for the guest:
	// TCP bytes (TLS records as they went out, for intercepted flows) and
	// UDP datagrams, without headers; DNS answered by the engine is not
	// counted.
	EgressBytes uint64
	// FlowsLimited counts new flows the outbound abuse limits refused
	// (connection rate, distinct destinations); DatagramsLimited the UDP
	// datagrams the packet rate limit dropped.
	FlowsLimited, DatagramsLimited uint64
}

// Usage returns the engine's counters. Safe for concurrent use.
func (e *Engine) Usage() Usage {
	f, d := e.lim.counts()
	return Usage{EgressBytes: e.sent.Load(), FlowsLimited: f, DatagramsLimited: d}
}

// Close stops everything and emits the net.limit events still folded;
// idempotent.
func (e *Engine) Close() error {
	e.cancel()
	err := e.stack.Close()
	e.lim.close()
	return err
}

// dial is the netstack's egress hook.
func (e *Engine) dial(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error) {
	if dst.Port() == 53 {
		if e.res == nil {
			e.audit("net.deny", network, dst, nil, policy.Decision{RuleID: "dns:unavailable", Reason: "denied: no DNS upstream is configured on the host"})
			return nil, errors.New("no DNS upstream")
		}
		if network == "tcp" {
			return &dnsStream{e: e}, nil
		}
		return newDNSPacket(e), nil
	}
	names := e.pins.Lookup(dst.Addr(), e.cfg.Clock())
	lp := e.live.Load()
	d := lp.decide(network, dst, names, "")
	if !d.Allow {
		e.audit("net.deny", network, dst, names, d)
		return nil, errors.New(d.Reason)
	}
	if rule := e.lim.flow(network, dst); rule != "" {
		// Folded into one net.limit event per window, not audited here.
		return nil, errors.New("refused by " + rule)
	}
	raw, err := e.cfg.Dial(ctx, network, dst.String())
	if err != nil {
		e.audit("net.error", network, dst, names, policy.Decision{RuleID: d.RuleID, Reason: "dial failed: " + oneLine(err.Error())})
		return nil, err
	}
	sniCheck := network == "tcp" && lp.domain[d.RuleID]
	set := e.sec.Load()
	ref := &flowRef{proto: network, dst: dst, names: names, up: raw, willInspect: sniCheck || set.scan != nil, sec: set}
	if d, ok := e.track(ref, lp); !ok {
		// The policy changed while the upstream was dialled.
		_ = raw.Close()
		e.audit("net.deny", network, dst, names, d)
		return nil, errors.New(d.Reason)
	}
	// Counted (egress bytes), and untracked when closed (live policy).
	up := &trackedConn{Conn: &countConn{Conn: raw, n: &e.sent}, e: e, ref: ref}
	e.audit("net.allow", network, dst, names, d)
	if network == "udp" {
		return &udpFlow{Conn: up, e: e, dst: dst}, nil
	}
	f := &tcpFlow{Conn: up, e: e, ref: ref, dst: dst, names: names, sniCheck: sniCheck}
	if !f.sniCheck && set.scan == nil && e.up == nil && e.down == nil {
		return up, nil // nothing to inspect or shape: the stack's plain copy
	}
	return f, nil
}

// tcpFlow is an allowed TCP flow the engine handles itself.
type tcpFlow struct {
	net.Conn // upstream
	e        *Engine
	ref      *flowRef
	dst      netip.AddrPort
	names    []string
	sniCheck bool // allowed by a domain rule: the SNI must agree
	// intercepted is set once the secret interceptor owns the flow.
	intercepted bool
}

// HandleGuest implements netstack.GuestHandler.
func (f *tcpFlow) HandleGuest(guest net.Conn) {
	f.ref.setGuest(guest)
	br := bufio.NewReaderSize(guest, helloBuf)
	set := f.ref.sec
	inspect := f.sniCheck || set.scan != nil
	downStarted := make(chan struct{})
	started := false
	down := func() {
		if !started {
			started = true
			go func() {
				defer close(downStarted)
				f.copyDown(guest)
			}()
		}
	}
	defer func() {
		if started {
			<-downStarted
		}
	}()
	if inspect {
		wait := firstByteWait
		if set.ic != nil && slices.ContainsFunc(f.names, set.secretHost) {
			wait = secretFirstByteWait
		}
		_ = guest.SetReadDeadline(time.Now().Add(wait))
		_, err := br.Peek(1)
		if isTimeout(err) {
			down() // a server-first protocol: let its greeting through
			_ = guest.SetReadDeadline(time.Time{})
			_, err = br.Peek(1)
		}
		_ = guest.SetReadDeadline(time.Time{})
		if err == nil {
			if b, _ := br.Peek(1); b[0] == 0x16 {
				if !f.checkHello(guest, br, started) {
					_ = guest.Close()
					_ = f.Conn.Close()
					return
				}
				if f.intercepted {
					return
				}
			}
		}
		f.ref.markInspected()
	}
	down()
	f.copyUp(guest, br)
}

// checkHello reads the ClientHello; it reports false when the flow must
// end. It runs the interception itself when the flow qualifies.
func (f *tcpFlow) checkHello(guest net.Conn, br *bufio.Reader, downStarted bool) bool {
	e := f.e
	_ = guest.SetReadDeadline(time.Now().Add(helloTimeout))
	hello, err := secrets.PeekClientHello(br)
	_ = guest.SetReadDeadline(time.Time{})
	if err != nil || hello.ServerName == "" {
		if err != nil && !errors.Is(err, secrets.ErrNotTLS) && f.sniCheck {
			e.audit("net.deny", "tcp", f.dst, f.names, policy.Decision{RuleID: "tls:malformed", Reason: "denied: unreadable TLS ClientHello: " + oneLine(err.Error())})
			return false
		}
		return true
	}
	sni := hello.ServerName
	f.ref.setSNI(sni)
	// The policy in force now decides (SetPolicy may have replaced the
	// one that allowed the dial): a flow it allows by a domain rule must
	// agree with it on the SNI.
	lp := e.live.Load()
	if d := lp.decide("tcp", f.dst, f.names, ""); f.sniCheck || lp.domain[d.RuleID] {
		if d := lp.decide("tcp", f.dst, f.names, sni); !d.Allow {
			e.audit("net.deny", "tcp", f.dst, f.names, withSNI(d, sni))
			return false
		}
	}
	set := f.ref.sec
	if set.ic == nil || downStarted {
		return true
	}
	n, err := policy.NormalizeName(sni)
	if err != nil || !set.secretHost(n) {
		return true
	}
	if !slices.Contains(f.names, n) {
		// A secret host's name, but this sandbox never resolved it to this
		// address: a forged destination earns no injection. The flow goes
		// on uninspected (TLS to somewhere else carries only placeholders).
		e.cfg.Logger.Debug("secret host not pinned to destination", "sni", n, "dst", f.dst)
		return true
	}
	// Marked under flowMu, where SetSecrets swaps the set and sweeps: a
	// flow is either marked before a swap (and closed by its sweep) or
	// sees that its set is no longer in force and is refused.
	e.flowMu.Lock()
	stale := set != e.sec.Load()
	if !stale {
		f.ref.markIntercepted()
	}
	e.flowMu.Unlock()
	if stale {
		e.audit("net.deny", "tcp", f.dst, f.names, policy.Decision{RuleID: "secrets:changed", Reason: "denied: the sandbox's secrets changed since this connection was opened (reconnect)"})
		return false
	}
	f.intercepted = true
	g := &bufConn{Conn: guest, r: br}
	err = set.ic.Serve(e.ctx, secrets.Flow{
		Guest:    g,
		Upstream: f.Conn,
		CheckSNI: func(got string) error {
			if !strings.EqualFold(strings.TrimSuffix(got, "."), n) {
				return fmt.Errorf("SNI changed from %q to %q", n, got)
			}
			return nil
		},
	})
	if err != nil {
		e.cfg.Logger.Debug("intercepted flow", "dst", f.dst, "err", err)
	}
	return true
}

func withSNI(d policy.Decision, sni string) policy.Decision {
	if !strings.Contains(d.Reason, "SNI") {
		d.Reason += " (TLS SNI " + strconv.Quote(trunc(sni, 80)) + ")"
	}
	return d
}

// copyUp forwards guest bytes upstream, scanned and shaped, then
// half-closes upstream.
func (f *tcpFlow) copyUp(guest net.Conn, r io.Reader) {
	e := f.e
	var w io.Writer = f.Conn
	if e.up != nil {
		w = &limitWriter{w: w, l: e.up, ctx: e.ctx}
	}
	var g *secrets.Guard
	set := f.ref.sec
	if set.scan != nil {
		g = set.scan.Guard(w)
		w = g
	}
	_, err := io.Copy(w, r)
	if err == nil && g != nil {
		err = g.Flush()
	}
	var pe *secrets.PlaceholderError
	if errors.As(err, &pe) {
		e.auditSecret(secrets.Event{Action: "net.secret.block", Host: f.dst.String(), Secrets: set.names(pe.Placeholder),
			Reason: "a secret placeholder was sent to " + f.dst.String() + ", which is not a host the secret is bound to; the connection was closed"})
	}
	if err != nil {
		_ = guest.Close()
		_ = f.Conn.Close()
		return
	}
	if cw, ok := f.Conn.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		return
	}
	_ = f.Conn.Close()
}

// copyDown forwards upstream bytes to the guest, shaped, then half-closes
// the guest side.
func (f *tcpFlow) copyDown(guest net.Conn) {
	var w io.Writer = guest
	if f.e.down != nil {
		w = &limitWriter{w: w, l: f.e.down, ctx: f.e.ctx}
	}
	if _, err := io.Copy(w, f.Conn); err != nil {
		_ = guest.Close()
		_ = f.Conn.Close()
		return
	}
	if cw, ok := guest.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		return
	}
	_ = guest.Close()
}

// udpFlow scans and shapes one UDP flow's datagrams.
type udpFlow struct {
	net.Conn
	e   *Engine
	dst netip.AddrPort
}

func (u *udpFlow) Write(b []byte) (int, error) {
	if !u.e.lim.datagram(u.dst) {
		return len(b), nil // dropped, counted and folded; the flow goes on
	}
	if set := u.e.sec.Load(); set.scan != nil {
		if ph, ok := set.scan.Find(b); ok {
			u.e.auditSecret(secrets.Event{Action: "net.secret.block", Host: u.dst.String(), Secrets: set.names(ph),
				Reason: "a UDP datagram to " + u.dst.String() + " carried a secret placeholder; dropped"})
			return len(b), nil // dropped, the flow goes on
		}
	}
	if u.e.up != nil && u.e.up.WaitN(u.e.ctx, min(len(b), u.e.up.Burst())) != nil {
		return 0, net.ErrClosed
	}
	return u.Conn.Write(b)
}

func (u *udpFlow) Read(b []byte) (int, error) {
	n, err := u.Conn.Read(b)
	if n > 0 && u.e.down != nil && u.e.down.WaitN(u.e.ctx, min(n, u.e.down.Burst())) != nil {
		return 0, net.ErrClosed
	}
	return n, err
}

// limitWriter writes through a byte-rate limiter.
type limitWriter struct {
	w   io.Writer
	l   *rate.Limiter
	ctx context.Context
}

func (l *limitWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), l.l.Burst())
		if err := l.l.WaitN(l.ctx, c); err != nil {
			return n, err
		}
		m, err := l.w.Write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// countConn counts the bytes written to Conn.
type countConn struct {
	net.Conn
	n *atomic.Uint64
}

func (c *countConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n.Add(uint64(max(n, 0)))
	return n, err
}

// CloseWrite passes a half-close on when the underlying conn supports it.
func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// bufConn reads through r, which may hold bytes already read from Conn.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite passes a half-close on when the underlying conn supports it.
func (c *bufConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func oneLine(s string) string { return trunc(strings.Join(strings.Fields(s), " "), 300) }

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
