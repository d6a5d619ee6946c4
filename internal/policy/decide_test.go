package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func mustPolicy(t *testing.T, mode string, allow ...string) Policy {
	t.Helper()
	p, err := ParsePolicy(mode, allow)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestDecide(t *testing.T) {
	t.Parallel()
	host := netip.MustParseAddr("198.51.100.10")
	public := mustPolicy(t, "public").WithHostAddrs(netip.MustParseAddr("203.0.114.5"), netip.MustParseAddr("2a01::5"))
	deny := mustPolicy(t, "deny",
		"example.com",               // 0
		"*.example.org",             // 1
		"api.example.net:443",       // 2
		"203.0.114.7",               // 3
		"10.1.0.0/16",               // 4
		"9.9.9.0/24:53",             // 5
		"[2001:4860::8888]:443",     // 6
		"169.254.169.254",           // 7
		"0.0.0.0/0:22",              // 8: public v4 only; too broad for the floor
		"192.168.0.0/15",            // 9: spills outside 192.168/16
		"cdn.example.com:8000-8100", // 10
	)
	none := mustPolicy(t, "none")
	openHost := mustPolicy(t, "public", "203.0.114.5", "127.0.0.0/8:8080").WithHostAddrs(netip.MustParseAddr("203.0.114.5"))
	tests := []struct {
		name string
		p    Policy
		r    Request
		ok   bool
		id   string
	}{
		// Mode public and the floor (39, 40, 41, 42, 45, 47, 62).
		{"public ok", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:443")}, true, "mode:public"},
		{"public v6", public, Request{Proto: "tcp", Dst: ap("[2606:4700::1111]:443")}, true, "mode:public"},
		{"public private", public, Request{Proto: "tcp", Dst: ap("10.0.0.1:80")}, false, "floor:private"},
		{"public loopback", public, Request{Proto: "tcp", Dst: ap("127.0.0.1:80")}, false, "floor:loopback"},
		{"public metadata", public, Request{Proto: "tcp", Dst: ap("169.254.169.254:80")}, false, "floor:metadata"},
		{"public metadata azure", public, Request{Proto: "tcp", Dst: ap("168.63.129.16:80")}, false, "floor:metadata"},
		{"public metadata alibaba", public, Request{Proto: "tcp", Dst: ap("100.100.100.200:80")}, false, "floor:metadata"},
		{"public metadata v6", public, Request{Proto: "tcp", Dst: ap("[fd00:ec2::254]:80")}, false, "floor:metadata"},
		{"public cgnat", public, Request{Proto: "tcp", Dst: ap("100.64.1.1:80")}, false, "floor:cgnat"},
		{"public zero", public, Request{Proto: "tcp", Dst: ap("0.0.0.0:80")}, false, "floor:unspecified"},
		{"public zero8", public, Request{Proto: "tcp", Dst: ap("0.1.2.3:80")}, false, "floor:unspecified"},
		{"public v6 zero", public, Request{Proto: "tcp", Dst: ap("[::]:80")}, false, "floor:unspecified"},
		{"public broadcast", public, Request{Proto: "udp", Dst: ap("255.255.255.255:67")}, false, "floor:broadcast"},
		{"public multicast", public, Request{Proto: "udp", Dst: ap("239.255.255.250:1900")}, false, "floor:multicast"},
		{"public reserved", public, Request{Proto: "tcp", Dst: ap("240.0.0.1:80")}, false, "floor:reserved"},
		{"public ula", public, Request{Proto: "tcp", Dst: ap("[fd00::1]:80")}, false, "floor:private"},
		{"public ll6", public, Request{Proto: "tcp", Dst: ap("[fe80::1%eth0]:80")}, false, "floor:link-local"},
		{"public lo6", public, Request{Proto: "tcp", Dst: ap("[::1]:80")}, false, "floor:loopback"},
		{"mapped loopback", public, Request{Proto: "tcp", Dst: ap("[::ffff:127.0.0.1]:80")}, false, "floor:loopback"},
		{"mapped private", public, Request{Proto: "tcp", Dst: ap("[::ffff:10.0.0.1]:80")}, false, "floor:private"},
		{"mapped metadata", public, Request{Proto: "tcp", Dst: ap("[::ffff:169.254.169.254]:80")}, false, "floor:metadata"},
		{"compat metadata", public, Request{Proto: "tcp", Dst: ap("[::169.254.169.254]:80")}, false, "floor:metadata"},
		{"nat64 loopback", public, Request{Proto: "tcp", Dst: ap("[64:ff9b::127.0.0.1]:80")}, false, "floor:loopback"},
		{"nat64 private", public, Request{Proto: "tcp", Dst: ap("[64:ff9b::10.0.0.1]:80")}, false, "floor:private"},
		{"nat64 metadata", public, Request{Proto: "tcp", Dst: ap("[64:ff9b::169.254.169.254]:80")}, false, "floor:metadata"},
		{"6to4 loopback", public, Request{Proto: "tcp", Dst: ap("[2002:7f00:1::]:80")}, false, "floor:loopback"},
		{"6to4 private", public, Request{Proto: "tcp", Dst: ap("[2002:a00:1::]:80")}, false, "floor:private"},
		{"6to4 metadata", public, Request{Proto: "tcp", Dst: ap("[2002:a9fe:a9fe::]:80")}, false, "floor:metadata"},
		{"teredo loopback", public, Request{Proto: "tcp", Dst: ap("[2001:0:808:808::80ff:fffe]:80")}, false, "floor:loopback"},
		{"teredo private", public, Request{Proto: "tcp", Dst: ap("[2001:0:808:808::f5ff:fffe]:80")}, false, "floor:private"},
		{"teredo metadata", public, Request{Proto: "tcp", Dst: ap("[2001:0:808:808::5601:5601]:80")}, false, "floor:metadata"},
		{"icmp public", public, Request{Proto: "icmp", Dst: ap("8.8.8.8:0")}, true, "mode:public"},
		{"icmp private", public, Request{Proto: "icmp", Dst: ap("10.0.0.1:0")}, false, "floor:private"},
		{"unknown proto", public, Request{Proto: "sctp", Dst: ap("8.8.8.8:80")}, false, "proto:unknown"},
		{"invalid dst", public, Request{Proto: "tcp"}, false, "floor:invalid"},
		// Host addresses (43).
		{"host addr policy", public, Request{Proto: "tcp", Dst: ap("203.0.114.5:22")}, false, "floor:host"},
		{"host addr v6", public, Request{Proto: "tcp", Dst: ap("[2a01::5]:22")}, false, "floor:host"},
		{"host addr mapped", public, Request{Proto: "tcp", Dst: ap("[::ffff:203.0.114.5]:22")}, false, "floor:host"},
		{"host addr request", public, Request{Proto: "tcp", Dst: ap("198.51.100.10:22"), HostAddrs: []netip.Addr{host}}, false, "floor:host"},
		{"host addr request public", public, Request{Proto: "tcp", Dst: ap("8.8.4.4:22"), HostAddrs: []netip.Addr{netip.MustParseAddr("8.8.4.4")}}, false, "floor:host"},
		{"host addr opened by IP rule", openHost, Request{Proto: "tcp", Dst: ap("203.0.114.5:22")}, true, "allow[0]"},
		{"loopback opened with port", openHost, Request{Proto: "tcp", Dst: ap("127.0.0.1:8080")}, true, "allow[1]"},
		{"loopback other port", openHost, Request{Proto: "tcp", Dst: ap("127.0.0.1:8081")}, false, "floor:loopback"},
		// Mode none (61).
		{"none public", none, Request{Proto: "tcp", Dst: ap("8.8.8.8:443")}, false, "mode:none"},
		{"none icmp", none, Request{Proto: "icmp", Dst: ap("8.8.8.8:0")}, false, "mode:none"},
		// Mode deny: domain rules need a pinned name (50).
		{"domain pinned", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.com"}, true, "allow[0]"},
		{"domain pinned case", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "EXAMPLE.com."}, true, "allow[0]"},
		{"domain raw ip", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443")}, false, "mode:deny"},
		{"domain raw ip sni", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), SNI: "example.com"}, false, "mode:deny"},
		{"domain other name", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "evil.com"}, false, "mode:deny"},
		{"domain suffix trick", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "notexample.com"}, false, "mode:deny"},
		{"domain sub of exact", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "www.example.com"}, false, "mode:deny"},
		{"domain names list", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Names: []string{"evil.com", "example.com"}}, true, "allow[0]"},
		// Wildcards (54).
		{"wildcard sub", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "a.example.org"}, true, "allow[1]"},
		{"wildcard deep", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "a.b.example.org"}, true, "allow[1]"},
		{"wildcard apex", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.org"}, false, "mode:deny"},
		{"wildcard suffix trick", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "aexample.org"}, false, "mode:deny"},
		// SNI (51, 53).
		{"sni match", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.com", SNI: "example.com"}, true, "allow[0]"},
		{"sni mismatch", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.com", SNI: "evil.com"}, false, "sni:mismatch"},
		{"sni other rule", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.com", SNI: "a.example.org"}, false, "sni:mismatch"},
		{"sni wildcard", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "a.example.org", SNI: "b.example.org"}, true, "allow[1]"},
		{"sni ip literal equal", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:443"), SNI: "8.8.8.8"}, true, "mode:public"},
		{"sni ip literal hex", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:443"), SNI: "0x08080808"}, true, "mode:public"},
		{"sni ip literal other", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:443"), SNI: "0xa9fea9fe"}, false, "sni:mismatch"},
		{"sni ip literal on domain rule", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.com", SNI: "93.184.216.34"}, false, "sni:mismatch"},
		{"sni invalid", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:443"), Name: "example.com", SNI: "a..b"}, false, "sni:invalid"},
		// Domain rules never open the floor (48, 62).
		{"domain private", deny, Request{Proto: "tcp", Dst: ap("10.2.0.1:443"), Name: "example.com"}, false, "floor:private"},
		{"domain metadata", deny, Request{Proto: "tcp", Dst: ap("169.254.169.254:80"), Name: "example.com"}, true, "allow[7]"},
		{"domain loopback", deny, Request{Proto: "tcp", Dst: ap("127.0.0.1:443"), Name: "example.com"}, false, "floor:loopback"},
		// Ports (60).
		{"port ok", deny, Request{Proto: "tcp", Dst: ap("1.2.3.4:443"), Name: "api.example.net"}, true, "allow[2]"},
		{"port wrong", deny, Request{Proto: "tcp", Dst: ap("1.2.3.4:80"), Name: "api.example.net"}, false, "mode:deny"},
		{"port udp", deny, Request{Proto: "udp", Dst: ap("9.9.9.9:53")}, true, "allow[5]"},
		{"port udp other", deny, Request{Proto: "udp", Dst: ap("9.9.9.9:54")}, false, "mode:deny"},
		{"port range in", deny, Request{Proto: "tcp", Dst: ap("[2a00::1]:8050"), Name: "cdn.example.com"}, true, "allow[10]"},
		{"port range out", deny, Request{Proto: "tcp", Dst: ap("[2a00::1]:8101"), Name: "cdn.example.com"}, false, "mode:deny"},
		{"port icmp on scoped", deny, Request{Proto: "icmp", Dst: ap("[2001:4860::8888]:0")}, false, "mode:deny"},
		{"v6 ip port", deny, Request{Proto: "tcp", Dst: ap("[2001:4860::8888]:443")}, true, "allow[6]"},
		{"v6 ip port wrong", deny, Request{Proto: "tcp", Dst: ap("[2001:4860::8888]:80")}, false, "mode:deny"},
		// Explicit IP/CIDR rules and the floor (62).
		{"cidr private", deny, Request{Proto: "tcp", Dst: ap("10.1.2.3:5432")}, true, "allow[4]"},
		{"cidr private mapped", deny, Request{Proto: "tcp", Dst: ap("[::ffff:10.1.2.3]:5432")}, true, "allow[4]"},
		{"cidr private nat64", deny, Request{Proto: "tcp", Dst: ap("[64:ff9b::10.1.2.3]:5432")}, true, "allow[4]"},
		{"cidr private outside", deny, Request{Proto: "tcp", Dst: ap("10.2.0.1:5432")}, false, "floor:private"},
		{"cidr private 6to4", deny, Request{Proto: "tcp", Dst: ap("[2002:a01:203::]:5432")}, false, "floor:private"},
		{"ip rule public", deny, Request{Proto: "tcp", Dst: ap("203.0.114.7:22")}, true, "allow[3]"},
		{"slash0 is public only", deny, Request{Proto: "tcp", Dst: ap("8.8.8.8:22")}, true, "allow[8]"},
		{"slash0 not loopback", deny, Request{Proto: "tcp", Dst: ap("127.0.0.1:22")}, false, "floor:loopback"},
		{"slash0 not cgnat", deny, Request{Proto: "tcp", Dst: ap("100.64.0.1:22")}, false, "floor:cgnat"},
		{"spilling cidr", deny, Request{Proto: "tcp", Dst: ap("192.168.1.1:22")}, false, "floor:private"},
		{"metadata single ip", deny, Request{Proto: "tcp", Dst: ap("[::ffff:169.254.169.254]:80")}, true, "allow[7]"},
	}
	for _, tt := range tests {
		d := Decide(tt.p, tt.r)
		if d.Allow != tt.ok || d.RuleID != tt.id {
			t.Errorf("%s: Decide = %v %s (%s); want %v %s", tt.name, d.Allow, d.RuleID, d.Reason, tt.ok, tt.id)
		}
		if strings.ContainsAny(d.Reason, "\n\r") || !strings.HasPrefix(d.Reason, map[bool]string{true: "allowed: ", false: "denied: "}[d.Allow]) {
			t.Errorf("%s: bad reason %q", tt.name, d.Reason)
		}
	}
}

func TestDecideReasons(t *testing.T) {
	t.Parallel()
	p := mustPolicy(t, "deny", "0.0.0.0/0")
	for _, tt := range []struct {
		dst, want string
	}{
		{"169.254.169.254:80", "denied: 169.254.169.254 is a cloud metadata address"},
		{"[2002:a9fe:a9fe::]:80", "denied: 2002:a9fe:a9fe:: embeds 169.254.169.254, a cloud metadata address"},
		{"10.0.0.1:80", `denied: 10.0.0.1 is a private address; allow[0] "0.0.0.0/0" is too broad`},
	} {
		d := Decide(p, Request{Proto: "tcp", Dst: ap(tt.dst)})
		if !strings.HasPrefix(d.Reason, tt.want) {
			t.Errorf("%s: reason %q, want prefix %q", tt.dst, d.Reason, tt.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	good := []struct {
		mode  string
		allow []string
		want  Mode
	}{
		{"", nil, ModePublic},
		{"", []string{"example.com"}, ModeDeny},
		{"public", []string{"10.0.0.0/8"}, ModePublic},
		{"deny", nil, ModeDeny},
		{"none", nil, ModeNone},
	}
	for _, tt := range good {
		p, err := ParsePolicy(tt.mode, tt.allow)
		if err != nil || p.Mode() != tt.want {
			t.Errorf("ParsePolicy(%q, %q) = %v, %v; want %v", tt.mode, tt.allow, p.Mode(), err, tt.want)
		}
	}
	rules := map[string]Rule{
		"Example.COM.":          {Domain: "example.com"},
		"*.example.com":         {Domain: "example.com", Wildcard: true},
		"*.bücher.de:443":       {Domain: "xn--bcher-kva.de", Wildcard: true, PortLo: 443, PortHi: 443},
		"example.com:8000-8100": {Domain: "example.com", PortLo: 8000, PortHi: 8100},
		"203.0.113.7":           {Prefix: netip.MustParsePrefix("203.0.113.7/32")},
		"203.0.113.7:22":        {Prefix: netip.MustParsePrefix("203.0.113.7/32"), PortLo: 22, PortHi: 22},
		"203.0.113.0/24:1-1024": {Prefix: netip.MustParsePrefix("203.0.113.0/24"), PortLo: 1, PortHi: 1024},
		"2001:db8::1":           {Prefix: netip.MustParsePrefix("2001:db8::1/128")},
		"2001:db8::/32":         {Prefix: netip.MustParsePrefix("2001:db8::/32")},
		"[2001:db8::1]:443":     {Prefix: netip.MustParsePrefix("2001:db8::1/128"), PortLo: 443, PortHi: 443},
		"[2001:db8::/32]":       {Prefix: netip.MustParsePrefix("2001:db8::/32")},
		"::ffff:10.0.0.1":       {Prefix: netip.MustParsePrefix("10.0.0.1/32")},
		"::ffff:10.0.0.0/104":   {Prefix: netip.MustParsePrefix("10.0.0.0/8")},
		"64:ff9b::10.0.0.0/120": {Prefix: netip.MustParsePrefix("10.0.0.0/24")},
		"co.uk":                 {Domain: "co.uk"},
		"*.example.co.uk":       {Domain: "example.co.uk", Wildcard: true},
	}
	for in, want := range rules {
		got, err := ParseRule(in)
		want.Text = in
		if err != nil || got != want {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, ok := range []string{"*.githubusercontent.com", "*.github.io"} {
		if _, err := ParsePolicy("deny", []string{ok}); err != nil {
			t.Errorf("%s (private-section suffix) rejected: %v", ok, err)
		}
	}
	bad := []struct{ mode, rule, msg string }{
		{"bogus", "", "network mode"},
		{"none", "example.com", "takes no allow rules"},
		{"deny", "", "empty rule"},
		{"deny", "*", "'*' alone"},
		{"deny", "*.", "empty"},
		{"deny", "*.com", "public suffix"},
		{"deny", "*.co.uk", "public suffix"},
		{"deny", "a.*.example.com", "leftmost label"},
		{"deny", "*foo.example.com", "leftmost label"},
		{"deny", "**.example.com", "leftmost label"},
		{"deny", "foo*.example.com", "leftmost label"},
		{"deny", "a..example.com", "empty label"},
		{"deny", ".example.com", "empty label"},
		{"deny", "example.com:0", "bad port"},
		{"deny", "example.com:65536", "bad port"},
		{"deny", "example.com:", "empty port"},
		{"deny", "example.com:x", "bad port"},
		{"deny", "example.com:90-80", "backwards"},
		{"deny", "0x7f.1", "non-canonical IP literal; write 127.0.0.1"},
		{"deny", "2852039166", "non-canonical"},
		{"deny", "0251.0376.0251.0376", "non-canonical"},
		{"deny", "10.0.0.1/8", "host bits"},
		{"deny", "10.0.0.0/33", "bad CIDR"},
		{"deny", "fe80::1%eth0", "zones"},
		{"deny", "[2001:db8::1", "missing ']'"},
		{"deny", "[2001:db8::1]x", "after ']'"},
		{"deny", "[example.com]:443", "IPv6 addresses only"},
		{"deny", "2001:db8::zz", "bad IPv6"},
		{"deny", "exa mple.com", "character"},
		{"deny", "foo.123", "ends in a number"},
	}
	for _, tt := range bad {
		var allow []string
		if tt.rule != "" || tt.msg == "empty rule" {
			allow = []string{"example.net", tt.rule}
		}
		_, err := ParsePolicy(tt.mode, allow)
		if err == nil || !strings.Contains(err.Error(), tt.msg) || !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParsePolicy(%q, %q) = %v; want error containing %q", tt.mode, allow, err, tt.msg)
			continue
		}
		if allow != nil && tt.mode != "none" && !strings.Contains(err.Error(), "allow[1]") {
			t.Errorf("error %q does not name allow[1]", err)
		}
	}
	p := mustPolicy(t, "deny", "a.com", "b.com")
	if r := p.Rules(); len(r) != 2 || r[0].ID != "allow[0]" || r[1].ID != "allow[1]" {
		t.Errorf("rule IDs: %+v", r)
	}
}

func TestNameAndDNSAnswer(t *testing.T) {
	t.Parallel()
	public := mustPolicy(t, "public")
	deny := mustPolicy(t, "deny", "example.com", "*.example.org", "10.5.0.0/16", "api.example.net:443")
	none := mustPolicy(t, "none")
	names := []struct {
		p    Policy
		name string
		ok   bool
		id   string
	}{
		{public, "anything.com", true, "mode:public"},
		{public, "metadata.google.internal", false, "name:metadata"},
		{public, "METADATA.google.internal.", false, "name:metadata"},
		{public, "0x7f.1", false, "name:literal"},
		{public, "2852039166", false, "name:literal"},
		{public, "a..b", false, "name:invalid"},
		{none, "example.com", false, "mode:none"},
		{deny, "example.com", true, "allow[0]"},
		{deny, "www.example.com", false, "mode:deny"},
		{deny, "a.example.org", true, "allow[1]"},
		{deny, "example.org", false, "mode:deny"},
		{deny, "api.example.net", true, "allow[3]"},
		{deny, "evil.com", false, "mode:deny"},
	}
	for _, tt := range names {
		if d := NameAllowed(tt.p, tt.name); d.Allow != tt.ok || d.RuleID != tt.id {
			t.Errorf("NameAllowed(%s, %q) = %v %s (%s); want %v %s", tt.p.Mode(), tt.name, d.Allow, d.RuleID, d.Reason, tt.ok, tt.id)
		}
	}
	answers := []struct {
		p    Policy
		name string
		ip   string
		ok   bool
		id   string
	}{
		{public, "example.com", "93.184.216.34", true, "mode:public"},
		{public, "rebind.evil.com", "127.0.0.1", false, "floor:loopback"},
		{public, "rebind.evil.com", "10.0.0.1", false, "floor:private"},
		{public, "rebind.evil.com", "::ffff:169.254.169.254", false, "floor:metadata"},
		{public, "rebind.evil.com", "0.0.0.0", false, "floor:unspecified"},
		{public, "rebind.evil.com", "fd00::1", false, "floor:private"},
		{public, "rebind.evil.com", "64:ff9b::a00:1", false, "floor:private"},
		{deny, "example.com", "93.184.216.34", true, "allow[0]"},
		{deny, "example.com", "10.5.1.1", true, "allow[2]"},
		{deny, "example.com", "10.6.1.1", false, "floor:private"},
		{deny, "evil.com", "93.184.216.34", false, "mode:deny"},
		{none, "example.com", "93.184.216.34", false, "mode:none"},
	}
	for _, tt := range answers {
		d := DNSAnswerAllowed(tt.p, tt.name, netip.MustParseAddr(tt.ip))
		if d.Allow != tt.ok || d.RuleID != tt.id {
			t.Errorf("DNSAnswerAllowed(%s, %q, %s) = %v %s (%s); want %v %s", tt.p.Mode(), tt.name, tt.ip, d.Allow, d.RuleID, d.Reason, tt.ok, tt.id)
		}
	}
	if d := DNSAnswerAllowed(public, "x.evil.com", netip.MustParseAddr("10.0.0.1")); !strings.Contains(d.Reason, "DNS rebinding") {
		t.Errorf("rebinding reason %q", d.Reason)
	}
}

func TestThreat062FloorCannotBeWidened(t *testing.T) {
	for rule, want := range map[string]bool{
		"10.0.0.0/8": true, "10.1.2.3": true, "169.254.169.254": true, "127.0.0.1:8080": true, "[::1]": true,
		"[fd00::/8]": true, "100.64.0.0/10": true, "[::ffff:10.0.0.1]": true,
		"8.8.8.8": false, "0.0.0.0/0": false, "203.0.113.0/24": true, "169.254.0.0/16": true, "203.0.114.0/24": false, "example.com": false, "*.example.com": false, "8.0.0.0/6": false,
	} {
		p, err := ParsePolicy("deny", []string{rule})
		if err != nil {
			t.Fatalf("%s: %v", rule, err)
		}
		if got := p.OpensFloor() != nil; got != want {
			t.Errorf("OpensFloor(%s) = %v, want %v", rule, got, want)
		}
	}
}

// Outbound abuse: mode public keeps the mail ports closed unless a rule
// names the port.
func TestDecideMailPorts(t *testing.T) {
	t.Parallel()
	public := mustPolicy(t, "public")
	named := mustPolicy(t, "public", "smtp.example.com:587", "203.0.113.9:25", "0.0.0.0/0:465", "example.net", "10.0.0.5")
	deny := mustPolicy(t, "deny", "example.com")
	tests := []struct {
		name string
		p    Policy
		r    Request
		ok   bool
		id   string
	}{
		{"25 closed", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:25")}, false, "mail:closed"},
		{"465 closed", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:465")}, false, "mail:closed"},
		{"587 closed", public, Request{Proto: "tcp", Dst: ap("[2606:4700::1111]:587")}, false, "mail:closed"},
		{"2525 open", public, Request{Proto: "tcp", Dst: ap("8.8.8.8:2525")}, true, "mode:public"},
		{"udp 25 open", public, Request{Proto: "udp", Dst: ap("8.8.8.8:25")}, true, "mode:public"},
		{"name and port", named, Request{Proto: "tcp", Dst: ap("93.184.216.34:587"), Name: "smtp.example.com"}, true, "allow[0]"},
		{"name, other mail port", named, Request{Proto: "tcp", Dst: ap("93.184.216.34:25"), Name: "smtp.example.com"}, false, "mail:closed"},
		{"address and port", named, Request{Proto: "tcp", Dst: ap("203.0.113.9:25")}, true, "allow[1]"},
		{"cidr and port", named, Request{Proto: "tcp", Dst: ap("8.8.4.4:465")}, true, "allow[2]"},
		{"rule for every port", named, Request{Proto: "tcp", Dst: ap("93.184.216.35:25"), Name: "example.net"}, false, "mail:closed"},
		{"floor opened, every port", named, Request{Proto: "tcp", Dst: ap("10.0.0.5:25")}, true, "allow[4]"},
		{"floor still closed", public, Request{Proto: "tcp", Dst: ap("10.0.0.5:25")}, false, "floor:private"},
		{"deny mode rule", deny, Request{Proto: "tcp", Dst: ap("93.184.216.34:25"), Name: "example.com"}, true, "allow[0]"},
	}
	for _, tc := range tests {
		d := Decide(tc.p, tc.r)
		if d.Allow != tc.ok || d.RuleID != tc.id {
			t.Errorf("%s: got allow=%v %s (%s), want allow=%v %s", tc.name, d.Allow, d.RuleID, d.Reason, tc.ok, tc.id)
		}
		if d.RuleID == "mail:closed" && !strings.Contains(d.Reason, "an allow rule naming the port opens it") {
			t.Errorf("%s: reason %q does not say how to open it", tc.name, d.Reason)
		}
	}
}
