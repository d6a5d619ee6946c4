package secrets

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// ErrNotTLS is returned by [PeekClientHello] when the stream does not start
// with a TLS handshake record.
var ErrNotTLS = errors.New("not a TLS handshake")

// Hello is what a TLS ClientHello says.
type Hello struct {
	ServerName string   // the SNI host name, as sent ("" if none)
	ALPN       []string // the offered application protocols, in order
}

const (
	recordHeaderLen = 5
	maxRecordLen    = 16384 // TLSPlaintext.length limit (RFC 8446 5.1)
	// MinPeekBuffer is the smallest bufio.Reader size PeekClientHello
	// accepts: one full record and its header.
	MinPeekBuffer = maxRecordLen + recordHeaderLen
)

// PeekClientHello parses the TLS ClientHello at the start of br without
// consuming anything (it only calls br.Peek), so the caller can still hand
// br's bytes to a TLS server. br must have a buffer of at least
// [MinPeekBuffer] bytes; a hello that does not fit in the buffer is an error.
//
// It returns [ErrNotTLS] as soon as the first byte is not a handshake record
// (0x16), a parse error for a malformed or truncated hello, and the hello
// otherwise. The hello may span several records. It blocks reading from br's
// source until the whole first handshake message is buffered, so the caller
// should set a read deadline.
func PeekClientHello(br *bufio.Reader) (*Hello, error) {
	if br.Size() < MinPeekBuffer {
		return nil, fmt.Errorf("peek client hello: buffer of %d bytes is smaller than %d", br.Size(), MinPeekBuffer)
	}
	first, err := br.Peek(1)
	if err != nil {
		return nil, fmt.Errorf("peek client hello: %w", err)
	}
	if first[0] != 0x16 {
		return nil, ErrNotTLS
	}
	// Gather handshake-record payloads until the first message is complete.
	var msg []byte
	off := 0
	for {
		hdr, err := peekAt(br, off, recordHeaderLen)
		if err != nil {
			return nil, err
		}
		if hdr[0] != 0x16 {
			return nil, fmt.Errorf("peek client hello: record type %d inside the hello", hdr[0])
		}
		if hdr[1] != 3 {
			return nil, fmt.Errorf("peek client hello: record version %d.%d", hdr[1], hdr[2])
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > maxRecordLen {
			return nil, fmt.Errorf("peek client hello: record length %d", n)
		}
		body, err := peekAt(br, off+recordHeaderLen, n)
		if err != nil {
			return nil, err
		}
		msg = append(msg, body...)
		off += recordHeaderLen + n
		if msg[0] != 1 {
			return nil, fmt.Errorf("peek client hello: handshake message type %d, not client_hello", msg[0])
		}
		if len(msg) >= 4 {
			mlen := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if 4+mlen > br.Size() {
				return nil, fmt.Errorf("peek client hello: hello of %d bytes does not fit the buffer", mlen)
			}
			if len(msg) >= 4+mlen {
				return parseClientHello(msg[4 : 4+mlen])
			}
		}
	}
}

// peekAt returns n bytes at offset off of br's buffered input, reading more
// as needed.
func peekAt(br *bufio.Reader, off, n int) ([]byte, error) {
	if off+n > br.Size() {
		return nil, errors.New("peek client hello: hello does not fit the buffer")
	}
	b, err := br.Peek(off + n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("peek client hello: truncated: %w", err)
	}
	return b[off:], nil
}

// parseClientHello parses a ClientHello body (RFC 8446 4.1.2; RFC 5246 7.4.1.2).
func parseClientHello(b []byte) (*Hello, error) {
	c := cursor(b)
	var random, sessionID, suites, compression, exts cursor
	if !c.skip(2) || !c.bytes(&random, 32) || !c.vec8(&sessionID) || len(sessionID) > 32 ||
		!c.vec16(&suites) || len(suites) < 2 || len(suites)%2 != 0 || !c.vec8(&compression) || len(compression) < 1 {
		return nil, errors.New("peek client hello: malformed hello")
	}
	h := &Hello{}
	if c.empty() {
		return h, nil // no extensions (SSL 3.0 style)
	}
	if !c.vec16(&exts) || !c.empty() {
		return nil, errors.New("peek client hello: malformed extensions")
	}
	seen := map[uint16]bool{}
	for !exts.empty() {
		var typ uint16
		var data cursor
		if !exts.u16(&typ) || !exts.vec16(&data) {
			return nil, errors.New("peek client hello: malformed extension")
		}
		if seen[typ] {
			return nil, fmt.Errorf("peek client hello: duplicate extension %d", typ)
		}
		seen[typ] = true
		switch typ {
		case 0: // server_name
			var list cursor
			if !data.vec16(&list) || !data.empty() || list.empty() {
				return nil, errors.New("peek client hello: malformed server_name")
			}
			for !list.empty() {
				var nameType uint8
				var name cursor
				if !list.u8(&nameType) || !list.vec16(&name) {
					return nil, errors.New("peek client hello: malformed server_name")
				}
				if nameType == 0 {
					if h.ServerName != "" || len(name) == 0 {
						return nil, errors.New("peek client hello: malformed server_name")
					}
					h.ServerName = string(name)
				}
			}
		case 16: // application_layer_protocol_negotiation
			var list cursor
			if !data.vec16(&list) || !data.empty() || list.empty() {
				return nil, errors.New("peek client hello: malformed alpn")
			}
			for !list.empty() {
				var proto cursor
				if !list.vec8(&proto) || len(proto) == 0 {
					return nil, errors.New("peek client hello: malformed alpn")
				}
				h.ALPN = append(h.ALPN, string(proto))
			}
		}
	}
	return h, nil
}

// cursor reads big-endian, length-prefixed TLS structures. Each method
// reports false, consuming nothing useful, if the input is too short.
type cursor []byte

func (c *cursor) empty() bool { return len(*c) == 0 }

func (c *cursor) skip(n int) bool {
	if len(*c) < n {
		return false
	}
	*c = (*c)[n:]
	return true
}

func (c *cursor) bytes(out *cursor, n int) bool {
	if len(*c) < n {
		return false
	}
	*out, *c = (*c)[:n], (*c)[n:]
	return true
}

func (c *cursor) u8(out *uint8) bool {
	if len(*c) < 1 {
		return false
	}
	*out, *c = (*c)[0], (*c)[1:]
	return true
}

func (c *cursor) u16(out *uint16) bool {
	if len(*c) < 2 {
		return false
	}
	*out, *c = uint16((*c)[0])<<8|uint16((*c)[1]), (*c)[2:]
	return true
}

func (c *cursor) vec8(out *cursor) bool {
	var n uint8
	return c.u8(&n) && c.bytes(out, int(n))
}

func (c *cursor) vec16(out *cursor) bool {
	var n uint16
	return c.u16(&n) && c.bytes(out, int(n))
}
