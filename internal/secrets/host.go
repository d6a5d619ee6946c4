package secrets

import "strings"

// HostMatches reports whether name matches pattern. A pattern "*.x.com"
// matches any name strictly below x.com ("a.x.com", "a.b.x.com") but not
// "x.com" itself; any other pattern matches only the identical name. Both are
// compared case-insensitively (ASCII) and one trailing dot is ignored on each.
// An empty name or pattern matches nothing.
func HostMatches(pattern, name string) bool {
	pattern, name = normalizeHost(pattern), normalizeHost(name)
	if pattern == "" || name == "" {
		return false
	}
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		if !strings.HasPrefix(suffix, ".") || len(suffix) < 2 {
			return false
		}
		return len(name) > len(suffix) && strings.HasSuffix(name, suffix) && name[len(name)-len(suffix)-1] != '.'
	}
	return pattern == name
}

// normalizeHost lower-cases an ASCII host name and drops one trailing dot.
func normalizeHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// validDNSName reports whether name (already normalised) is a plausible DNS
// host name: dot-separated labels of letters, digits, '-' and '_', each 1..63
// bytes, 253 bytes in all. It keeps odd SNI values out of certificates.
func validDNSName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// validPattern reports whether p is a normalised host or "*." wildcard
// pattern that [NewCA] and the interceptor accept.
func validPattern(p string) bool {
	if rest, ok := strings.CutPrefix(p, "*."); ok {
		return validDNSName(rest)
	}
	return validDNSName(p)
}
