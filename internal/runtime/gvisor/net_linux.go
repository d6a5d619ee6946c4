package gvisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

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

func (l *tapLink) netnsPath() string { return "/run/netns/" + l.ns }

func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// prepare creates the namespace, lo and the TAP, opens the TAP's fd, gives
// the TAP the guest's address and default route (runsc copies and then
// removes them: call again before each run), and starts the relay.
func (l *tapLink) prepare() error {
	if err := ipCmd("netns", "add", l.ns); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"-n", l.ns, "link", "set", "lo", "up"},
		{"-n", l.ns, "tuntap", "add", "dev", tapName, "mode", "tap"},
	} {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	tap, err := openTapIn(l.netnsPath(), tapName)
	if err != nil {
		return err
	}
	l.tap = tap
	gw := netconf.GatewayIP.String()
	for _, args := range [][]string{
		{"-n", l.ns, "addr", "replace", netip.PrefixFrom(netconf.GuestIP, netconf.PrefixLen).String(), "dev", tapName},
		// The shim's stack sends to the guest MAC every sandbox has (a
		// static neighbour); the sentry drops frames for another address.
		{"-n", l.ns, "link", "set", tapName, "address", netconf.GuestMAC},
		{"-n", l.ns, "link", "set", tapName, "up"},
		{"-n", l.ns, "route", "replace", "default", "via", gw, "dev", tapName},
	} {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
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

// openTapIn opens the TAP name in the namespace at nsPath. It switches one
// locked thread into the namespace and back; if it cannot switch back, the
// thread is left locked so that Go discards it.
func openTapIn(nsPath, name string) (*os.File, error) {
	goruntime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("open tap: %w", err)
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("open tap: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("open tap: setns: %w", err)
	}
	// No kernel IPv6 chatter on the TAP (best effort).
	for _, p := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		_ = os.WriteFile(p, []byte("1"), 0)
	}
	tap, terr := openTap(name)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Stay locked: the goroutine's exit then ends this thread.
		if tap != nil {
			tap.Close()
		}
		return nil, fmt.Errorf("open tap: setns back: %w", err)
	}
	goruntime.UnlockOSThread()
	return tap, terr
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
	return ipCmd("netns", "delete", l.ns)
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
