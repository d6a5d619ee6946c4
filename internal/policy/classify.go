package policy

import "net/netip"

// Class is the kind of destination an address is. Every class but
// ClassPublic belongs to the platform floor.
type Class uint8

// Classes, from the strictest down. The zero value is ClassInvalid.
const (
	ClassInvalid     Class = iota // not a valid address
	ClassMetadata                 // cloud instance metadata endpoints
	ClassLoopback                 // 127.0.0.0/8, ::1
	ClassUnspecified              // 0.0.0.0/8 ("this network"), ::
	ClassLinkLocal                // 169.254.0.0/16, fe80::/10
	ClassPrivate                  // RFC 1918, fc00::/7 (ULA), fec0::/10
	ClassCGNAT                    // 100.64.0.0/10
	ClassBroadcast                // 255.255.255.255
	ClassMulticast                // 224.0.0.0/4, ff00::/8
	ClassReserved                 // documentation, benchmarking, future use, ...
	ClassPublic                   // everything else
)

var classNames = [...]string{
	ClassInvalid:     "invalid",
	ClassMetadata:    "metadata",
	ClassLoopback:    "loopback",
	ClassUnspecified: "unspecified",
	ClassLinkLocal:   "link-local",
	ClassPrivate:     "private",
	ClassCGNAT:       "cgnat",
	ClassBroadcast:   "broadcast",
	ClassMulticast:   "multicast",
	ClassReserved:    "reserved",
	ClassPublic:      "public",
}

var classPhrases = [...]string{
	ClassInvalid:     "not a valid address",
	ClassMetadata:    "a cloud metadata address",
	ClassLoopback:    "a loopback address",
	ClassUnspecified: `an unspecified ("this network") address`,
	ClassLinkLocal:   "a link-local address",
	ClassPrivate:     "a private address",
	ClassCGNAT:       "a carrier-grade NAT (shared) address",
	ClassBroadcast:   "the broadcast address",
	ClassMulticast:   "a multicast address",
	ClassReserved:    "a reserved special-purpose address",
	ClassPublic:      "a public address",
}

// String returns the class's short name ("link-local"), used in rule IDs
// such as "floor:link-local".
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "invalid"
}

// phrase describes the class for an audit reason ("a private address").
func (c Class) phrase() string {
	if int(c) < len(classPhrases) {
		return classPhrases[c]
	}
	return classPhrases[ClassInvalid]
}

// Floor reports whether the class is always denied unless an IP rule opens it.
func (c Class) Floor() bool { return c != ClassPublic }

type block struct {
	p netip.Prefix
	c Class
}

func mp(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Order matters: the first block that contains an address wins, so single
// metadata addresses come before the ranges that hold them.
var v4Blocks = []block{
	{mp("169.254.169.254/32"), ClassMetadata}, // AWS, GCP, Azure, OCI, ...
	{mp("169.254.170.2/32"), ClassMetadata},   // AWS ECS task metadata
	{mp("169.254.170.23/32"), ClassMetadata},  // AWS EKS pod identity
	{mp("100.100.100.200/32"), ClassMetadata}, // Alibaba Cloud
	{mp("168.63.129.16/32"), ClassMetadata},   // Azure WireServer
	{mp("192.0.0.192/32"), ClassMetadata},     // Oracle Cloud (legacy)
	{mp("255.255.255.255/32"), ClassBroadcast},
	{mp("0.0.0.0/8"), ClassUnspecified},
	{mp("127.0.0.0/8"), ClassLoopback},
	{mp("10.0.0.0/8"), ClassPrivate},
	{mp("172.16.0.0/12"), ClassPrivate},
	{mp("192.168.0.0/16"), ClassPrivate},
	{mp("100.64.0.0/10"), ClassCGNAT},
	{mp("169.254.0.0/16"), ClassLinkLocal},
	{mp("224.0.0.0/4"), ClassMulticast},
	{mp("192.0.0.0/24"), ClassReserved},    // IETF protocol assignments
	{mp("192.0.2.0/24"), ClassReserved},    // TEST-NET-1
	{mp("192.88.99.0/24"), ClassReserved},  // deprecated 6to4 relay anycast
	{mp("198.18.0.0/15"), ClassReserved},   // benchmarking
	{mp("198.51.100.0/24"), ClassReserved}, // TEST-NET-2
	{mp("203.0.113.0/24"), ClassReserved},  // TEST-NET-3
	{mp("240.0.0.0/4"), ClassReserved},     // future use
}

var v6Blocks = []block{
	{mp("fd00:ec2::254/128"), ClassMetadata}, // AWS IMDS
	{mp("fd00:ec2::23/128"), ClassMetadata},  // AWS EKS pod identity
	{mp("fd20:ce::254/128"), ClassMetadata},  // GCP metadata
	{mp("::/128"), ClassUnspecified},
	{mp("::1/128"), ClassLoopback},
	{mp("ff00::/8"), ClassMulticast},
	{mp("fe80::/10"), ClassLinkLocal},
	{mp("fec0::/10"), ClassPrivate}, // deprecated site-local
	{mp("fc00::/7"), ClassPrivate},  // ULA
	{mp("::/8"), ClassReserved},     // IPv4-compatible leftovers, reserved
	{mp("100::/64"), ClassReserved}, // discard-only
	{mp("64:ff9b:1::/48"), ClassReserved},
	{mp("2001::/23"), ClassReserved},     // IETF protocol assignments (Teredo handled first)
	{mp("2001:db8::/32"), ClassReserved}, // documentation
	{mp("3fff::/20"), ClassReserved},     // documentation (RFC 9637)
	{mp("5f00::/16"), ClassReserved},     // SRv6 SIDs
}

var (
	global6 = mp("2000::/3")
	sixTo4  = mp("2002::/16")
	teredo  = mp("2001::/32")
	nat64   = mp("64:ff9b::/96")
	nat64L  = mp("64:ff9b:1::/96")
)

// Normalize returns the address a flow to addr really reaches, as far as
// the address itself says: the zone is dropped and IPv4-mapped,
// IPv4-compatible and NAT64 (64:ff9b::/96, 64:ff9b:1::/96) addresses become
// IPv4. 6to4 and Teredo addresses stay IPv6 (Classify looks inside them).
// Normalize is idempotent; the invalid Addr stays invalid.
func Normalize(addr netip.Addr) netip.Addr {
	addr = addr.WithZone("")
	if !addr.Is6() {
		return addr
	}
	if addr.Is4In6() {
		return addr.Unmap()
	}
	b := addr.As16()
	if nat64.Contains(addr) || nat64L.Contains(addr) {
		return netip.AddrFrom4([4]byte(b[12:16]))
	}
	if isZero(b[:12]) && !isZero(b[12:15]) || isZero(b[:12]) && b[15] > 1 {
		// IPv4-compatible ::a.b.c.d (deprecated), but not :: or ::1.
		return netip.AddrFrom4([4]byte(b[12:16]))
	}
	return addr
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// Classify normalises addr (see Normalize) and returns its class and the
// normalised address. Policy decisions are taken on the normalised address.
func Classify(addr netip.Addr) (Class, netip.Addr) {
	d := classify(addr)
	return d.class, d.addr
}

// detail is Classify's full answer, for decisions and reasons.
type detail struct {
	class Class
	addr  netip.Addr   // normalised
	block netip.Prefix // special-purpose block that gave the class; invalid when none or via is set
	via   netip.Addr   // embedded IPv4 address that gave the class (6to4, Teredo)
}

func lookup(a netip.Addr) (Class, netip.Prefix) {
	blocks := v4Blocks
	if a.Is6() {
		blocks = v6Blocks
	}
	for _, b := range blocks {
		if b.p.Contains(a) {
			return b.c, b.p
		}
	}
	if a.Is6() && !global6.Contains(a) {
		return ClassReserved, netip.Prefix{}
	}
	return ClassPublic, netip.Prefix{}
}

func classify(addr netip.Addr) detail {
	n := Normalize(addr)
	if !n.IsValid() {
		return detail{class: ClassInvalid, addr: n}
	}
	var embedded []netip.Addr
	if n.Is6() {
		b := n.As16()
		switch {
		case sixTo4.Contains(n):
			embedded = append(embedded, netip.AddrFrom4([4]byte(b[2:6])))
		case teredo.Contains(n):
			client := [4]byte{^b[12], ^b[13], ^b[14], ^b[15]}
			embedded = append(embedded, netip.AddrFrom4([4]byte(b[4:8])), netip.AddrFrom4(client))
		}
	}
	d := detail{class: ClassPublic, addr: n}
	for _, e := range embedded {
		if c, _ := lookup(e); c < d.class {
			d.class, d.via = c, e
		}
	}
	if d.via.IsValid() {
		return d
	}
	if n.Is6() && teredo.Contains(n) {
		return d // Teredo with public server and client: public
	}
	d.class, d.block = lookup(n)
	return d
}
