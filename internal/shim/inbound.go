package shim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/airlock-sandbox/airlock/internal/egress"
)

// Inbound on record: every connection from the host side into the guest
// (a published port, or ports.sock, which the API's preview route dials
// once per request) is a "net.inbound" audit event when it ends: the guest
// port, the peer's address, bytes each way and how long it lasted, or
// result "refused" when nothing in the guest accepted it. The events go
// through the same auditor as the egress engine's (rate limited, then
// folded per interval into one counted row per kind: action, port, via
// and result), so a burst of connections is a counted row with its
// distinct peers, a few samples and the bytes summed, not a row each.
// Nothing here is keyed by peer; the folding caps what it keeps.

// Ways a connection reaches the guest, the "via" of a net.inbound event.
const (
	viaPublish = "publish" // a published port's host listener
	viaPorts   = "ports"   // ports.sock: the preview route or another host client
)

// maxPeerLen caps the peer address a ports.sock client names.
const maxPeerLen = 64

// inbound is one connection into the guest, for the audit trail.
type inbound struct {
	via  string
	port uint16
	peer string // the client's IP address; "" when not known
}

// guestDialer dials a guest TCP port (egress.Engine.DialGuest).
type guestDialer func(ctx context.Context, port uint16) (net.Conn, error)

// serveInbound dials in.port in the guest for the client c, splices the
// two until both are done and records the connection with record. ready
// (if set) is called with the dial's error before the splice (ports.sock
// answers its client there); after a dial error, or when ready returns
// false, the connection ends. c is closed by the splice; otherwise the
// caller closes it.
func serveInbound(ctx context.Context, c net.Conn, in inbound, dial guestDialer, now func() time.Time, ready func(error) bool, record func(egress.Event)) {
	start := now()
	g, err := dial(ctx, in.port)
	if err != nil {
		record(in.event("refused", 0, 0, now().Sub(start), oneLine(err.Error())))
		if ready != nil {
			ready(err)
		}
		return
	}
	if ready != nil && !ready(nil) {
		// The client left before it was told: the guest did accept.
		g.Close()
		record(in.event("ok", 0, 0, now().Sub(start), ""))
		return
	}
	toClient, toGuest := splice(c, g)
	record(in.event("ok", toGuest, toClient, now().Sub(start), ""))
}

// event is in's net.inbound event: bytes_in went to the guest, bytes_out
// came from it.
func (in inbound) event(result string, bytesIn, bytesOut int64, d time.Duration, reason string) egress.Event {
	det := map[string]any{
		"proto":       "tcp",
		"port":        int(in.port),
		"via":         in.via,
		"result":      result,
		"bytes_in":    bytesIn,
		"bytes_out":   bytesOut,
		"duration_ms": d.Milliseconds(),
	}
	if in.peer != "" {
		det["peer"] = in.peer
	}
	if reason != "" {
		det["reason"] = reason
	}
	return egress.Event{Action: "net.inbound", Detail: det}
}

// peerIP is the IP of a connection's remote address, "" when it has none
// (a unix socket).
func peerIP(a net.Addr) string {
	if a == nil {
		return ""
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return ""
	}
	return ap.Addr().Unmap().String()
}

// readPortsHeader reads a ports.sock request (see sandbox.DialGuestPort):
// the guest port as 2 bytes big-endian, or 2 zero bytes, the port, one
// length byte and that many bytes naming the peer (an IP address; anything
// else, or one longer than maxPeerLen, is refused).
func readPortsHeader(r io.Reader) (port uint16, peer string, err error) {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, "", err
	}
	if port = binary.BigEndian.Uint16(b[:]); port != 0 {
		return port, "", nil
	}
	var h [3]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, "", err
	}
	port, n := binary.BigEndian.Uint16(h[:2]), int(h[2])
	if port == 0 {
		return 0, "", errors.New("port must be 1-65535")
	}
	if n > maxPeerLen {
		return 0, "", fmt.Errorf("peer address longer than %d bytes", maxPeerLen)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, "", err
	}
	if n == 0 {
		return port, "", nil
	}
	a, err := netip.ParseAddr(string(p))
	if err != nil {
		return 0, "", errors.New("peer is not an IP address")
	}
	return port, a.Unmap().String(), nil
}
