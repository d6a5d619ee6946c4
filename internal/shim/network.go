package shim

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/clock"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/envknob"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// network is the sandbox's running network: the egress engine on the
// guest's link, published ports and ports.sock.
type network struct {
	s       *shim
	eng     *egress.Engine
	spec    netconf.Spec
	lns     []net.Listener
	link    net.Conn // the guest NIC's host end
	audit   *auditor
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	conns   sync.WaitGroup
	closing atomic.Bool
	// inbound counts open connections from the host into the guest
	// (published ports, ports.sock): they keep the sandbox from idling.
	inbound atomic.Int64
	// egressOnce adds the run's egress to its tenant's total once.
	egressOnce sync.Once
}

// startNetwork builds the engine for sb's spec and serves it on the
// instance's NIC. It returns the CA certificate the guest must trust (nil
// without secrets).
func (s *shim) startNetwork(ctx context.Context, sb store.Sandbox, inst runtime.Instance) (*network, error) {
	spec, err := sb.Network.Normalize(s.cfg.Secrets)
	if err != nil {
		return nil, err
	}
	n := &network{s: s, spec: spec, audit: newAuditor(s.st, sb.ID, s.own.tenant, s.log, s.clk)}
	nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = cancel
	ok := false
	defer func() {
		if !ok {
			n.close()
		}
	}()
	up, err := dnsUpstream(s.cfg.DNS)
	if err != nil {
		s.log.Warn("no DNS upstream; guest DNS queries will fail", "err", err)
	}
	dial, err := testDialer(s.cfg.TestDialMap)
	if err != nil {
		return nil, err
	}
	ping, err := testPinger(s.cfg.TestDialMap)
	if err != nil {
		return nil, err
	}
	roots, err := upstreamRoots(s.cfg.UpstreamCAFile)
	if err != nil {
		return nil, err
	}
	n.eng, err = egress.New(egress.Config{
		Spec:          spec,
		Secrets:       s.cfg.Secrets,
		HostAddrs:     hostAddrs(),
		DNSUpstream:   up,
		Dial:          dial,
		Ping:          ping,
		UpstreamRoots: roots,
		Audit:         n.audit.add,
		Logger:        s.log.With("component", "net"),
	})
	if err != nil {
		return nil, err
	}
	nw, isNet := inst.(runtime.Networker)
	if !isNet {
		// Only the fake runtime (tests) has no NIC.
		s.log.Warn("the runtime gives the guest no network device; the sandbox has no network")
		n.eng.Close()
		n.eng = nil
		ok = true
		return n, nil
	}
	link, err := nw.NetConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("guest network link: %w", err)
	}
	n.link = link
	n.wg.Go(func() {
		defer link.Close()
		if spec.Mode == "none" {
			// No network: the guest's NIC is down; drain whatever comes.
			_, _ = io.Copy(io.Discard, link)
			return
		}
		if err := n.eng.ServeLink(nctx, link); err != nil && nctx.Err() == nil {
			s.log.Error("guest network link ended", "err", err)
		}
	})
	if err := n.listenPorts(nctx, sb.ID); err != nil {
		return nil, err
	}
	ok = true
	return n, nil
}

// usage is the counters of the guest's link, or nil when the sandbox has
// no network (mode none, or no NIC). Safe for concurrent use.
func (n *network) usage() *shimv2.NetworkUsage {
	if n == nil || n.eng == nil || n.spec.Mode == "none" {
		return nil
	}
	st, u := n.eng.Stats(), n.eng.Usage()
	return &shimv2.NetworkUsage{
		EgressBytes: u.EgressBytes, FlowsLimited: u.FlowsLimited, DatagramsLimited: u.DatagramsLimited,
		ReceiveBytes: st.BytesOut, TransmitBytes: st.BytesIn, // the stack's out is the guest's receive
		ReceiveFrames: st.FramesOut, TransmitFrames: st.FramesIn,
		Connections:  uint32(max(st.ActiveConns, 0)),
		DialsAllowed: st.DialsAllowed, DialsDenied: st.DialsDenied, DialsBusy: st.DialsBusy,
	}
}

// guestConfig is what the agent's Sync sets up in the guest.
func (n *network) guestConfig() *agentv1.NetworkConfig {
	if n.eng == nil {
		return nil
	}
	return template.GuestNetwork(n.spec.Mode != "none", n.eng.CACertPEM())
}

// listenPorts serves ports.sock and the published ports.
func (n *network) listenPorts(ctx context.Context, id string) error {
	if n.spec.Mode == "none" {
		return nil
	}
	sock := n.s.l.PortsSock(id)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen %s: %w", sock, err)
	}
	_ = os.Chmod(sock, 0o600)
	n.serve(ctx, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		port, peer, err := readPortsHeader(c)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				fmt.Fprintf(c, "error: %s\n", oneLine(err.Error()))
			}
			return
		}
		in := inbound{via: viaPorts, port: port, peer: peer}
		serveInbound(ctx, c, in, n.eng.DialGuest, n.s.clk.Now, func(err error) bool {
			if err != nil {
				fmt.Fprintf(c, "error: nothing accepts connections on guest port %d (%s)\n", port, oneLine(err.Error()))
				return false
			}
			_ = c.SetDeadline(time.Time{})
			_, werr := io.WriteString(c, "ok\n")
			return werr == nil
		}, n.audit.add)
	})
	changed := false
	for i, p := range n.spec.Ports {
		addr := netip.AddrPortFrom(netip.MustParseAddr(p.HostIP), p.HostPort)
		ln, err := net.Listen("tcp", addr.String())
		if err != nil {
			return fmt.Errorf("publish port %s -> guest %d: %w", addr, p.GuestPort, err)
		}
		if p.HostPort == 0 {
			n.spec.Ports[i].HostPort = uint16(ln.Addr().(*net.TCPAddr).Port)
			changed = true
		}
		guestPort := p.GuestPort
		n.s.log.Info("published port", "host", ln.Addr().String(), "guest_port", guestPort)
		n.serve(ctx, ln, func(c net.Conn) {
			// A refused dial returns; closing c resets the client.
			in := inbound{via: viaPublish, port: guestPort, peer: peerIP(c.RemoteAddr())}
			serveInbound(ctx, c, in, n.eng.DialGuest, n.s.clk.Now, nil, n.audit.add)
		})
	}
	if changed {
		if err := n.s.st.SetNetwork(ctx, id, n.spec); err != nil {
			return err
		}
	}
	return nil
}

// serve accepts on ln until the network closes, handling each conn on its
// own goroutine (which closes it).
func (n *network) serve(ctx context.Context, ln net.Listener, handle func(net.Conn)) {
	n.lns = append(n.lns, ln)
	n.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if n.closing.Load() || ctx.Err() != nil {
					return
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				n.s.log.Error("accept", "addr", ln.Addr().String(), "err", err)
				return
			}
			n.inbound.Add(1)
			n.s.act.touch()
			n.conns.Go(func() {
				defer func() {
					n.s.act.touch()
					n.inbound.Add(-1)
				}()
				defer c.Close()
				handle(c)
			})
		}
	})
}

// close stops the engine, the listeners and the audit writer.
func (n *network) close() {
	n.closing.Store(true)
	if n.cancel != nil {
		n.cancel()
	}
	for _, ln := range n.lns {
		_ = ln.Close()
	}
	_ = os.Remove(n.s.l.PortsSock(n.s.cfg.ID))
	if n.eng != nil {
		_ = n.eng.Close()
	}
	if n.link != nil {
		_ = n.link.Close()
	}
	n.wg.Wait()
	n.conns.Wait()
	n.audit.close()
	if n.eng != nil {
		// The run's egress joins its tenant's total (/metrics), once.
		n.egressOnce.Do(func() {
			if err := n.s.st.AddTenantEgress(context.Background(), n.audit.tenant(), n.eng.Usage().EgressBytes); err != nil {
				n.s.log.Error("tenant egress total", "err", err)
			}
		})
	}
}

// splice copies both ways with half-closes and closes both at the end. It
// returns the bytes written to a and to b.
func splice(a, b net.Conn) (toA, toB int64) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn, n *int64) {
		var err error
		*n, err = io.Copy(dst, src)
		if err != nil {
			_ = dst.Close()
			_ = src.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
		_ = dst.Close()
	}
	wg.Go(func() { cp(a, b, &toA) })
	wg.Go(func() { cp(b, a, &toB) })
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
	return toA, toB
}

// hostAddrs are the host's own interface addresses (denied to guests).
func hostAddrs() []netip.Addr {
	var out []netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// dnsUpstream returns the servers in dns ("ip[:port],...", Config.DNS) or
// else the nameservers of /etc/resolv.conf, as "ip:port".
func dnsUpstream(dns string) ([]string, error) {
	var list []string
	if v := dns; v != "" {
		list = strings.Split(v, ",")
	} else {
		f, err := os.Open("/etc/resolv.conf")
		if err != nil {
			return nil, err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fs := strings.Fields(sc.Text()); len(fs) >= 2 && fs[0] == "nameserver" {
				list = append(list, fs[1])
			}
		}
	}
	var out []string
	for _, s := range list {
		s = strings.TrimSpace(s)
		if ap, err := netip.ParseAddrPort(s); err == nil {
			out = append(out, ap.String())
		} else if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
		} else {
			return nil, fmt.Errorf("DNS server %q is not an IP address", s)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no nameserver configured (set " + envknob.DNS.Name + ")")
	}
	return out, nil
}

// testDialer parses the dial-map test hook (Config.TestDialMap).
func testDialer(spec string) (egress.DialFunc, error) {
	var d net.Dialer
	if spec == "" {
		return d.DialContext, nil
	}
	m, err := parseDialMap(spec)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		if ap, err := netip.ParseAddrPort(address); err == nil {
			if to, ok := m[ap.Addr()]; ok {
				address = netip.AddrPortFrom(to, ap.Port()).String()
			}
		}
		return d.DialContext(ctx, network, address)
	}, nil
}

// parseDialMap parses the dial-map test hook: "ip=ip,...".
func parseDialMap(spec string) (map[netip.Addr]netip.Addr, error) {
	m := map[netip.Addr]netip.Addr{}
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(kv, "=")
		from, err1 := netip.ParseAddr(strings.TrimSpace(k))
		to, err2 := netip.ParseAddr(strings.TrimSpace(v))
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: bad entry %q (want ip=ip)", envknob.TestDialMap.Name, kv)
		}
		m[from] = to
	}
	return m, nil
}

// testPinger is the host's ping (egress.SystemPing) with the dial-map
// test hook applied: the policy decides on the address the guest pinged,
// the echo goes to the mapped one.
func testPinger(spec string) (egress.PingFunc, error) {
	if spec == "" {
		return egress.SystemPing, nil
	}
	m, err := parseDialMap(spec)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, dst netip.Addr, data []byte) error {
		if to, ok := m[dst]; ok {
			dst = to
		}
		return egress.SystemPing(ctx, dst, data)
	}, nil
}

// upstreamRoots is the system pool plus the PEM file at path, if any.
func upstreamRoots(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envknob.UpstreamCAFile.Name, err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", envknob.UpstreamCAFile.Name, path)
	}
	return pool, nil
}

// auditor writes network events to the catalog off the packet path: rate
// limited and folded (auditLimit), then a bounded queue, dropped events
// counted and reported.
type auditor struct {
	st      *store.Store
	id      string        // the sandbox
	tenant  func() string // its owner now (shim.owner)
	ch      chan store.Event
	dropped atomic.Uint64
	limit   *auditLimit
	now     func() time.Time
	done    chan struct{}
	mu      sync.RWMutex // guards closed against sends
	closed  bool
}

const auditQueue = 4096

func newAuditor(st *store.Store, id string, tenant func() string, log interface{ Error(string, ...any) }, clk clock.Clock) *auditor {
	a := &auditor{st: st, id: id, tenant: tenant, ch: make(chan store.Event, auditQueue), limit: newAuditLimit(), now: clk.Now, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		tick := clk.NewTicker(auditInterval)
		defer tick.Stop()
		report := func() {
			for _, e := range a.limit.flush(tenant(), id, a.now()) {
				if _, err := st.AppendEvent(context.Background(), e); err != nil {
					log.Error("audit", "err", err)
				}
			}
			if n := a.dropped.Swap(0); n > 0 {
				_, _ = st.AppendEvent(context.Background(), store.Event{Tenant: tenant(), SandboxID: id, Action: "net.audit.dropped",
					Detail: map[string]any{"count": n, "reason": "the guest made network events faster than the audit log takes them"}})
			}
		}
		for {
			select {
			case e, ok := <-a.ch:
				if !ok {
					report()
					return
				}
				if _, err := st.AppendEvent(context.Background(), e); err != nil {
					log.Error("audit", "err", err)
				}
			case <-tick.C():
				report()
			}
		}
	}()
	return a
}

func (a *auditor) add(e egress.Event) {
	now := a.now()
	ev := store.Event{Time: now, Tenant: a.tenant(), SandboxID: a.id, Action: e.Action, Detail: e.Detail}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed || !a.limit.admit(ev, now) {
		return
	}
	select {
	case a.ch <- ev:
	default:
		a.dropped.Add(1)
	}
}

func (a *auditor) close() {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.ch)
	}
	a.mu.Unlock()
	<-a.done
}
