package secrets

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
)

// clientHello captures the records a real crypto/tls client sends first.
func clientHello(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tc := tls.Client(c, cfg)
		_ = tc.Handshake() // fails once the server side closes
		c.Close()
	}()
	br := bufio.NewReaderSize(s, MinPeekBuffer)
	if _, err := PeekClientHello(br); err != nil {
		t.Fatalf("PeekClientHello on a real hello: %v", err)
	}
	raw, _ := br.Peek(br.Buffered())
	raw = bytes.Clone(raw)
	s.Close()
	<-done
	return raw
}

func TestPeekClientHello(t *testing.T) {
	t.Parallel()
	raw := clientHello(t, &tls.Config{ServerName: "API.test", NextProtos: []string{"h2", "http/1.1"}})

	h, err := PeekClientHello(bufio.NewReaderSize(bytes.NewReader(raw), MinPeekBuffer))
	if err != nil {
		t.Fatal(err)
	}
	if h.ServerName != "API.test" || !slices.Equal(h.ALPN, []string{"h2", "http/1.1"}) {
		t.Errorf("hello = %+v", h)
	}

	// Nothing is consumed.
	br := bufio.NewReaderSize(bytes.NewReader(raw), MinPeekBuffer)
	if _, err := PeekClientHello(br); err != nil {
		t.Fatal(err)
	}
	if all, _ := io.ReadAll(br); !bytes.Equal(all, raw) {
		t.Error("PeekClientHello consumed input")
	}

	// The same hello split into records of 7 bytes of payload each.
	body := raw[5 : 5+(int(raw[3])<<8|int(raw[4]))]
	var split []byte
	for len(body) > 0 {
		n := min(7, len(body))
		split = append(split, 0x16, 3, 1, 0, byte(n))
		split = append(split, body[:n]...)
		body = body[n:]
	}
	h2, err := PeekClientHello(bufio.NewReaderSize(bytes.NewReader(split), MinPeekBuffer))
	if err != nil || h2.ServerName != "API.test" {
		t.Errorf("split hello: %+v, %v", h2, err)
	}

	noSNI := clientHello(t, &tls.Config{InsecureSkipVerify: true})
	if h, err := PeekClientHello(bufio.NewReaderSize(bytes.NewReader(noSNI), MinPeekBuffer)); err != nil || h.ServerName != "" || h.ALPN != nil {
		t.Errorf("hello without SNI: %+v, %v", h, err)
	}
}

func TestPeekClientHelloErrors(t *testing.T) {
	t.Parallel()
	raw := clientHello(t, &tls.Config{ServerName: "api.test"})
	corrupt := bytes.Clone(raw)
	corrupt[5+4+2+32] = 200 // session id length beyond the message
	tests := []struct {
		name    string
		in      []byte
		notTLS  bool
		wantErr string
	}{
		{"plaintext", []byte("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"), true, ""},
		{"empty", nil, false, "EOF"},
		{"truncated header", raw[:3], false, "truncated"},
		{"truncated body", raw[:len(raw)-10], false, "truncated"},
		{"corrupt", corrupt, false, "malformed"},
		{"alert record", []byte{0x16, 3, 1, 0, 2, 0x15, 0}, false, "not client_hello"},
		{"wrong record type after first", append([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 9}, 0x17, 3, 3, 0, 1, 0), false, "record type"},
		{"zero length", []byte{0x16, 3, 1, 0, 0}, false, "record length"},
		{"huge record", []byte{0x16, 3, 1, 0xff, 0xff}, false, "record length"},
		{"bad version", []byte{0x16, 9, 1, 0, 1, 1}, false, "version"},
		{"garbage", bytes.Repeat([]byte{0x16}, 64), false, "record version"},
	}
	for _, tt := range tests {
		_, err := PeekClientHello(bufio.NewReaderSize(bytes.NewReader(tt.in), MinPeekBuffer))
		if tt.notTLS {
			if !errors.Is(err, ErrNotTLS) {
				t.Errorf("%s: err = %v, want ErrNotTLS", tt.name, err)
			}
			continue
		}
		if err == nil || errors.Is(err, ErrNotTLS) || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: err = %v, want one containing %q", tt.name, err, tt.wantErr)
		}
	}
	if _, err := PeekClientHello(bufio.NewReaderSize(bytes.NewReader(raw), 4096)); err == nil {
		t.Error("a small buffer was accepted")
	}
}
