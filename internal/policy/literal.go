package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/idna"
)

// maxHostLen bounds the work done on a guest-supplied host string.
const maxHostLen = 1024

// ParseHostLiteral reports whether s, a host as it appears in a DNS query,
// SNI, Host header or URL authority (without a port), is an IP address
// literal, and returns it with any zone removed (not otherwise normalised;
// pass it to Classify). Besides canonical forms it accepts what inet_aton,
// libcurl and browsers accept for IPv4: one to four dot-separated parts, each
// decimal, hex ("0x") or octal (leading "0"), the last part filling the
// remaining bytes ("2852039166", "0xA9FEA9FE", "0251.0376.0251.0376",
// "127.1", "10.1.1", "0x7f.0.1"), and one trailing dot; and IPv6 with or
// without brackets and with a zone ("[fe80::1%25eth0]"). It returns false for
// anything else, such as real host names.
func ParseHostLiteral(s string) (netip.Addr, bool) {
	if s == "" || len(s) > maxHostLen {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		if len(s) < 2 || s[len(s)-1] != ']' {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return a.WithZone(""), true
	}
	if strings.IndexByte(s, ':') >= 0 {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return a.WithZone(""), true
	}
	return parseIPv4Loose(s)
}

func parseIPv4Loose(s string) (netip.Addr, bool) {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return netip.Addr{}, false
	}
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint32
	for i, p := range parts {
		n, ok := parseNumber(p)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if n > 0xff {
				return netip.Addr{}, false
			}
			v |= uint32(n) << (8 * (3 - i))
			continue
		}
		rest := 8 * (4 - i) // bits left for the last part
		if rest < 32 && n >= 1<<rest {
			return netip.Addr{}, false
		}
		v |= uint32(n)
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// parseNumber parses one inet_aton part; it fails above 2^32-1.
func parseNumber(p string) (uint64, bool) {
	if p == "" {
		return 0, false
	}
	base := uint64(10)
	switch {
	case len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X'):
		base, p = 16, p[2:] // "0x" alone is 0, as in browsers
	case len(p) >= 2 && p[0] == '0':
		base, p = 8, p[1:]
	}
	var n uint64
	for i := 0; i < len(p); i++ {
		var d uint64
		c := p[i]
		switch {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case 'a' <= c && c <= 'f':
			d = uint64(c-'a') + 10
		case 'A' <= c && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		n = n*base + d
		if n > 0xffffffff {
			return 0, false
		}
	}
	return n, true
}

var errName = errors.New("invalid name")

// NormalizeName returns the canonical form of a DNS name: IDNA to ASCII
// (golang.org/x/net/idna, lookup profile) when it has non-ASCII letters,
// lower case, one trailing dot removed. It rejects empty names and labels,
// labels over 63 bytes, names over 253 bytes, characters other than letters,
// digits, '-' and '_', labels that start or end with '-', and names whose
// last label is a number ("1.2.3.4", "foo.0x10"): those are IP literals (see
// ParseHostLiteral), never names.
func NormalizeName(s string) (string, error) {
	if len(s) > maxHostLen {
		return "", fmt.Errorf("%w: longer than 253 bytes", errName)
	}
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", fmt.Errorf("%w: empty", errName)
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			a, err := idna.Lookup.ToASCII(s)
			if err != nil {
				return "", fmt.Errorf("%w: %q: idna: %v", errName, s, err)
			}
			s = strings.TrimSuffix(a, ".")
			break
		}
	}
	s = strings.ToLower(s)
	if len(s) > 253 {
		return "", fmt.Errorf("%w: longer than 253 bytes", errName)
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" {
			return "", fmt.Errorf("%w: %q has an empty label", errName, s)
		}
		if len(l) > 63 {
			return "", fmt.Errorf("%w: %q has a label over 63 bytes", errName, s)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%w: %q has a label that starts or ends with '-'", errName, s)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%w: %q has the character %q", errName, s, c)
			}
		}
	}
	if _, ok := parseNumber(labels[len(labels)-1]); ok || isNumeric(labels[len(labels)-1]) {
		return "", fmt.Errorf("%w: %q ends in a number: an IP literal, not a name", errName, s)
	}
	return s, nil
}

// isNumeric reports whether l is all digits or "0x" plus hex digits, even
// when too large to parse (WHATWG "ends in a number").
func isNumeric(l string) bool {
	if len(l) >= 2 && l[0] == '0' && (l[1] == 'x' || l[1] == 'X') {
		l = l[2:]
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return l != ""
}
