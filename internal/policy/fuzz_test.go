package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func addrFromBytes(b []byte) netip.Addr {
	switch {
	case len(b) >= 16:
		return netip.AddrFrom16([16]byte(b[:16]))
	case len(b) >= 4:
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.Addr{}
}

func FuzzClassify(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::", "2001:0:808:808::80ff:fffe", "::1", "8.8.8.8", "fd00:ec2::254", "64:ff9b:1::a00:1"} {
		a := netip.MustParseAddr(s)
		f.Add(a.AsSlice())
	}
	public := mustPolicyF(f, "public")
	f.Fuzz(func(t *testing.T, b []byte) {
		a := addrFromBytes(b)
		c, n := Classify(a)
		if Normalize(n) != n {
			t.Fatalf("Normalize not idempotent: %s -> %s -> %s", a, n, Normalize(n))
		}
		if c2, n2 := Classify(n); c2 != c || n2 != n {
			t.Fatalf("Classify(%s) = %v %s but Classify(%s) = %v %s", a, c, n, n, c2, n2)
		}
		if a.Is4() {
			if c6, _ := Classify(netip.AddrFrom16(a.As16())); c6 != c {
				t.Fatalf("mapped %s is %v, IPv4 is %v", a, c6, c)
			}
			nat := netip.MustParseAddr("64:ff9b::").As16()
			copy(nat[12:], a.AsSlice())
			if c6, _ := Classify(netip.AddrFrom16(nat)); c6 != c {
				t.Fatalf("NAT64 of %s is %v, IPv4 is %v", a, c6, c)
			}
			sixto4 := [16]byte{0x20, 0x02}
			copy(sixto4[2:], a.AsSlice())
			if c6, _ := Classify(netip.AddrFrom16(sixto4)); c != ClassPublic && c6 != c {
				t.Fatalf("6to4 of %s is %v, IPv4 is %v", a, c6, c)
			}
		}
		d := Decide(public, Request{Proto: "tcp", Dst: netip.AddrPortFrom(a, 443)})
		if d.Allow != (c == ClassPublic) || d.Class != c {
			t.Fatalf("mode public: %s (%v): %+v", a, c, d)
		}
	})
}

func mustPolicyF(f *testing.F, mode string, allow ...string) Policy {
	p, err := ParsePolicy(mode, allow)
	if err != nil {
		f.Fatal(err)
	}
	return p
}

func FuzzParseHostLiteral(f *testing.F) {
	for _, s := range []string{"2852039166", "0xA9FEA9FE", "0251.0376.0251.0376", "127.1", "10.1.1", "0x7f.1.", "[::1]", "fe80::1%eth0", "example.com", "1.2.3.4.5", "0x", "08.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := ParseHostLiteral(s)
		if !ok {
			return
		}
		if !a.IsValid() || a.Zone() != "" {
			t.Fatalf("ParseHostLiteral(%q) = %v", s, a)
		}
		if n, err := NormalizeName(s); err == nil {
			t.Fatalf("%q is both the literal %s and the name %q", s, a, n)
		}
		if c, err := netip.ParseAddr(s); err == nil && c.WithZone("") != a {
			t.Fatalf("ParseHostLiteral(%q) = %s, canonical parse %s", s, a, c)
		}
		if b, ok := ParseHostLiteral(a.String()); !ok || b != a {
			t.Fatalf("round trip %q -> %s -> %s %v", s, a, b, ok)
		}
	})
}

// FuzzParsePolicy parses arbitrary rules, then checks the floor invariant on
// an arbitrary request: a floor address is allowed only by an IP rule that
// covers it.
func FuzzParsePolicy(f *testing.F) {
	f.Add("deny", "example.com\n*.example.org:443\n10.0.0.0/8", []byte{10, 1, 2, 3}, uint16(443), uint8(0), "example.com", "example.com")
	f.Add("public", "0.0.0.0/0\n::/0\n169.254.169.254", []byte{169, 254, 169, 254}, uint16(80), uint8(1), "", "")
	f.Add("", "[2001:db8::/32]:1-100\n*.bücher.de", netip.MustParseAddr("2002:a00:1::").AsSlice(), uint16(5), uint8(2), "x.bücher.de", "0x7f.1")
	f.Add("none", "", []byte{8, 8, 8, 8}, uint16(53), uint8(1), "a", "b")
	f.Fuzz(func(t *testing.T, mode, rules string, ab []byte, port uint16, proto uint8, name, sni string) {
		var allow []string
		if rules != "" {
			allow = strings.Split(rules, "\n")
		}
		p, err := ParsePolicy(mode, allow)
		if err != nil {
			if p.mode != "" || p.rules != nil {
				t.Fatalf("error with a non-zero policy: %v", err)
			}
			return
		}
		for _, r := range p.Rules() {
			r2, err := ParseRule(r.Text)
			r2.ID = r.ID
			if err != nil || r2 != r {
				t.Fatalf("reparse %q: %+v %v, want %+v", r.Text, r2, err, r)
			}
			if (r.Domain == "") == !r.Prefix.IsValid() {
				t.Fatalf("rule %q is neither or both: %+v", r.Text, r)
			}
		}
		a := addrFromBytes(ab)
		req := Request{Proto: [...]string{"tcp", "udp", "icmp", "sctp"}[proto%4], Dst: netip.AddrPortFrom(a, port), Name: name, SNI: sni}
		check := func(what string, d Decision) {
			if !d.Allow {
				return
			}
			c, n := Classify(a)
			if d.Class != c || d.Addr != n {
				t.Fatalf("%s: decision class %v %s, Classify %v %s", what, d.Class, d.Addr, c, n)
			}
			if !c.Floor() {
				return
			}
			for _, r := range p.rules {
				if r.ID == d.RuleID && r.Prefix.IsValid() && r.Prefix.Contains(n) {
					return
				}
			}
			t.Fatalf("%s: floor address %s (%v) allowed by %q: %s", what, a, c, d.RuleID, d.Reason)
		}
		d := Decide(p, req)
		check("Decide", d)
		if p.Mode() == ModeNone && d.Allow {
			t.Fatalf("mode none allowed: %+v", d)
		}
		// Mode public opens a mail port only by a rule that names a port.
		if d.Allow && p.Mode() == ModePublic && req.Proto == "tcp" && IsMailPort(port) {
			i := slices.IndexFunc(p.rules, func(r Rule) bool { return r.ID == d.RuleID })
			if i < 0 || p.rules[i].PortLo == 0 && !d.Class.Floor() {
				t.Fatalf("mail port %d to %s allowed by %s without a rule naming the port", port, a, d.RuleID)
			}
		}
		check("DNSAnswerAllowed", DNSAnswerAllowed(p, name, a))
		// A host address is only ever allowed by a single-address rule.
		hd := Decide(p.WithHostAddrs(a), req)
		if hd.Allow && hd.Addr.IsValid() {
			for _, r := range p.rules {
				if r.ID == hd.RuleID && !(r.Prefix.IsSingleIP() && r.Prefix.Addr() == hd.Addr) {
					t.Fatalf("host address %s allowed by %q", a, r.Text)
				}
			}
			if !strings.HasPrefix(hd.RuleID, "allow[") {
				t.Fatalf("host address %s allowed by %s", a, hd.RuleID)
			}
		}
	})
}
