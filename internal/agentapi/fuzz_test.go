package agentapi

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// FuzzClientFromGuest feeds arbitrary bytes from a hostile "guest" to the
// host side of the handshake and the first RPC. The host must neither panic
// nor hang, and must only succeed for a real agent.
func FuzzClientFromGuest(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte(Banner))
	f.Add([]byte(Banner + "\x00\x00\x12\x04\x00\x00\x00\x00\x00"))                     // SETTINGS frame header, truncated
	f.Add([]byte(Banner + "\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x04\x01")) // SETTINGS + ack
	f.Add([]byte("junk" + Banner + "\xff\xff\xff\x00\x00\x00\x00\x00\x01"))            // huge frame length
	f.Fuzz(func(t *testing.T, data []byte) {
		host, guest := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			go func() { _, _ = io.Copy(io.Discard, guest) }() // never block the host's writes
			_, _ = guest.Write(data)
			time.Sleep(time.Millisecond)
			guest.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		c, err := Dial(ctx, host, Options{})
		if err == nil {
			// Random bytes cannot carry a valid protobuf Info answer on an
			// HTTP/2 stream the host opened after the guest wrote them.
			c.Close()
			t.Fatalf("Dial accepted %q", data)
		}
		host.Close()
		guest.Close()
		<-done
	})
}
