package secrets

import (
	"bufio"
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// FuzzRequestHead feeds arbitrary request heads to checkHead. Whatever it
// accepts, Go's parser (which builds the request forwarded upstream) must
// read with the same framing and Host, or refuse: the two parsers never
// disagree on where a request ends or whom it is for.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"POST /x?a=1 HTTP/1.1\r\nHost: api.test:443\r\nContent-Length: 4\r\n\r\ndata",
		"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET https://api.test/p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\nAuthorization: Basic dTphaXJsb2Nr\r\n\r\n",
		"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: eA==\r\nSec-WebSocket-Version: 13\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, r := checkHead(raw)
		if (h == nil) == (r == nil) {
			t.Fatalf("checkHead(%q) = %v, %v", raw, h, r)
		}
		if r != nil {
			if r.status < 400 || r.status > 599 || r.reason == "" {
				t.Fatalf("refusal %+v", r)
			}
			return
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // refused as "malformed request"
		}
		if req.ProtoMajor != 1 || req.ProtoMinor != 1 || req.Method == http.MethodConnect {
			t.Fatalf("accepted %q: %s %s", raw, req.Method, req.Proto)
		}
		if !req.URL.IsAbs() && req.Host != h.host {
			t.Fatalf("accepted %q: Go reads Host %q, checkHead %q", raw, req.Host, h.host)
		}
		lines := strings.ToLower(string(raw[:bytes.Index(raw, []byte("\r\n\r\n"))]))
		if h.websocket && (req.Method != http.MethodGet || req.ContentLength != 0 || req.Body != http.NoBody ||
			!strings.EqualFold(req.Header.Get("Upgrade"), "websocket")) {
			t.Fatalf("accepted %q as a WebSocket handshake: %s, body %d, Upgrade %q", raw, req.Method, req.ContentLength, req.Header.Get("Upgrade"))
		}
		if !h.websocket && (req.Header.Get("Upgrade") != "" || strings.Contains(lines, "\r\nupgrade:")) {
			t.Fatalf("accepted %q: an upgrade that is not a WebSocket handshake", raw)
		}
		switch {
		case strings.Contains(lines, "\r\ntransfer-encoding:"):
			if len(req.TransferEncoding) != 1 || req.TransferEncoding[0] != "chunked" {
				t.Fatalf("accepted %q: Go reads Transfer-Encoding %q", raw, req.TransferEncoding)
			}
		case strings.Contains(lines, "\r\ncontent-length:"):
			_, v, _ := strings.Cut(lines[strings.Index(lines, "\r\ncontent-length:")+2:], ":")
			v, _, _ = strings.Cut(v, "\r\n")
			n, _ := strconv.ParseInt(strings.Trim(v, " \t"), 10, 64)
			if req.ContentLength != n {
				t.Fatalf("accepted %q: Go reads Content-Length %d, want %d", raw, req.ContentLength, n)
			}
		default:
			if req.ContentLength != 0 || req.Body != http.NoBody {
				t.Fatalf("accepted %q: Go reads a body (%d)", raw, req.ContentLength)
			}
		}
	})
}
