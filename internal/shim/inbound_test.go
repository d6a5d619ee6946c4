package shim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// steps is a clock that moves by step on every reading.
func steps(t0 time.Time, step time.Duration) func() time.Time {
	n := 0
	return func() time.Time {
		n++
		return t0.Add(time.Duration(n-1) * step)
	}
}

// TestServeInboundRecordsTheConnection: a connection spliced to the guest
// is one net.inbound event with the port, the peer, bytes each way and the
// duration.
func TestServeInboundRecordsTheConnection(t *testing.T) {
	t.Parallel()
	client, host := net.Pipe()
	dial := func(_ context.Context, port uint16) (net.Conn, error) {
		if port != 8080 {
			return nil, fmt.Errorf("dial %d", port)
		}
		g, shimEnd := net.Pipe()
		go func() {
			defer g.Close()
			b := make([]byte, 5)
			if _, err := io.ReadFull(g, b); err != nil {
				return
			}
			_, _ = g.Write([]byte("world!!"))
		}()
		return shimEnd, nil
	}
	var got []egress.Event
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveInbound(t.Context(), host, inbound{via: viaPublish, port: 8080, peer: "192.0.2.7"}, dial,
			steps(time.Unix(100, 0), 1500*time.Millisecond), nil, func(e egress.Event) { got = append(got, e) })
	}()
	if _, err := client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(client)
	client.Close()
	<-done
	if string(b) != "world!!" {
		t.Fatalf("client read %q", b)
	}
	if len(got) != 1 {
		t.Fatalf("%d events, want 1: %v", len(got), got)
	}
	d := got[0].Detail
	if got[0].Action != "net.inbound" || d["port"] != 8080 || d["peer"] != "192.0.2.7" || d["via"] != "publish" || d["result"] != "ok" ||
		d["bytes_in"] != int64(5) || d["bytes_out"] != int64(7) || d["duration_ms"] != int64(1500) || d["proto"] != "tcp" {
		t.Fatalf("event %s %v", got[0].Action, d)
	}
}

// TestServeInboundRecordsARefusal: nothing listening in the guest is a
// "refused" event, and ports.sock's answer sees the error.
func TestServeInboundRecordsARefusal(t *testing.T) {
	t.Parallel()
	_, host := net.Pipe()
	defer host.Close()
	var got []egress.Event
	var told error
	serveInbound(t.Context(), host, inbound{via: viaPorts, port: 3000}, func(context.Context, uint16) (net.Conn, error) {
		return nil, errors.New("connection refused")
	}, steps(time.Unix(100, 0), time.Millisecond), func(err error) bool { told = err; return false }, func(e egress.Event) { got = append(got, e) })
	if told == nil {
		t.Fatal("ready was not told of the refusal")
	}
	if len(got) != 1 || got[0].Detail["result"] != "refused" || got[0].Detail["via"] != "ports" || got[0].Detail["port"] != 3000 ||
		got[0].Detail["reason"] != "connection refused" || got[0].Detail["peer"] != nil {
		t.Fatalf("events %v", got)
	}
}

// TestReadPortsHeader: the short form, the form with a peer, and the
// malformed ones.
func TestReadPortsHeader(t *testing.T) {
	t.Parallel()
	peerForm := func(port uint16, peer string) []byte {
		return append([]byte{0, 0, byte(port >> 8), byte(port), byte(len(peer))}, peer...)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		port uint16
		peer string
		err  string
	}{
		{"short", []byte{0x1f, 0x90}, 8080, "", ""},
		{"peer v4", peerForm(8080, "203.0.113.9"), 8080, "203.0.113.9", ""},
		{"peer v6", peerForm(443, "2001:db8::1"), 443, "2001:db8::1", ""},
		{"peer mapped", peerForm(443, "::ffff:192.0.2.1"), 443, "192.0.2.1", ""},
		{"no peer", peerForm(22, ""), 22, "", ""},
		{"port 0", peerForm(0, "192.0.2.1"), 0, "", "port must be"},
		{"not an IP", peerForm(80, "evil\nrow"), 0, "", "not an IP"},
		{"too long", peerForm(80, strings.Repeat("1", maxPeerLen+1)), 0, "", "longer than"},
		{"truncated", peerForm(80, "192.0.2.1")[:8], 0, "", "EOF"},
	} {
		port, peer, err := readPortsHeader(bytes.NewReader(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || port != tc.port || peer != tc.peer {
			t.Errorf("%s: %d %q %v, want %d %q", tc.name, port, peer, err, tc.port, tc.peer)
		}
	}
}

// TestAuditLimitFoldsInbound: past the burst, a flood of connections from
// one peer to one port is one counted row with one distinct peer and the
// bytes summed; another port is a row of its own.
func TestAuditLimitFoldsInbound(t *testing.T) {
	t.Parallel()
	l := newAuditLimit()
	sb := store.Sandbox{ID: "sb1", Tenant: "acme"}
	now := time.Unix(1000, 0)
	ev := func(port uint16) store.Event {
		e := inbound{via: viaPublish, port: port, peer: "198.51.100.4"}.event("ok", 10, 100, time.Millisecond, "")
		return store.Event{Action: e.Action, Detail: e.Detail}
	}
	single := 0
	const n = 1000
	for range n {
		if l.admit(ev(8080), now) {
			single++
		}
	}
	l.admit(ev(9090), now)
	if single != auditBurst {
		t.Fatalf("%d singles, want the burst %d", single, auditBurst)
	}
	rows := l.flush(sb.Tenant, sb.ID, now)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want one per port: %v", len(rows), rows)
	}
	d := rows[0].Detail
	if rows[0].Action != "net.inbound" || d["aggregated"] != true || d["count"] != uint64(n-auditBurst) || d["distinct"] != 1 ||
		d["port"] != 8080 || d["via"] != "publish" || d["result"] != "ok" || d["proto"] != "tcp" ||
		d["bytes_in"] != int64(10*(n-auditBurst)) || d["bytes_out"] != int64(100*(n-auditBurst)) {
		t.Fatalf("folded row %v", d)
	}
	if s, _ := d["samples"].([]string); len(s) != 1 || s[0] != "198.51.100.4" {
		t.Fatalf("samples %v", d["samples"])
	}
	if rows[1].Detail["port"] != 9090 || rows[1].Detail["count"] != uint64(1) {
		t.Fatalf("second row %v", rows[1].Detail)
	}
}
