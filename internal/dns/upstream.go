package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
)

var errMismatch = errors.New("upstream reply does not match the query")

func durationSeconds(s uint32) time.Duration { return time.Duration(s) * time.Second }

// exchange sends q to the upstreams, one at a time until one answers, within
// the configured timeout. A truncated UDP answer is retried over TCP.
func (r *Resolver) exchange(ctx context.Context, q mdns.Question) (*mdns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	n := len(r.cfg.Upstream)
	start := int(r.next.Add(1)) % n
	var errs []error
	for i := range n {
		up := r.cfg.Upstream[(start+i)%n]
		deadline, _ := ctx.Deadline()
		per := time.Until(deadline) / time.Duration(n-i)
		actx, acancel := context.WithTimeout(ctx, per)
		m := new(mdns.Msg)
		m.Id = mdns.Id()
		m.RecursionDesired = true
		m.Question = []mdns.Question{q}
		m.SetEdns0(maxUDPSize, false)
		resp, err := exchangeUDP(actx, up, m)
		if err == nil && resp.Truncated {
			m.Id = mdns.Id()
			resp, err = exchangeTCP(actx, up, m)
		}
		acancel()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// valid reports whether resp answers query m.
func valid(resp, m *mdns.Msg) bool {
	if !resp.Response || resp.Id != m.Id || resp.Opcode != mdns.OpcodeQuery || len(resp.Question) != 1 {
		return false
	}
	a, q := resp.Question[0], m.Question[0]
	return a.Qtype == q.Qtype && a.Qclass == q.Qclass && strings.EqualFold(a.Name, q.Name)
}

// deadlineConn makes ctx's deadline and cancellation apply to c.
func deadlineConn(ctx context.Context, c net.Conn) (stop func() bool) {
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
}

func exchangeUDP(ctx context.Context, up string, m *mdns.Msg) (*mdns.Msg, error) {
	buf, err := m.Pack()
	if err != nil {
		return nil, fmt.Errorf("pack query: %w", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", up) // connected: only the upstream's address is read
	if err != nil {
		return nil, fmt.Errorf("dial udp: %w", err)
	}
	defer c.Close()
	defer deadlineConn(ctx, c)()
	if _, err := c.Write(buf); err != nil {
		return nil, fmt.Errorf("write udp: %w", err)
	}
	rbuf := make([]byte, mdns.MaxMsgSize)
	for {
		n, err := c.Read(rbuf)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("read udp: %w", ctx.Err())
			}
			return nil, fmt.Errorf("read udp: %w", err)
		}
		resp := new(mdns.Msg)
		if resp.Unpack(rbuf[:n]) != nil || !valid(resp, m) {
			continue // forged, stale or garbled: keep waiting for the real one
		}
		return resp, nil
	}
}

func exchangeTCP(ctx context.Context, up string, m *mdns.Msg) (*mdns.Msg, error) {
	buf, err := m.Pack()
	if err != nil {
		return nil, fmt.Errorf("pack query: %w", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", up)
	if err != nil {
		return nil, fmt.Errorf("dial tcp: %w", err)
	}
	defer c.Close()
	defer deadlineConn(ctx, c)()
	if err := writeFrame(c, buf); err != nil {
		return nil, fmt.Errorf("write tcp: %w", err)
	}
	rbuf, err := readFrame(c)
	if err != nil {
		return nil, fmt.Errorf("read tcp: %w", err)
	}
	resp := new(mdns.Msg)
	if err := resp.Unpack(rbuf); err != nil {
		return nil, fmt.Errorf("unpack tcp reply: %w", err)
	}
	if !valid(resp, m) {
		return nil, errMismatch
	}
	return resp, nil
}

func writeFrame(w io.Writer, msg []byte) error {
	if len(msg) > 0xffff {
		return errors.New("message over 65535 bytes")
	}
	b := make([]byte, 2+len(msg))
	binary.BigEndian.PutUint16(b, uint16(len(msg)))
	copy(b[2:], msg)
	_, err := w.Write(b)
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
