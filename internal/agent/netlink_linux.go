package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// The guest NIC is configured with a few rtnetlink requests on x/sys/unix
// (link flags and MTU, IPv4 addresses, the default route): a netlink
// library would more than double the code linked for it.

// errNoNIC means the guest has no Ethernet interface (no Spec.Network).
var errNoNIC = errors.New("the guest has no network interface")

// guestNIC returns the virtio NIC: the first non-loopback interface with an
// Ethernet MAC, by index (normally eth0).
func guestNIC() (net.Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return net.Interface{}, fmt.Errorf("list interfaces: %w", err)
	}
	slices.SortFunc(ifs, func(a, b net.Interface) int { return a.Index - b.Index })
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback == 0 && len(ifc.HardwareAddr) == 6 {
			return ifc, nil
		}
	}
	return net.Interface{}, errNoNIC
}

// configureNIC applies c to the guest NIC: for an enabled config IPv6 off,
// the MTU, exactly one IPv4 address, link up and the default route; for a
// disabled one link down and no IPv4 address (the kernel then drops the
// routes through it). Idempotent.
func configureNIC(c netConfig) error {
	ifc, err := guestNIC()
	if err != nil {
		return err
	}
	nl, err := openRTNL()
	if err != nil {
		return err
	}
	defer nl.close()
	if !c.Enabled {
		if err := nl.setLink(ifc.Index, false, 0); err != nil {
			return fmt.Errorf("link down: %w", err)
		}
		return nl.syncAddrs(ifc.Index, netip.Prefix{})
	}
	// Best effort: the guest speaks IPv4 only (the host serves no IPv6),
	// and a gratuitous ARP when the link comes up tells the host the MAC.
	for _, kv := range [][2]string{
		{"/proc/sys/net/ipv6/conf/" + ifc.Name + "/disable_ipv6", "1"},
		{"/proc/sys/net/ipv6/conf/" + ifc.Name + "/accept_ra", "0"},
		{"/proc/sys/net/ipv4/conf/" + ifc.Name + "/arp_notify", "1"},
	} {
		_ = os.WriteFile(kv[0], []byte(kv[1]), 0)
	}
	mtu := c.MTU
	if mtu == uint32(ifc.MTU) {
		mtu = 0
	}
	if err := nl.syncAddrs(ifc.Index, c.Address); err != nil {
		return err
	}
	if err := nl.setLink(ifc.Index, true, mtu); err != nil {
		return fmt.Errorf("link up: %w", err)
	}
	if err := nl.replaceDefaultRoute(ifc.Index, c.Gateway); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// rtnl is a NETLINK_ROUTE socket that sends one request at a time.
type rtnl struct {
	fd  int
	seq uint32
	buf []byte
}

func openRTNL() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	return &rtnl{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (nl *rtnl) close() { unix.Close(nl.fd) }

// request sends a message of type typ with body and waits for its ack.
func (nl *rtnl) request(typ, flags uint16, body []byte) error {
	_, err := nl.send(typ, flags|unix.NLM_F_ACK, body)
	return err
}

// dump sends a dump request and returns its entries.
func (nl *rtnl) dump(typ uint16, body []byte) ([]syscall.NetlinkMessage, error) {
	return nl.send(typ, unix.NLM_F_DUMP, body)
}

// send sends one message and reads the replies up to NLMSG_DONE or the ack
// (NLMSG_ERROR). Flags NLM_F_DUMP and NLM_F_REPLACE share a bit: callers
// say which they mean through request or dump.
func (nl *rtnl) send(typ, flags uint16, body []byte) ([]syscall.NetlinkMessage, error) {
	nl.seq++
	flags |= unix.NLM_F_REQUEST
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	ne.PutUint16(msg[4:], typ)
	ne.PutUint16(msg[6:], flags)
	ne.PutUint32(msg[8:], nl.seq)
	msg = append(msg, body...)
	if err := unix.Sendto(nl.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	var out []syscall.NetlinkMessage
	for {
		n, _, err := unix.Recvfrom(nl.fd, nl.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("netlink recv: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(nl.buf[:n])
		if err != nil {
			return nil, fmt.Errorf("netlink parse: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != nl.seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("netlink: short error message")
				}
				if e := int32(ne.Uint32(m.Data)); e != 0 {
					return nil, syscall.Errno(-e)
				}
				return out, nil
			default:
				// Data is only valid until the next Recvfrom.
				m.Data = slices.Clone(m.Data)
				out = append(out, m)
			}
		}
	}
}

// rtattr encodes one route attribute, padded to 4 bytes.
func rtattr(typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofRtAttr:], data)
	return b
}

// setLink sets IFF_UP (or clears it) and, if mtu > 0, the MTU.
func (nl *rtnl) setLink(index int, up bool, mtu uint32) error {
	b := make([]byte, unix.SizeofIfInfomsg) // ifinfomsg
	b[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	if up {
		binary.NativeEndian.PutUint32(b[8:], unix.IFF_UP)
	}
	binary.NativeEndian.PutUint32(b[12:], unix.IFF_UP) // change mask
	if mtu > 0 {
		b = append(b, rtattr(unix.IFLA_MTU, binary.NativeEndian.AppendUint32(nil, mtu))...)
	}
	return nl.request(unix.RTM_NEWLINK, 0, b)
}

// ifaddrmsg encodes struct ifaddrmsg for an IPv4 address.
func ifaddrmsg(index int, bits int) []byte {
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0] = unix.AF_INET
	b[1] = byte(bits)
	binary.NativeEndian.PutUint32(b[4:], uint32(index))
	return b
}

// syncAddrs leaves want as the link's only IPv4 address (none if want is
// the zero Prefix), touching nothing if that is already so.
func (nl *rtnl) syncAddrs(index int, want netip.Prefix) error {
	msgs, err := nl.dump(unix.RTM_GETADDR, ifaddrmsg(0, 0))
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	have := false
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		if m.Data[0] != unix.AF_INET || int(binary.NativeEndian.Uint32(m.Data[4:])) != index {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return fmt.Errorf("list addresses: %w", err)
		}
		var local netip.Addr
		for _, a := range attrs {
			if ip, ok := netip.AddrFromSlice(a.Value); ok && (a.Attr.Type == unix.IFA_LOCAL || !local.IsValid() && a.Attr.Type == unix.IFA_ADDRESS) {
				local = ip
			}
		}
		p := netip.PrefixFrom(local, int(m.Data[1]))
		if want.IsValid() && p == want {
			have = true
			continue
		}
		body := append(ifaddrmsg(index, p.Bits()), rtattr(unix.IFA_LOCAL, local.AsSlice())...)
		if err := nl.request(unix.RTM_DELADDR, 0, body); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("remove address: %w", err)
		}
	}
	if !want.IsValid() || have {
		return nil
	}
	a := want.Addr().AsSlice()
	body := ifaddrmsg(index, want.Bits())
	body = append(body, rtattr(unix.IFA_LOCAL, a)...)
	body = append(body, rtattr(unix.IFA_ADDRESS, a)...)
	body = append(body, rtattr(unix.IFA_BROADCAST, lastAddr(want).AsSlice())...)
	if err := nl.request(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, body); err != nil {
		return fmt.Errorf("add address: %w", err)
	}
	return nil
}

// replaceDefaultRoute sets the main table's IPv4 default route to gw via
// the link.
func (nl *rtnl) replaceDefaultRoute(index int, gw netip.Addr) error {
	b := make([]byte, unix.SizeofRtMsg) // rtmsg
	b[0] = unix.AF_INET
	b[4] = unix.RT_TABLE_MAIN
	b[5] = unix.RTPROT_BOOT
	b[6] = unix.RT_SCOPE_UNIVERSE
	b[7] = unix.RTN_UNICAST
	b = append(b, rtattr(unix.RTA_GATEWAY, gw.AsSlice())...)
	b = append(b, rtattr(unix.RTA_OIF, binary.NativeEndian.AppendUint32(nil, uint32(index)))...)
	return nl.request(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, b)
}
