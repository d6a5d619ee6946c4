package secrets

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
)

// refusal is a request the interceptor will not forward: the status and
// plain-text reason sent to the guest. Reasons are fixed strings; they never
// quote guest bytes or secret values.
type refusal struct {
	status int
	reason string
}

func refuse(status int, reason string) *refusal { return &refusal{status: status, reason: reason} }

// head is what checkHead learned from a raw request head.
type head struct {
	host      string // the one Host header's value, as sent
	expect    string // the Expect header's value, lower-case ("" if none)
	websocket bool   // a WebSocket opening handshake (RFC 6455 4.1)
}

// checkHead validates a raw HTTP/1.1 request head (the request line and
// header fields, ending with the empty line) more strictly than
// http.ReadRequest, so nothing that two parsers could read differently
// reaches the upstream: it refuses bare CR or LF, NUL and other control
// bytes, obs-fold continuation lines, header names that are not tokens
// (whitespace before the colon included), any Content-Length that is not
// plain digits or appears twice, any Transfer-Encoding other than exactly one
// "chunked", Content-Length together with Transfer-Encoding, a Host header
// missing or repeated, CONNECT, protocol upgrades (Upgrade, HTTP2-Settings,
// "Connection: upgrade"), the HTTP/2 preface, request trailers, and any
// protocol version but HTTP/1.1. The one upgrade it lets through is a
// WebSocket opening handshake: a GET without a body carrying exactly one
// "Upgrade: websocket", "upgrade" in Connection, one Sec-WebSocket-Key and
// "Sec-WebSocket-Version: 13".
func checkHead(raw []byte) (*head, *refusal) {
	end := bytes.Index(raw, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, refuse(http.StatusBadRequest, "malformed request head")
	}
	raw = raw[:end+2] // every line, each with its CRLF
	for i, c := range raw {
		switch {
		case c == '\n' && (i == 0 || raw[i-1] != '\r'):
			return nil, refuse(http.StatusBadRequest, "bare LF in request head")
		case c == '\r' && (i+1 == len(raw) || raw[i+1] != '\n'):
			return nil, refuse(http.StatusBadRequest, "bare CR in request head")
		case c == 0:
			return nil, refuse(http.StatusBadRequest, "NUL in request head")
		}
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\r\n"), "\r\n")
	if r := checkRequestLine(lines[0]); r != nil {
		return nil, r
	}
	h := &head{}
	var hosts, lengths, encodings, upgrades, keys, versions int
	var connUpgrade, wsVersion13 bool
	for _, line := range lines[1:] {
		if line == "" || line[0] == ' ' || line[0] == '\t' {
			return nil, refuse(http.StatusBadRequest, "obsolete line folding in request head")
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || !isToken(name) {
			return nil, refuse(http.StatusBadRequest, "malformed header field")
		}
		value = strings.Trim(value, " \t")
		for i := 0; i < len(value); i++ {
			if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
				return nil, refuse(http.StatusBadRequest, "control character in header value")
			}
		}
		switch strings.ToLower(name) {
		case "host":
			hosts++
			h.host = value
		case "content-length":
			lengths++
			if value == "" || len(value) > 18 || strings.Trim(value, "0123456789") != "" {
				return nil, refuse(http.StatusBadRequest, "malformed Content-Length")
			}
		case "transfer-encoding":
			encodings++
			if !strings.EqualFold(value, "chunked") {
				return nil, refuse(http.StatusNotImplemented, "unsupported Transfer-Encoding")
			}
		case "upgrade":
			upgrades++
			if !strings.EqualFold(value, "websocket") {
				return nil, refuse(http.StatusNotImplemented, "protocol upgrades are not supported")
			}
		case "http2-settings":
			return nil, refuse(http.StatusNotImplemented, "protocol upgrades are not supported")
		case "connection":
			for tok := range strings.SplitSeq(value, ",") {
				if strings.EqualFold(strings.Trim(tok, " \t"), "upgrade") {
					connUpgrade = true
				}
			}
		case "sec-websocket-key":
			keys++
		case "sec-websocket-version":
			versions++
			wsVersion13 = value == "13"
		case "trailer":
			return nil, refuse(http.StatusNotImplemented, "request trailers are not supported")
		case "expect":
			if h.expect != "" {
				return nil, refuse(http.StatusExpectationFailed, "unsupported Expect")
			}
			h.expect = strings.ToLower(value)
		}
	}
	switch {
	case hosts != 1:
		return nil, refuse(http.StatusBadRequest, "request must carry exactly one Host header")
	case lengths > 1:
		return nil, refuse(http.StatusBadRequest, "duplicate Content-Length")
	case encodings > 1:
		return nil, refuse(http.StatusBadRequest, "duplicate Transfer-Encoding")
	case lengths > 0 && encodings > 0:
		return nil, refuse(http.StatusBadRequest, "both Content-Length and Transfer-Encoding")
	case h.expect != "" && h.expect != "100-continue":
		return nil, refuse(http.StatusExpectationFailed, "unsupported Expect")
	}
	if upgrades > 0 || connUpgrade {
		method, _, _ := strings.Cut(lines[0], " ")
		if upgrades != 1 || !connUpgrade || keys != 1 || versions != 1 || !wsVersion13 || method != http.MethodGet {
			return nil, refuse(http.StatusNotImplemented, "protocol upgrades are not supported")
		}
		if lengths > 0 || encodings > 0 || h.expect != "" {
			return nil, refuse(http.StatusBadRequest, "a WebSocket handshake must not have a body")
		}
		h.websocket = true
	}
	return h, nil
}

// checkRequestLine accepts "METHOD SP target SP HTTP/1.1" with a token
// method other than CONNECT and a target without spaces or controls.
func checkRequestLine(line string) *refusal {
	parts := strings.Split(line, " ")
	if len(parts) != 3 || !isToken(parts[0]) || parts[1] == "" {
		return refuse(http.StatusBadRequest, "malformed request line")
	}
	method, target, proto := parts[0], parts[1], parts[2]
	for i := 0; i < len(target); i++ {
		if c := target[i]; c <= ' ' || c >= 0x7f {
			return refuse(http.StatusBadRequest, "malformed request target")
		}
	}
	switch {
	case method == "PRI" && proto == "HTTP/2.0":
		return refuse(http.StatusHTTPVersionNotSupported, "HTTP/2 is not supported")
	case proto != "HTTP/1.1":
		return refuse(http.StatusHTTPVersionNotSupported, "only HTTP/1.1 is supported")
	case method == http.MethodConnect:
		return refuse(http.StatusMethodNotAllowed, "CONNECT is not supported")
	case target == "*" && method != http.MethodOptions:
		return refuse(http.StatusBadRequest, "malformed request target")
	}
	return nil
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// sameAuthority reports whether a Host header or URL authority names host
// (already normalised), with or without a port. The port is the one the
// guest connected to, which the egress policy has already decided on.
func sameAuthority(authority, host string) bool {
	a := authority
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		if p, err := strconv.ParseUint(a[i+1:], 10, 16); err != nil || p == 0 || a[i+1] == '+' {
			return false
		}
		a = a[:i]
	}
	if strings.ContainsAny(a, ":@[]") {
		return false
	}
	return normalizeHost(a) == host
}
