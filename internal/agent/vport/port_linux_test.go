package vport

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// pair returns a Port over one end of a blocking socketpair and the other
// end, standing in for the host.
func pair(t *testing.T) (*Port, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); unix.Close(fds[1]) })
	return p, fds[1]
}

// waitReading waits until a Read is inside p (it holds the read lock while
// it polls and reads), instead of sleeping and hoping it got there.
func waitReading(t *testing.T, p *Port) {
	t.Helper()
	if !testutil.WaitFor(t, 5*time.Second, func() bool {
		if p.rmu.TryLock() {
			p.rmu.Unlock()
			return false
		}
		return true
	}) {
		t.Fatal("the Read never started")
	}
}

func TestSessionReadWriteEOF(t *testing.T) {
	t.Parallel()
	p, host := pair(t)
	c := p.Conn()
	big := make([]byte, 100<<10)
	go func() { _, _ = c.Write(big) }()
	got := 0
	buf := make([]byte, 64<<10)
	for got < len(big) {
		n, err := unix.Read(host, buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if _, err := unix.Write(host, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	// The host goes away: read() returns 0.
	if err := unix.Shutdown(host, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("read after host left: %v, want EOF", err)
	}
}

// A session closed while its read is blocked in the kernel must hand the
// bytes that read gets to the next session.
func TestStaleReadHandsBytesToNextSession(t *testing.T) {
	t.Parallel()
	p, host := pair(t)
	old := p.Conn()
	res := make(chan error, 1)
	go func() {
		_, err := old.Read(make([]byte, 16))
		res <- err
	}()
	waitReading(t, p)
	old.Close()
	next := p.Conn()
	if _, err := unix.Write(host, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := <-res; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("stale read: %v, want ErrClosed", err)
	}
	buf := make([]byte, 16)
	n, err := next.Read(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("next session read %q, %v", buf[:n], err)
	}
	if _, err := old.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on a closed session: %v", err)
	}
}

func TestFind(t *testing.T) {
	t.Parallel()
	sys, dev := t.TempDir(), t.TempDir()
	for name, port := range map[string]string{"vport0p1": "org.qemu.guest_agent.0", "vport0p2": "airlock"} {
		if err := os.MkdirAll(filepath.Join(sys, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sys, name, "name"), []byte(port+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	// The device node shows up a little later than sysfs.
	go func() {
		time.Sleep(30 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(dev, "vport0p2"), nil, 0o600)
	}()
	got, err := Find(ctx, sys, dev, "airlock")
	if err != nil || got != filepath.Join(dev, "vport0p2") {
		t.Fatalf("Find = %q, %v", got, err)
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel2()
	if _, err := Find(ctx2, sys, dev, "other"); err == nil {
		t.Fatal("found a port that does not exist")
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	t.Parallel()
	p, _ := pair(t)
	c := p.Conn()
	res := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 16))
		res <- err
	}()
	waitReading(t, p)
	c.Close()
	select {
	case err := <-res:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Read")
	}
}
