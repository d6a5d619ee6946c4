package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Mode is a policy's default for public destinations.
type Mode string

// Modes. See the package documentation.
const (
	ModePublic Mode = "public"
	ModeDeny   Mode = "deny"
	ModeNone   Mode = "none"
)

// Rule is one parsed allow rule. Exactly one of Prefix (IP and CIDR rules)
// and Domain is set.
type Rule struct {
	ID       string       // "allow[i]"
	Text     string       // as written
	Prefix   netip.Prefix // normalised (IPv4-mapped and NAT64 prefixes become IPv4)
	Domain   string       // normalised name; for a wildcard, the part after "*."
	Wildcard bool         // matches names strictly below Domain
	PortLo   uint16       // 0 with PortHi 0: every port (and ICMP)
	PortHi   uint16
}

// matchName reports whether the normalised name matches a domain rule.
func (r *Rule) matchName(name string) bool {
	if r.Domain == "" || name == "" {
		return false
	}
	if r.Wildcard {
		return len(name) > len(r.Domain)+1 && strings.HasSuffix(name, r.Domain) && name[len(name)-len(r.Domain)-1] == '.'
	}
	return name == r.Domain
}

// matchPort reports whether the rule's port scope admits proto and port.
func (r *Rule) matchPort(proto string, port uint16) bool {
	if r.PortLo == 0 && r.PortHi == 0 {
		return true
	}
	if proto != "tcp" && proto != "udp" {
		return false
	}
	return r.PortLo <= port && port <= r.PortHi
}

// Policy is a parsed egress policy. The zero value is mode public with no
// rules and no host addresses. A Policy is immutable and safe to share.
type Policy struct {
	mode  Mode
	rules []Rule
	host  []netip.Addr // normalised
}

// Mode returns the policy's mode.
func (p Policy) Mode() Mode {
	if p.mode == "" {
		return ModePublic
	}
	return p.mode
}

// Rules returns a copy of the policy's rules, in order.
func (p Policy) Rules() []Rule { return slices.Clone(p.rules) }

// WithHostAddrs returns a copy of p that also denies addrs, the host's own
// addresses, unless a single-address IP rule allows them. The shim passes
// them in; policy never looks them up.
func (p Policy) WithHostAddrs(addrs ...netip.Addr) Policy {
	host := slices.Clone(p.host)
	for _, a := range addrs {
		if a = Normalize(a); a.IsValid() {
			host = append(host, a)
		}
	}
	p.host = host
	return p
}

// ParsePolicy parses a mode ("public", "deny", "none" or "" for the default)
// and allow rules (syntax in the package documentation). An empty mode means
// "public" when allow is empty and "deny" otherwise. Errors wrap
// errdefs.ErrInvalid and name the rule ("allow[2] \"*.com\": ...").
func ParsePolicy(mode string, allow []string) (Policy, error) {
	var m Mode
	switch mode {
	case "":
		m = ModePublic
		if len(allow) > 0 {
			m = ModeDeny
		}
	case string(ModePublic), string(ModeDeny), string(ModeNone):
		m = Mode(mode)
	default:
		return Policy{}, fmt.Errorf("%w: network mode %q: want public, deny or none", errdefs.ErrInvalid, mode)
	}
	if m == ModeNone && len(allow) > 0 {
		return Policy{}, fmt.Errorf("%w: network mode none takes no allow rules (%d given)", errdefs.ErrInvalid, len(allow))
	}
	p := Policy{mode: m, rules: make([]Rule, 0, len(allow))}
	for i, s := range allow {
		r, err := ParseRule(s)
		if err != nil {
			return Policy{}, fmt.Errorf("%w: allow[%d] %q: %v", errdefs.ErrInvalid, i, s, err)
		}
		r.ID = "allow[" + strconv.Itoa(i) + "]"
		p.rules = append(p.rules, r)
	}
	return p, nil
}

// ParseRule parses one allow rule; the returned rule has no ID.
func ParseRule(s string) (Rule, error) {
	r := Rule{Text: s}
	s = strings.TrimSpace(s)
	if s == "" {
		return r, fmt.Errorf("empty rule")
	}
	if len(s) > maxHostLen {
		return r, fmt.Errorf("rule too long")
	}
	host, ports := s, ""
	switch {
	case s[0] == '[':
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return r, fmt.Errorf("missing ']'")
		}
		host, ports = s[1:end], s[end+1:]
		if ports != "" {
			if ports[0] != ':' {
				return r, fmt.Errorf("unexpected %q after ']'", ports)
			}
			ports = ports[1:]
			if ports == "" {
				return r, fmt.Errorf("empty port")
			}
		}
		if !strings.Contains(host, ":") {
			return r, fmt.Errorf("brackets are for IPv6 addresses only")
		}
	case strings.Count(s, ":") == 1:
		i := strings.IndexByte(s, ':')
		host, ports = s[:i], s[i+1:]
		if ports == "" {
			return r, fmt.Errorf("empty port")
		}
	}
	if ports != "" {
		lo, hi, err := parsePorts(ports)
		if err != nil {
			return r, err
		}
		r.PortLo, r.PortHi = lo, hi
	}
	if host == "" {
		return r, fmt.Errorf("empty host")
	}
	if strings.Contains(host, "%") {
		return r, fmt.Errorf("zones are not allowed in rules")
	}
	if strings.Contains(host, "/") {
		pfx, err := netip.ParsePrefix(host)
		if err != nil {
			return r, fmt.Errorf("bad CIDR: %v", err)
		}
		if pfx.Masked() != pfx {
			return r, fmt.Errorf("CIDR has host bits set; write %s", pfx.Masked())
		}
		r.Prefix = normalizePrefix(pfx)
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		a = Normalize(a)
		r.Prefix = netip.PrefixFrom(a, a.BitLen())
		return r, nil
	}
	if a, ok := ParseHostLiteral(host); ok {
		return r, fmt.Errorf("non-canonical IP literal; write %s", a)
	}
	if strings.Contains(host, ":") {
		return r, fmt.Errorf("bad IPv6 address (put it in brackets to add a port: [2001:db8::1]:443)")
	}
	if host == "*" {
		return r, fmt.Errorf("'*' alone is not a rule; use network mode public")
	}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard = true
		host = rest
	}
	if strings.Contains(host, "*") {
		return r, fmt.Errorf("a wildcard must be the whole leftmost label, as in *.example.com")
	}
	name, err := NormalizeName(host)
	if err != nil {
		return r, err
	}
	if r.Wildcard {
		// ICANN suffixes only: private-section entries (github.io,
		// githubusercontent.com) are one operator's namespace, and
		// "*.githubusercontent.com" is a rule users need.
		if ps, icann := publicsuffix.PublicSuffix(name); ps == name && icann {
			return r, fmt.Errorf("wildcard over the public suffix %q would match other owners' names", name)
		}
	}
	r.Domain = name
	return r, nil
}

// normalizePrefix turns IPv4-mapped and NAT64 prefixes of /96 or longer
// into the IPv4 prefix they stand for, matching Normalize.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	a := p.Addr()
	if a.Is6() && p.Bits() >= 96 {
		if n := Normalize(a); n.Is4() && (a.Is4In6() || nat64.Contains(a) || nat64L.Contains(a)) {
			return netip.PrefixFrom(n, p.Bits()-96)
		}
	}
	return p
}

func parsePorts(s string) (lo, hi uint16, err error) {
	los, his, isRange := strings.Cut(s, "-")
	lo, err = parsePort(los)
	if err != nil {
		return 0, 0, err
	}
	hi = lo
	if isRange {
		if hi, err = parsePort(his); err != nil {
			return 0, 0, err
		}
		if lo > hi {
			return 0, 0, fmt.Errorf("port range %d-%d is backwards", lo, hi)
		}
	}
	return lo, hi, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 || s[0] == '+' {
		return 0, fmt.Errorf("bad port %q: want 1-65535", s)
	}
	return uint16(n), nil
}
