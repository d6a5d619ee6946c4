package policy

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Request is one flow the guest opened, as the netstack sees it at dial time.
type Request struct {
	Proto string         // "tcp", "udp" or "icmp" (either IP version)
	Dst   netip.AddrPort // destination as the guest addressed it; the port is ignored for icmp
	// Name is the name this sandbox resolved to Dst's address (PinSet.Lookup),
	// or "". Names adds more when several pinned names share the address (a
	// CDN); a domain rule matches if any of them matches it.
	Name  string
	Names []string
	// SNI is the server name of the TLS ClientHello, when there was one.
	SNI string
	// HostAddrs are the host's own addresses, denied like the floor; they
	// add to Policy.WithHostAddrs.
	HostAddrs []netip.Addr
}

// Decision is the verdict on a flow, a DNS answer or a name.
type Decision struct {
	Allow bool
	// RuleID names what decided: an allow rule ("allow[2]"), the mode
	// ("mode:public", "mode:deny", "mode:none"), the platform floor
	// ("floor:metadata", "floor:host", ...) or a check ("sni:mismatch",
	// "proto:unknown", "name:invalid", "name:metadata").
	RuleID string
	Reason string     // one line for the audit log
	Class  Class      // class of the destination; ClassInvalid for name-only decisions
	Addr   netip.Addr // normalised destination; invalid for name-only decisions
}

func allow(id, reason string, c Class, a netip.Addr) Decision {
	return Decision{Allow: true, RuleID: id, Reason: "allowed: " + reason, Class: c, Addr: a}
}

func deny(id, reason string, c Class, a netip.Addr) Decision {
	return Decision{RuleID: id, Reason: "denied: " + reason, Class: c, Addr: a}
}

// floorInfo says whether an address sits on the platform floor and why.
type floorInfo struct {
	detail
	host bool
}

func (f floorInfo) floor() bool { return f.host || f.class.Floor() }

// what describes a floor address for a reason.
func (f floorInfo) what() string {
	s := f.addr.String()
	switch {
	case f.host:
		return s + " is an address of the host"
	case f.via.IsValid():
		return s + " embeds " + f.via.String() + ", " + f.class.phrase()
	default:
		return s + " is " + f.class.phrase()
	}
}

func (f floorInfo) id() string {
	if f.host {
		return "floor:host"
	}
	return "floor:" + f.class.String()
}

func (p Policy) floorInfo(addr netip.Addr, extraHost []netip.Addr) floorInfo {
	f := floorInfo{detail: classify(addr)}
	if f.addr.IsValid() {
		f.host = slices.Contains(p.host, f.addr) || slices.ContainsFunc(extraHost, func(h netip.Addr) bool { return Normalize(h) == f.addr })
	}
	return f
}

// opens reports whether IP rule r may open the floor address f: it must
// cover it and stay inside the special-purpose block that gave the class;
// metadata, host and embedded-class addresses need a single-address rule.
func (r *Rule) opens(f floorInfo) bool {
	if !r.Prefix.IsValid() || !r.Prefix.Contains(f.addr) {
		return false
	}
	if r.Prefix.IsSingleIP() {
		return true
	}
	if f.host || f.class == ClassMetadata || !f.block.IsValid() {
		return false
	}
	return f.block.Bits() <= r.Prefix.Bits() && f.block.Contains(r.Prefix.Addr())
}

// Decide decides one flow. Order: protocol, SNI literal, mode none, the allow
// rules in order (first match wins; IP rules open the floor as described in
// the package documentation; domain rules only match public addresses through
// a pinned name, and SNI, if any, must match the same rule), then the floor,
// then the mode.
func Decide(p Policy, r Request) Decision {
	f := p.floorInfo(r.Dst.Addr(), r.HostAddrs)
	switch r.Proto {
	case "tcp", "udp", "icmp":
	default:
		return deny("proto:unknown", "protocol "+quote(r.Proto)+" is not supported", f.class, f.addr)
	}
	if f.class == ClassInvalid {
		return deny("floor:invalid", "destination is not a valid address", f.class, f.addr)
	}
	dst := f.addr.String()
	if r.Proto != "icmp" {
		dst = netip.AddrPortFrom(f.addr, r.Dst.Port()).String()
	}
	var sniName string
	if r.SNI != "" {
		if a, ok := ParseHostLiteral(r.SNI); ok {
			if Normalize(a) != f.addr {
				return deny("sni:mismatch", "TLS SNI "+quote(r.SNI)+" is an IP literal other than the destination "+f.addr.String(), f.class, f.addr)
			}
		} else {
			n, err := NormalizeName(r.SNI)
			if err != nil {
				return deny("sni:invalid", "TLS SNI "+quote(r.SNI)+" is not a valid name", f.class, f.addr)
			}
			sniName = n
		}
	}
	if p.Mode() == ModeNone {
		return deny("mode:none", "network mode none (to "+dst+")", f.class, f.addr)
	}
	names := make([]string, 0, 1+len(r.Names))
	for _, n := range append([]string{r.Name}, r.Names...) {
		if n == "" {
			continue
		}
		if nn, err := NormalizeName(n); err == nil {
			names = append(names, nn)
		}
	}
	floor := f.floor()
	// Mail ports to public addresses in mode public need a rule that names
	// the port: a rule for every port does not open them.
	mail := p.Mode() == ModePublic && !floor && r.Proto == "tcp" && IsMailPort(r.Dst.Port())
	var tooBroad *Rule
	var sniMiss *Rule
	for i := range p.rules {
		rule := &p.rules[i]
		if !rule.matchPort(r.Proto, r.Dst.Port()) || mail && rule.PortLo == 0 {
			continue
		}
		if rule.Prefix.IsValid() {
			if !rule.Prefix.Contains(f.addr) {
				continue
			}
			if floor && !rule.opens(f) {
				if tooBroad == nil {
					tooBroad = rule
				}
				continue
			}
			return allow(rule.ID, dst+" by "+rule.ID+" "+quote(rule.Text), f.class, f.addr)
		}
		if floor {
			continue
		}
		i := slices.IndexFunc(names, rule.matchName)
		if i < 0 {
			continue
		}
		if r.SNI != "" && !rule.matchName(sniName) {
			if sniMiss == nil {
				sniMiss = rule
			}
			continue
		}
		return allow(rule.ID, dst+" ("+names[i]+") by "+rule.ID+" "+quote(rule.Text), f.class, f.addr)
	}
	if floor {
		reason := f.what()
		if tooBroad != nil {
			reason += "; " + tooBroad.ID + " " + quote(tooBroad.Text) + " is too broad to open it, name the address or a range inside its block"
		}
		return deny(f.id(), reason, f.class, f.addr)
	}
	if mail {
		return deny("mail:closed", "port "+strconv.Itoa(int(r.Dst.Port()))+" (mail submission or relay) is closed in network mode public, so that a sandbox cannot send spam; an allow rule naming the port opens it (\"smtp.example.com:587\")", f.class, f.addr)
	}
	if p.Mode() == ModePublic {
		return allow("mode:public", dst+" is public (network mode public)", f.class, f.addr)
	}
	if sniMiss != nil {
		return deny("sni:mismatch", "TLS SNI "+quote(r.SNI)+" does not match "+sniMiss.ID+" "+quote(sniMiss.Text)+", which allowed "+dst+" by its resolved name", f.class, f.addr)
	}
	what := dst
	if len(names) > 0 {
		what += " (" + strings.Join(names, ", ") + ")"
	}
	return deny("mode:deny", "no allow rule matches "+what, f.class, f.addr)
}

// MailPorts are the SMTP ports (relay 25, submission over TLS 465,
// submission 587) that mode public keeps closed unless a rule names them.
var MailPorts = [...]uint16{25, 465, 587}

// IsMailPort reports whether port is one of MailPorts.
func IsMailPort(port uint16) bool { return slices.Contains(MailPorts[:], port) }

// metadataNames are cloud metadata host names, denied as names in every
// mode (their addresses are on the floor as well).
var metadataNames = []string{
	"metadata",
	"metadata.google.internal",
	"metadata.goog",
	"instance-data",
	"instance-data.ec2.internal",
}

// NameAllowed decides whether the guest may resolve name at all: never under
// mode none; never for an invalid name, an IP literal or a cloud metadata
// name; under mode deny only when a domain rule (any port) matches it.
func NameAllowed(p Policy, name string) Decision {
	if p.Mode() == ModeNone {
		return deny("mode:none", "network mode none (query for "+quote(name)+")", ClassInvalid, netip.Addr{})
	}
	if a, ok := ParseHostLiteral(name); ok {
		return deny("name:literal", quote(name)+" is the IP literal "+a.String()+", not a name", ClassInvalid, netip.Addr{})
	}
	n, err := NormalizeName(name)
	if err != nil {
		return deny("name:invalid", quote(name)+" is not a valid name", ClassInvalid, netip.Addr{})
	}
	if slices.Contains(metadataNames, n) {
		return deny("name:metadata", n+" is a cloud metadata name", ClassMetadata, netip.Addr{})
	}
	for i := range p.rules {
		if rule := &p.rules[i]; rule.matchName(n) {
			return allow(rule.ID, n+" by "+rule.ID+" "+quote(rule.Text), ClassInvalid, netip.Addr{})
		}
	}
	if p.Mode() == ModePublic {
		return allow("mode:public", n+" (network mode public)", ClassInvalid, netip.Addr{})
	}
	return deny("mode:deny", "no allow rule matches the name "+n, ClassInvalid, netip.Addr{})
}

// DNSAnswerAllowed decides whether the DNS server may return ip as an answer
// for name (each A/AAAA record, CNAME chains included, is checked against the
// name the guest asked for). The name must pass NameAllowed; an address on
// the platform floor (DNS rebinding) is denied unless an IP rule, with any
// port scope, opens it. The server answers NXDOMAIN on a denial.
func DNSAnswerAllowed(p Policy, name string, ip netip.Addr) Decision {
	d := NameAllowed(p, name)
	f := p.floorInfo(ip, nil)
	d.Class, d.Addr = f.class, f.addr
	if !d.Allow {
		return d
	}
	if !f.floor() {
		return d
	}
	for i := range p.rules {
		if rule := &p.rules[i]; rule.Prefix.IsValid() && rule.opens(f) {
			return allow(rule.ID, quote(name)+" answer "+f.addr.String()+" by "+rule.ID+" "+quote(rule.Text), f.class, f.addr)
		}
	}
	return deny(f.id(), quote(name)+" resolved to "+f.what()+" (DNS rebinding)", f.class, f.addr)
}

// quote bounds and quotes guest-controlled text for an audit reason.
func quote(s string) string {
	const limit = 80
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return strconv.Quote(s)
}

// OpensFloor returns the first IP or CIDR rule that opens a floor address
// (a single floor address, or a range inside one special-purpose block;
// a broader range opens nothing), or nil. Control
// planes use it to keep tenants from widening the platform floor (threat
// 62): only operators may.
func (p Policy) OpensFloor() *Rule {
	for i := range p.rules {
		r := &p.rules[i]
		if !r.Prefix.IsValid() {
			continue
		}
		f := floorInfo{detail: classify(r.Prefix.Masked().Addr())}
		if f.class.Floor() && r.opens(f) {
			return r
		}
	}
	return nil
}
