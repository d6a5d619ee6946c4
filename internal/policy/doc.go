// Package policy is airlock's egress policy: it classifies destination
// addresses and decides, for one flow or one DNS answer, whether the sandbox
// may reach it. It is pure: every function works on netip values and strings
// passed in, does no I/O, reads no clock (time is an argument) and holds no
// global state, so the netstack, the DNS server and the tests share one
// implementation, and it is fuzzed.
//
// # Classification
//
// [Classify] first normalises an address ([Normalize]): zones are dropped,
// IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d) and NAT64
// (64:ff9b::/96, 64:ff9b:1::/96) forms become the IPv4 address they stand
// for. 6to4 (2002::/16) and Teredo (2001::/32) addresses stay IPv6 but are
// classified by the IPv4 addresses they embed as well (the 6to4 relay, the
// Teredo server and the XOR-inverted Teredo client), and the strictest class
// wins. IPv6 gets the same classes as IPv4; IPv6 outside 2000::/3 is reserved.
// Cloud metadata addresses are matched before link-local and CGNAT so the
// audit reason names them.
//
// # Policy
//
// [ParsePolicy] takes a mode and allow rules:
//
//   - "public" (the default when mode is empty and there are no rules):
//     every public address; rules only add exceptions to the floor.
//   - "deny" (the default when mode is empty and rules are given): only what
//     a rule allows.
//   - "none": nothing; rules are rejected as contradictory.
//
// Rule syntax, each optionally followed by ":port" or ":lo-hi" (IPv6 in
// brackets when a port follows, "[2001:db8::1]:443"):
//
//	example.com          that name only
//	*.example.com        every name below example.com, NOT example.com itself
//	203.0.113.7          one address (canonical form only; "0x7f.1" is an error)
//	203.0.113.0/24       a CIDR (host bits must be zero)
//
// Names are lower-cased, lose one trailing dot and are converted to ASCII with
// IDNA (golang.org/x/net/idna). A wildcard must be the whole leftmost label
// and may not sit directly on an ICANN public suffix ("*.com", "*.co.uk"
// are rejected: they would open other owners' names). Suffixes from the
// list's private section are one operator's namespace and are accepted
// ("*.githubusercontent.com", "*.github.io"): such a rule opens every name
// that operator serves, which is what the user asked for. Rule IDs
// are "allow[i]", i being the index in the slice given to ParsePolicy.
//
// # Mail ports
//
// In mode public, TCP to the mail ports ([MailPorts]: 25, 465, 587) of a
// public address is denied ("mail:closed"): a sandbox must not relay spam
// from the host's address. Only a rule whose port scope includes the port
// opens it ("smtp.example.com:587", "203.0.113.9:25", "0.0.0.0/0:25"); a rule
// for every port does not. Floor addresses a rule opens and mode deny (where
// every destination is already a rule's) are not affected.
//
// # The platform floor
//
// Every class but public, and the host's own addresses ([Policy.WithHostAddrs]
// or [Request.HostAddrs]), is denied in every mode. Only an IP or CIDR rule
// opens such an address, and only one that stays inside the special-purpose
// block the address belongs to ("10.0.0.0/8" or "10.1.2.3" opens 10.1.2.3;
// "0.0.0.0/0" does not); metadata addresses, host addresses and addresses
// whose class comes from an embedded IPv4 address need a single-address rule.
// Domain rules never open the floor, and neither does mode public.
//
// # Names
//
// A domain rule matches a flow only through the name the sandbox itself
// resolved for the destination IP ([PinSet]); when the TLS ClientHello
// carries SNI, the SNI must match the same rule (an IP-literal SNI must equal
// the destination). [DNSAnswerAllowed] turns answers that point into the
// floor into NXDOMAIN (rebinding); [NameAllowed] decides which names may be
// resolved at all. [ParseHostLiteral] recognises the non-canonical IPv4
// literals (decimal, hex, octal, short forms) that resolvers accept, so such
// strings are handled as addresses, never as names.
package policy
