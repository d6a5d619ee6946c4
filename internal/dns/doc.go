// Package dns is the DNS server the per-sandbox shim runs for its guest. The
// netstack hands it every query the guest sends to port 53 of any address
// (interception); it answers from policy, or forwards the one question to the
// host's resolvers, filters the answer and pins the addresses it returns.
//
// # What it answers
//
// Only standard queries (opcode QUERY, QR clear) with exactly one question
// of class IN are served; other messages get FORMERR, NOTIMP or REFUSED, and
// responses sent by the guest are dropped (threat 58). ANY, AXFR, IXFR and
// query types outside a short list (A, AAAA, CNAME, TXT, MX, SRV, NS, PTR,
// SOA, CAA, NAPTR) are REFUSED; HTTPS and SVCB get an empty answer without
// an upstream query, because their address hints would bypass the rebinding
// check and clients fall back to A/AAAA.
//
// Names are checked before anything is sent upstream: an IP literal in any
// form [policy.ParseHostLiteral] accepts ("2852039166", "0x7f.1"), an invalid
// name, a cloud metadata name, a name [policy.NameAllowed] denies (mode deny
// without a matching rule, mode none) and a reverse (in-addr.arpa, ip6.arpa)
// name that is not one full public address all get NXDOMAIN and are never
// forwarded.
//
// # Upstream
//
// One question becomes one upstream query (recursion is the upstream's job;
// the next configured upstream is tried only when one fails, and a truncated
// UDP answer is retried over TCP). Each query has a fresh random ID and a
// fresh socket; a reply whose ID, opcode or question does not match is
// dropped and the server keeps waiting until the deadline (a forged answer
// on the path cannot win by arriving first). Upstream rcodes other than
// NOERROR and NXDOMAIN become SERVFAIL.
//
// # Filtering and pinning
//
// The answer section is reduced to the CNAME chain starting at the question
// name (at most 8 links) and the records of the asked type owned by a name
// on that chain; the authority section keeps only SOA records and the
// additional section is dropped (no glue). Every A and AAAA record in the
// upstream answer section, kept or not, is checked with
// [policy.DNSAnswerAllowed] against the question name, and every CNAME target
// must not be an IP literal, an invalid or a metadata name; one failure makes
// the whole response NXDOMAIN (DNS rebinding, mixed and CNAME answers,
// threats 48 and 49). The addresses of an allowed A/AAAA answer are added to
// the [policy.PinSet] under the question name and under each chain name that
// [policy.NameAllowed] allows, with the smallest TTL of the chain, so that
// the netstack can later match domain rules by destination IP (threat 50).
// TTLs given to the guest are capped ([Config.MaxTTL], 300 s by default).
//
// # Limits
//
// A token bucket ([Config.QueryRate] per second, time from [Config.Clock])
// answers REFUSED when empty, and at most [Config.MaxInflight] upstream
// queries run at once (SERVFAIL beyond); nothing queues. UDP responses are
// truncated (TC) to the guest's EDNS0 size, clamped to [512, 1232] bytes.
// Every decision is reported to [Config.Audit] as an [Event].
//
// # Adapters
//
// [Resolver.Handle] is the core on parsed messages; [Resolver.ServeDNS]
// works on one raw UDP payload; [Resolver.ServePacket] and
// [Resolver.ServeStream] serve a datagram socket and a stream connection
// (RFC 1035 two-byte length framing) with bounded work.
package dns
