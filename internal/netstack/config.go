package netstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// DialFunc is the egress hook. It is called with network "tcp" or "udp" and
// the destination the guest addressed, before the guest's TCP handshake is
// completed. It decides and dials the real destination; a non-nil error means
// refuse (the guest sees RST for TCP, silence for UDP). ctx carries the dial
// timeout and is cancelled by [Stack.Close]. It is called concurrently, at most
// [Config.MaxInflightDials] times per protocol at once. The Stack owns and
// closes the returned conn; for UDP it must be a connected datagram conn (one
// Write per datagram, one Read per datagram).
type DialFunc func(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error)

// Config configures a Stack. The zero value of each field but Dial means its
// default.
type Config struct {
	// GatewayIP is the stack's own IPv4 address on the guest's /24, the
	// guest's default route. Default 10.0.2.2.
	GatewayIP netip.Addr
	// GuestIP is the guest's IPv4 address. IPv4 packets from any other
	// source are dropped. Default 10.0.2.15.
	GuestIP netip.Addr
	// MTU of the link, without the Ethernet header. Default 1500.
	MTU int
	// GatewayMAC is the stack's MAC. Default 52:55:0a:00:02:02.
	GatewayMAC net.HardwareAddr
	// GuestMAC, the guest NIC's MAC, is installed as a static neighbour for
	// GuestIP so the stack never ARPs for the guest. Default
	// 52:54:00:12:34:56 (QEMU's default).
	GuestMAC net.HardwareAddr
	// Dial is the egress hook. Required.
	Dial DialFunc
	// DialTimeout bounds each call to Dial. Default 15 s.
	DialTimeout time.Duration
	// MaxInflightDials caps concurrent Dial calls per protocol. Default 64.
	MaxInflightDials int
	// MaxConns caps TCP connections plus UDP flows. Default 1024.
	MaxConns int
	// UDPIdle closes a UDP flow with no datagram either way for this long.
	// Default 60 s.
	UDPIdle time.Duration
	// Ping, if set, answers the guest's ICMP echo requests (see PingFunc);
	// without it they are dropped like other ICMP.
	Ping PingFunc
	// PingTimeout bounds each call to Ping. Default 5 s.
	PingTimeout time.Duration
	// Busy, if set, is told of every guest flow refused or dropped before
	// Dial because a cap was full (the flows Stats.DialsBusy counts): limit
	// is "max_conns" or "dials_in_flight". It runs on the packet path and
	// must not block.
	Busy func(proto string, dst netip.AddrPort, limit string)
	// Logger; nil discards.
	Logger *slog.Logger
}

const (
	ethHeaderLen = 14
	minMTU       = 576
	maxMTU       = 65520
)

var (
	defaultGatewayIP  = netip.AddrFrom4([4]byte{10, 0, 2, 2})
	defaultGuestIP    = netip.AddrFrom4([4]byte{10, 0, 2, 15})
	defaultGatewayMAC = net.HardwareAddr{0x52, 0x55, 0x0a, 0x00, 0x02, 0x02}
	defaultGuestMAC   = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
)

// withDefaults returns c with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	if !c.GatewayIP.IsValid() {
		c.GatewayIP = defaultGatewayIP
	}
	if !c.GuestIP.IsValid() {
		c.GuestIP = defaultGuestIP
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.GatewayMAC == nil {
		c.GatewayMAC = defaultGatewayMAC
	}
	if c.GuestMAC == nil {
		c.GuestMAC = defaultGuestMAC
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 15 * time.Second
	}
	if c.PingTimeout == 0 {
		c.PingTimeout = defaultPingTimeout
	}
	if c.MaxInflightDials == 0 {
		c.MaxInflightDials = 64
	}
	if c.MaxConns == 0 {
		c.MaxConns = 1024
	}
	if c.UDPIdle == 0 {
		c.UDPIdle = 60 * time.Second
	}
	if c.Busy == nil {
		c.Busy = func(string, netip.AddrPort, string) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports whether c, after defaults, is usable.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Dial == nil {
		errs = append(errs, errors.New("dial hook is required"))
	}
	if !c.GatewayIP.Is4() {
		errs = append(errs, fmt.Errorf("gateway ip %v is not ipv4", c.GatewayIP))
	}
	if !c.GuestIP.Is4() {
		errs = append(errs, fmt.Errorf("guest ip %v is not ipv4", c.GuestIP))
	}
	if c.GatewayIP == c.GuestIP {
		errs = append(errs, errors.New("gateway and guest ip are the same"))
	}
	if c.MTU < minMTU || c.MTU > maxMTU {
		errs = append(errs, fmt.Errorf("mtu %d outside [%d, %d]", c.MTU, minMTU, maxMTU))
	}
	if len(c.GatewayMAC) != 6 || len(c.GuestMAC) != 6 {
		errs = append(errs, errors.New("macs must be 6 bytes"))
	}
	if c.DialTimeout < 0 || c.PingTimeout < 0 || c.UDPIdle < 0 || c.MaxInflightDials < 0 || c.MaxConns < 0 {
		errs = append(errs, errors.New("timeouts and limits must not be negative"))
	}
	return errors.Join(errs...)
}
