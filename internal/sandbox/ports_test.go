package sandbox

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"testing"
)

// portsServer serves a fake ports.sock: answer gets each connection's
// first bytes (as many as it reads) and returns the answer line.
func portsServer(t *testing.T, answer func(c net.Conn) string) (string, <-chan []byte) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ports.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan []byte, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rec := &recorder{Conn: c}
			line := answer(rec)
			got <- rec.buf.Bytes()
			_, _ = io.WriteString(c, line)
			c.Close()
		}
	}()
	return sock, got
}

type recorder struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// TestDialGuestPortNamesThePeer: with a peer, the request is the long form
// (zero bytes, port, length, address); without one, the 2-byte port.
func TestDialGuestPortNamesThePeer(t *testing.T) {
	t.Parallel()
	sock, got := portsServer(t, func(c net.Conn) string {
		b := make([]byte, 2)
		_, _ = io.ReadFull(c, b)
		if b[0] == 0 && b[1] == 0 {
			h := make([]byte, 3)
			_, _ = io.ReadFull(c, h)
			_, _ = io.ReadFull(c, make([]byte, h[2]))
		}
		return "ok\n"
	})
	c, err := DialGuestPortFrom(t.Context(), sock, 8080, "::ffff:192.0.2.9")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if b, want := <-got, append([]byte{0, 0, 0x1f, 0x90, 9}, "192.0.2.9"...); !bytes.Equal(b, want) {
		t.Fatalf("request %q, want %q", b, want)
	}
	for _, peer := range []string{"", "not-an-ip"} {
		c, err = DialGuestPortFrom(t.Context(), sock, 8080, peer)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if b := <-got; !bytes.Equal(b, []byte{0x1f, 0x90}) {
			t.Fatalf("peer %q: request %q, want the short form", peer, b)
		}
	}
}

// TestDialGuestPortOlderShim: a shim without the peer form reads its zero
// bytes as port 0 and refuses; the dial is made again in the short form.
func TestDialGuestPortOlderShim(t *testing.T) {
	t.Parallel()
	sock, got := portsServer(t, func(c net.Conn) string {
		b := make([]byte, 2)
		_, _ = io.ReadFull(c, b)
		if b[0] == 0 && b[1] == 0 {
			return "error: nothing accepts connections on guest port 0 (connection refused)\n"
		}
		return "ok\n"
	})
	c, err := DialGuestPortFrom(t.Context(), sock, 3000, "192.0.2.9")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if b := <-got; !bytes.Equal(b, []byte{0, 0}) {
		t.Fatalf("first request %q", b)
	}
	if b := <-got; !bytes.Equal(b, []byte{0x0b, 0xb8}) {
		t.Fatalf("second request %q, want the short form", b)
	}
	// A refusal for the port itself is not retried.
	sock, got = portsServer(t, func(c net.Conn) string {
		_, _ = io.ReadAll(io.LimitReader(c, 14))
		return "error: nothing accepts connections on guest port 3000 (connection refused)\n"
	})
	if _, err := DialGuestPortFrom(t.Context(), sock, 3000, "192.0.2.9"); err == nil {
		t.Fatal("a refused port dialed")
	}
	<-got
	select {
	case b := <-got:
		t.Fatalf("a refusal was retried: %q", b)
	default:
	}
}
