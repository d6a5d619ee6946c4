package gvisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// tapName is the TAP's name in the sandbox's namespace; runsc gives the
// sandbox an interface of the same name.
const tapName = "eth0"

// maxFrame bounds one Ethernet frame (no FCS, MTU 1500, a VLAN tag).
const maxFrame = 1518

// tapLink is one sandbox's NIC: a named network namespace holding lo and a
// TAP, whose fd the host holds. runsc (--network=sandbox) takes over the
// TAP's address and serves the sandbox's stack on it; the host sees the
// sandbox's Ethernet frames on the TAP fd and relays them, framed as QEMU's
// -netdev stream does, over a socketpair whose other end is NetConn.
type tapLink struct {
	ns string // netns name (/run/netns/<ns>)

	tap   *os.File
	pump  *net.UnixConn // relay side of the socketpair
	guest *net.UnixConn // NetConn's side, until taken
	wg    sync.WaitGroup
}

func newTapLink(cid string) (*tapLink, error) {
	return &tapLink{ns: cid}, nil
}

func (l *tapLink) netnsPath() string { return filepath.Join(netnsDir, l.ns) }

// prepare creates the namespace with lo up and the TAP (whose fd it holds),
// gives the TAP the guest's MAC, address and default route (runsc copies
// and then removes them), and starts the relay. All of it is done by
// netlink from one thread switched into the new namespace and back: the
// eight `ip` processes it took before cost about 30 ms of every start.
func (l *tapLink) prepare() error {
	tap, err := inNewNetns(l.ns, setupTap)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", l.ns, err)
	}
	l.tap = tap
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("link socket: %w", err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "link-pump"), os.NewFile(uintptr(fds[1]), "link")
	ca, erra := net.FileConn(a)
	cb, errb := net.FileConn(b)
	a.Close()
	b.Close()
	if err := errors.Join(erra, errb); err != nil {
		return fmt.Errorf("link socket: %w", err)
	}
	l.pump, l.guest = ca.(*net.UnixConn), cb.(*net.UnixConn)
	l.wg.Go(l.tapToConn)
	l.wg.Go(l.connToTap)
	return nil
}

// netnsDir holds the named network namespaces, as iproute2 keeps them.
const netnsDir = "/run/netns"

// inNewNetns creates the network namespace name (bind-mounted at
// netnsDir/name, as `ip netns add` does) and runs setup inside it, on one
// locked thread that it switches into the namespace and back. If the
// thread cannot switch back it stays locked, so that Go discards it.
func inNewNetns(name string, setup func() (*os.File, error)) (*os.File, error) {
	if err := shareNetnsDir(); err != nil {
		return nil, err
	}
	goruntime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	var f *os.File
	ns, err := netns.NewNamed(name) // the thread is now in it, or may be on error
	if err == nil {
		ns.Close()
		if f, err = setup(); err != nil {
			_ = netns.DeleteNamed(name)
		}
	} else {
		_ = os.Remove(filepath.Join(netnsDir, name)) // if the bind mount failed
	}
	if serr := netns.Set(orig); serr != nil {
		if f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("setns back: %w", serr)
	}
	goruntime.UnlockOSThread()
	return f, err
}

// shareNetnsDir makes netnsDir a shared mount point, as iproute2 does, so
// that a namespace mounted or unmounted there reaches every mount
// namespace that copied it.
func shareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point yet
		if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("share %s: %w", netnsDir, err)
	}
	return nil
}

// setupTap runs in the sandbox's new namespace: lo up, no kernel IPv6
// chatter, the TAP created by opening it (it lives while its fd does)
// with the guest's address, MAC (the shim's stack sends to the one MAC
// every sandbox has; the sentry drops frames for another), and default
// route via the gateway.
func setupTap() (*os.File, error) {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return nil, fmt.Errorf("lo up: %w", err)
	}
	for _, p := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		_ = os.WriteFile(p, []byte("1"), 0) // best effort
	}
	tap, err := openTap(tapName)
	if err != nil {
		return nil, err
	}
	if err := configureTap(); err != nil {
		tap.Close()
		return nil, err
	}
	return tap, nil
}

func configureTap() error {
	link, err := netlink.LinkByName(tapName)
	if err != nil {
		return fmt.Errorf("tap: %w", err)
	}
	mac, err := net.ParseMAC(netconf.GuestMAC)
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: netconf.GuestIP.AsSlice(), Mask: net.CIDRMask(netconf.PrefixLen, 32)}}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("tap address: %w", err)
	}
	if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
		return fmt.Errorf("tap MAC: %w", err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("tap up: %w", err)
	}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: netconf.GatewayIP.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open tap: %w", err)
	}
	var ifr [unix.IFNAMSIZ + 64]byte
	copy(ifr[:unix.IFNAMSIZ-1], name)
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("open tap: TUNSETIFF: %w", e)
	}
	return os.NewFile(uintptr(fd), "tap"), nil
}

// tapToConn relays frames from the TAP to the conn, each behind its
// 4-byte big-endian length.
func (l *tapLink) tapToConn() {
	buf := make([]byte, 4+65536)
	for {
		n, err := l.tap.Read(buf[4:])
		if err != nil {
			return
		}
		binary.BigEndian.PutUint32(buf, uint32(n))
		if _, err := l.pump.Write(buf[:4+n]); err != nil {
			return
		}
	}
}

// connToTap relays length-prefixed frames from the conn to the TAP. A
// frame longer than maxFrame ends the link.
func (l *tapLink) connToTap() {
	var hdr [4]byte
	buf := make([]byte, maxFrame)
	for {
		if _, err := io.ReadFull(l.pump, hdr[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFrame {
			_ = l.pump.Close()
			return
		}
		if _, err := io.ReadFull(l.pump, buf[:n]); err != nil {
			return
		}
		if _, err := l.tap.Write(buf[:n]); err != nil && !errors.Is(err, unix.EIO) {
			return // EIO: the TAP is down for a moment; drop the frame
		}
	}
}

// takeConn hands NetConn's end to the caller.
func (l *tapLink) takeConn() net.Conn {
	c := l.guest
	l.guest = nil
	return c
}

// closeConn closes NetConn's end if nobody took it.
func (l *tapLink) closeConn() {
	if l.guest != nil {
		_ = l.guest.Close()
		l.guest = nil
	}
}

// destroy stops the relay, closes the TAP and deletes the namespace (and
// with it lo and the TAP).
func (l *tapLink) destroy() error {
	if l.pump != nil {
		_ = l.pump.Close()
	}
	if l.tap != nil {
		_ = l.tap.Close()
	}
	l.wg.Wait()
	if _, err := os.Stat(l.netnsPath()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := netns.DeleteNamed(l.ns); err != nil {
		return fmt.Errorf("delete network namespace %s: %w", l.ns, err)
	}
	return nil
}

// NetConn returns the host end of the sandbox's NIC: QEMU's -netdev stream
// framing (4-byte big-endian length, then an Ethernet frame) over a unix
// socket. Callable once after Start; the caller closes it.
func (in *instance) NetConn(ctx context.Context) (net.Conn, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	switch {
	case in.state != stateRunning:
		return nil, runtime.ErrNotRunning
	case in.link == nil:
		return nil, errors.New("gvisor: instance has no network (Spec.Network)")
	case in.linkTaken:
		return nil, errors.New("gvisor: net conn already taken")
	}
	in.linkTaken = true
	return in.link.takeConn(), nil
}
