// Package egress is one sandbox's network as the shim runs it: the
// user-space stack (internal/netstack) on the guest's link, the DNS server
// (internal/dns) on port 53 of every address, the egress policy
// (internal/policy) decided on the resolved destination at dial time, the
// secret interceptor (internal/secrets) for hosts that have secrets, byte-rate
// limits, and an audit event for every decision.
//
// # A guest TCP flow
//
//  1. Port 53 (any address) goes to the DNS server.
//  2. policy.Decide on the destination the guest addressed, with the names
//     this sandbox resolved to that address (DNS pins) and the host's own
//     addresses. A denial is an RST the guest sees at once ("net.deny").
//  3. The engine dials the destination ("net.allow", or "net.error" with
//     the dial error, also an RST). Only then does the guest's handshake
//     complete.
//  4. When the flow was allowed by a domain rule, or the sandbox has
//     secrets, the engine looks at the guest's first bytes before it
//     forwards any: a TLS ClientHello's SNI must satisfy the policy (same
//     rule, pinned name); a ClientHello whose SNI is a secret's host and is
//     pinned to this destination is intercepted (secrets.Interceptor);
//     every other flow is relayed with its guest-to-upstream bytes scanned
//     for placeholders, and a placeholder ends the flow
//     ("net.secret.block"). If the guest says nothing for firstByteWait,
//     upstream bytes start to flow (server-first protocols) but guest bytes
//     are still checked before they are forwarded.
//
// UDP flows are decided the same way per flow; each datagram is scanned for
// placeholders when the sandbox has secrets.
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
	// UpstreamRoots verifies intercepted upstreams' certificates; nil
	// means the system pool.
	UpstreamRoots *x509.CertPool
	// Audit receives one event per decision, synchronously: it must not
	// block. May be nil.
	Audit func(Event)
	// Logger receives debug logs; nil discards.
	Logger *slog.Logger
	// Clock gives the time for pins and DNS; nil means time.Now.
	Clock func() time.Time
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
	pol    policy.Policy
	pins   *policy.PinSet
	res    *dns.Resolver
	stack  *netstack.Stack
	ca     *secrets.CA
	ic     *secrets.Interceptor
	scan   *secrets.Scanner
	hosts  []string        // every secret host pattern
	domain map[string]bool // IDs of the policy's domain rules
	up     *rate.Limiter
	down   *rate.Limiter
	ctx    context.Context
	cancel context.CancelFunc
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
	pol, err := cfg.Spec.Policy()
	if err != nil {
		return nil, err
	}
	pol = pol.WithHostAddrs(cfg.HostAddrs...)
	e := &Engine{cfg: cfg, pol: pol, pins: policy.NewPinSet(pinMinTTL, pinMaxTTL, pinEntries), domain: map[string]bool{}}
	for _, r := range pol.Rules() {
		if r.Domain != "" {
			e.domain[r.ID] = true
		}
	}
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

	if len(cfg.Spec.Secrets) > 0 {
		var binds []secrets.Binding
		var phs []string
		for _, s := range cfg.Spec.Secrets {
			v, ok := cfg.Secrets[s.Name]
			if !ok {
				return nil, fmt.Errorf("secret %s has no value", s.Name)
			}
			binds = append(binds, secrets.Binding{Name: s.Name, Hosts: s.Hosts, Placeholder: s.Placeholder, Value: v})
			phs = append(phs, s.Placeholder)
			e.hosts = append(e.hosts, s.Hosts...)
		}
		e.ca, err = secrets.NewCA(e.hosts)
		if err != nil {
			return nil, fmt.Errorf("secrets CA: %w", err)
		}
		e.scan = secrets.NewScanner(phs)
		e.ic = &secrets.Interceptor{
			CA:      e.ca,
			Secrets: binds,
			RootCAs: cfg.UpstreamRoots,
			Audit:   e.auditSecret,
			Logger:  cfg.Logger,
		}
	}
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
// or nil when the sandbox has no secrets.
func (e *Engine) CACertPEM() []byte {
	if e.ca == nil {
		return nil
	}
	return e.ca.CertPEM()
}

// Stats returns the stack's counters.
func (e *Engine) Stats() netstack.Stats { return e.stack.Stats() }

// Close stops everything; idempotent.
func (e *Engine) Close() error {
	e.cancel()
	return e.stack.Close()
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
	d := e.decide(network, dst, names, "")
	if !d.Allow {
		e.audit("net.deny", network, dst, names, d)
		return nil, errors.New(d.Reason)
	}
	up, err := e.cfg.Dial(ctx, network, dst.String())
	if err != nil {
		e.audit("net.error", network, dst, names, policy.Decision{RuleID: d.RuleID, Reason: "dial failed: " + oneLine(err.Error())})
		return nil, err
	}
	e.audit("net.allow", network, dst, names, d)
	if network == "udp" {
		if e.scan == nil && e.up == nil && e.down == nil {
			return up, nil
		}
		return &udpFlow{Conn: up, e: e, dst: dst}, nil
	}
	f := &tcpFlow{Conn: up, e: e, dst: dst, names: names, sniCheck: e.domain[d.RuleID]}
	if !f.sniCheck && e.scan == nil && e.up == nil && e.down == nil {
		return up, nil // nothing to inspect or shape: the stack's plain copy
	}
	return f, nil
}

func (e *Engine) decide(network string, dst netip.AddrPort, names []string, sni string) policy.Decision {
	r := policy.Request{Proto: network, Dst: dst, SNI: sni}
	if len(names) > 0 {
		r.Name, r.Names = names[0], names[1:]
	}
	return policy.Decide(e.pol, r)
}

// secretHost reports whether name is a host some secret is bound to.
func (e *Engine) secretHost(name string) bool {
	return slices.ContainsFunc(e.hosts, func(p string) bool { return secrets.HostMatches(p, name) })
}

// tcpFlow is an allowed TCP flow the engine handles itself.
type tcpFlow struct {
	net.Conn // upstream
	e        *Engine
	dst      netip.AddrPort
	names    []string
	sniCheck bool // allowed by a domain rule: the SNI must agree
	// intercepted is set once the secret interceptor owns the flow.
	intercepted bool
}

// HandleGuest implements netstack.GuestHandler.
func (f *tcpFlow) HandleGuest(guest net.Conn) {
	e := f.e
	br := bufio.NewReaderSize(guest, helloBuf)
	inspect := f.sniCheck || e.scan != nil
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
		_ = guest.SetReadDeadline(time.Now().Add(firstByteWait))
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
	if f.sniCheck {
		d := e.decide("tcp", f.dst, f.names, sni)
		if !d.Allow {
			e.audit("net.deny", "tcp", f.dst, f.names, withSNI(d, sni))
			return false
		}
	}
	if e.ic == nil || downStarted {
		return true
	}
	n, err := policy.NormalizeName(sni)
	if err != nil || !e.secretHost(n) {
		return true
	}
	if !slices.Contains(f.names, n) {
		// A secret host's name, but this sandbox never resolved it to this
		// address: a forged destination earns no injection. The flow goes
		// on uninspected (TLS to somewhere else carries only placeholders).
		e.cfg.Logger.Debug("secret host not pinned to destination", "sni", n, "dst", f.dst)
		return true
	}
	f.intercepted = true
	g := &bufConn{Conn: guest, r: br}
	err = e.ic.Serve(e.ctx, secrets.Flow{
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
	if e.scan != nil {
		g = e.scan.Guard(w)
		w = g
	}
	_, err := io.Copy(w, r)
	if err == nil && g != nil {
		err = g.Flush()
	}
	var pe *secrets.PlaceholderError
	if errors.As(err, &pe) {
		e.auditSecret(secrets.Event{Action: "net.secret.block", Host: f.dst.String(), Secrets: e.secretNames(pe.Placeholder),
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

// secretNames maps a placeholder to the name of its secret.
func (e *Engine) secretNames(ph string) []string {
	for _, s := range e.cfg.Spec.Secrets {
		if s.Placeholder == ph {
			return []string{s.Name}
		}
	}
	return nil
}

// udpFlow scans and shapes one UDP flow's datagrams.
type udpFlow struct {
	net.Conn
	e   *Engine
	dst netip.AddrPort
}

func (u *udpFlow) Write(b []byte) (int, error) {
	if u.e.scan != nil {
		if ph, ok := u.e.scan.Find(b); ok {
			u.e.auditSecret(secrets.Event{Action: "net.secret.block", Host: u.dst.String(), Secrets: u.e.secretNames(ph),
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
