package egress

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/airlock-sandbox/airlock/internal/policy"
)

// ICMP echo (ping) from the guest: the netstack hands each echo request to
// the engine, which decides it like a flow (policy.Decide with protocol
// "icmp": an allow rule without a port scope, or mode public, lets a public
// address be pinged; the floor never), passes the outbound abuse limits
// as a new flow would (new flows per second, distinct destinations per
// minute: a ping sweep across addresses is a scan) and takes a token from
// the UDP packet rate limit (a ping flood is a datagram flood), records net.allow or
// net.deny (proto "icmp", folded like the rest), and sends one echo from
// the host with the guest's payload. Only when the destination answers
// does the guest get an echo reply; a denied, limited or silent destination
// gets nothing (its ping times out), never a reply the host made up.

// PingFunc sends one ICMP echo request with data to dst from the host and
// returns nil once the matching echo reply arrived, or an error (ctx's at
// its deadline).
type PingFunc func(ctx context.Context, dst netip.Addr, data []byte) error

// ping is the netstack's echo hook.
func (e *Engine) ping(ctx context.Context, dst netip.Addr, data []byte) error {
	ap := netip.AddrPortFrom(dst, 0)
	names := e.pins.Lookup(dst, e.cfg.Clock())
	d := e.live.Load().decide("icmp", ap, names, "")
	if !d.Allow {
		e.auditEcho("net.deny", dst, names, d)
		return errors.New(d.Reason)
	}
	// Refusals are folded into one net.limit event per limit and window,
	// not audited here.
	if rule := e.lim.flow("icmp", ap); rule != "" {
		return errors.New("refused by " + rule)
	}
	if !e.lim.echo(ap) {
		return errors.New("refused by " + LimitUDPRate)
	}
	e.auditEcho("net.allow", dst, names, d)
	e.sent.Add(uint64(len(data) + 8)) // the echo's ICMP message
	if err := e.cfg.Ping(ctx, dst, data); err != nil {
		if ctx.Err() == nil {
			e.auditEcho("net.error", dst, names, policy.Decision{RuleID: d.RuleID, Reason: "ping failed: " + oneLine(err.Error())})
		}
		return err
	}
	return nil
}

// auditEcho records an echo decision: like a flow's, with the address
// alone as its destination.
func (e *Engine) auditEcho(action string, dst netip.Addr, names []string, d policy.Decision) {
	det := map[string]any{"proto": "icmp", "dst": dst.String(), "rule": d.RuleID, "reason": d.Reason}
	if len(names) > 0 {
		det["names"] = names
	}
	if d.Class != policy.ClassInvalid {
		det["class"] = d.Class.String()
	}
	e.cfg.Audit(Event{Action: action, Detail: det})
}

// echo reports whether the guest may send one more echo request to dst:
// echo requests share the UDP packet rate limit (udp_pps). A refused one
// is counted and recorded like a refused datagram.
func (l *limiter) echo(dst netip.AddrPort) bool { return l.packet("icmp", dst) }

// SystemPing is the host's PingFunc: an unprivileged ICMP socket
// ("ping socket", allowed by net.ipv4.ping_group_range) where the host
// allows one, else a raw ICMP socket (root or CAP_NET_RAW). IPv4 only.
func SystemPing(ctx context.Context, dst netip.Addr, data []byte) error {
	dst = dst.Unmap()
	if !dst.Is4() {
		return errors.New("ping: not an IPv4 address")
	}
	raw := false
	c, err := icmp.ListenPacket("udp4", "0.0.0.0")
	if err != nil {
		if c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0"); err != nil {
			return fmt.Errorf("ping socket: %w", err)
		}
		raw = true
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var r [4]byte
	_, _ = rand.Read(r[:])
	id, seq := int(binary.BigEndian.Uint16(r[:2])), int(binary.BigEndian.Uint16(r[2:]))
	msg, err := (&icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: data}}).Marshal(nil)
	if err != nil {
		return err
	}
	var to net.Addr = &net.UDPAddr{IP: dst.AsSlice()}
	if raw {
		to = &net.IPAddr{IP: dst.AsSlice()}
	}
	if _, err := c.WriteTo(msg, to); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("ping: %w", err)
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		// A ping socket's kernel sets the id (and matches replies to the
		// socket); a raw socket sees every reply and checks its own.
		if !ok || echo.Seq != seq || (raw && echo.ID != id) || !bytes.Equal(echo.Data, data) || addrIP(from) != dst {
			continue
		}
		return nil
	}
}

// addrIP is the IPv4 address of a ping socket's peer.
func addrIP(a net.Addr) netip.Addr {
	var ip net.IP
	switch a := a.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.IPAddr:
		ip = a.IP
	}
	addr, _ := netip.AddrFromSlice(ip)
	return addr.Unmap()
}
