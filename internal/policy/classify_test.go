package policy

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want Class
		norm string // "" means same as in
	}{
		// IPv4 matrix (THREATS 39, 45, 47).
		{"8.8.8.8", ClassPublic, ""},
		{"1.1.1.1", ClassPublic, ""},
		{"10.0.0.1", ClassPrivate, ""},
		{"172.16.0.1", ClassPrivate, ""},
		{"172.31.255.255", ClassPrivate, ""},
		{"172.32.0.1", ClassPublic, ""},
		{"192.168.1.1", ClassPrivate, ""},
		{"100.64.0.1", ClassCGNAT, ""},
		{"100.127.255.255", ClassCGNAT, ""},
		{"100.128.0.1", ClassPublic, ""},
		{"127.0.0.1", ClassLoopback, ""},
		{"127.255.255.254", ClassLoopback, ""},
		{"169.254.1.1", ClassLinkLocal, ""},
		{"169.254.169.254", ClassMetadata, ""},
		{"169.254.170.2", ClassMetadata, ""},
		{"100.100.100.200", ClassMetadata, ""},
		{"168.63.129.16", ClassMetadata, ""},
		{"192.0.0.192", ClassMetadata, ""},
		{"224.0.0.1", ClassMulticast, ""},
		{"239.255.255.250", ClassMulticast, ""},
		{"255.255.255.255", ClassBroadcast, ""},
		{"0.0.0.0", ClassUnspecified, ""},
		{"0.1.2.3", ClassUnspecified, ""},
		{"0.255.255.255", ClassUnspecified, ""},
		{"192.0.0.8", ClassReserved, ""},
		{"192.0.2.1", ClassReserved, ""},
		{"192.88.99.1", ClassReserved, ""},
		{"198.18.0.1", ClassReserved, ""},
		{"198.19.255.255", ClassReserved, ""},
		{"198.51.100.1", ClassReserved, ""},
		{"203.0.113.7", ClassReserved, ""},
		{"240.0.0.1", ClassReserved, ""},
		{"255.255.255.254", ClassReserved, ""},
		// IPv6 parity (42).
		{"2606:4700::1111", ClassPublic, ""},
		{"::1", ClassLoopback, ""},
		{"::", ClassUnspecified, ""},
		{"fe80::1", ClassLinkLocal, ""},
		{"fe80::1%eth0", ClassLinkLocal, "fe80::1"},
		{"fc00::1", ClassPrivate, ""},
		{"fd12:3456::1", ClassPrivate, ""},
		{"fec0::1", ClassPrivate, ""},
		{"fd00:ec2::254", ClassMetadata, ""},
		{"fd20:ce::254", ClassMetadata, ""},
		{"ff02::1", ClassMulticast, ""},
		{"2001:db8::1", ClassReserved, ""},
		{"3fff::1", ClassReserved, ""},
		{"100::1", ClassReserved, ""},
		{"2001:2::1", ClassReserved, ""},
		{"5f00::1", ClassReserved, ""},
		{"4000::1", ClassReserved, ""}, // outside 2000::/3
		{"::2:3:4:5", ClassReserved, ""},
		// IPv4-mapped and -compatible (40).
		{"::ffff:127.0.0.1", ClassLoopback, "127.0.0.1"},
		{"::ffff:10.0.0.1", ClassPrivate, "10.0.0.1"},
		{"::ffff:169.254.169.254", ClassMetadata, "169.254.169.254"},
		{"::ffff:8.8.8.8", ClassPublic, "8.8.8.8"},
		{"::127.0.0.1", ClassLoopback, "127.0.0.1"},
		{"::10.0.0.1", ClassPrivate, "10.0.0.1"},
		{"::169.254.169.254", ClassMetadata, "169.254.169.254"},
		{"::0.0.0.2", ClassUnspecified, "0.0.0.2"},
		// NAT64 (41).
		{"64:ff9b::127.0.0.1", ClassLoopback, "127.0.0.1"},
		{"64:ff9b::10.0.0.1", ClassPrivate, "10.0.0.1"},
		{"64:ff9b::a9fe:a9fe", ClassMetadata, "169.254.169.254"},
		{"64:ff9b::8.8.8.8", ClassPublic, "8.8.8.8"},
		{"64:ff9b:1::10.0.0.1", ClassPrivate, "10.0.0.1"},
		{"64:ff9b:1:1::a00:1", ClassReserved, ""},
		{"64:ff9b::1:0:0:1", ClassReserved, ""},
		// 6to4 (41).
		{"2002:7f00:1::1", ClassLoopback, ""},
		{"2002:a00:1::", ClassPrivate, ""},
		{"2002:a9fe:a9fe::1", ClassMetadata, ""},
		{"2002:808:808::1", ClassPublic, ""},
		// Teredo: server 8.8.8.8 / client ^x (41).
		{"2001:0:808:808::80ff:fffe", ClassLoopback, ""},   // client 127.0.0.1
		{"2001:0:808:808::f5ff:fffe", ClassPrivate, ""},    // client 10.0.0.1
		{"2001:0:808:808::5601:5601", ClassMetadata, ""},   // client 169.254.169.254
		{"2001:0:a00:1::f7f7:f7f7", ClassPrivate, ""},      // server 10.0.0.1, client 8.8.8.8
		{"2001:0:808:808::f7f7:f7f7", ClassPublic, ""},     // both 8.8.8.8
		{"2001:0:a9fe:a9fe::80ff:fffe", ClassMetadata, ""}, // strictest wins
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.in)
		c, n := Classify(a)
		want := tt.norm
		if want == "" {
			want = tt.in
		}
		if c != tt.want || n.String() != want {
			t.Errorf("Classify(%s) = %v, %s; want %v, %s", tt.in, c, n, tt.want, want)
		}
	}
	if c, _ := Classify(netip.Addr{}); c != ClassInvalid {
		t.Errorf("Classify(zero) = %v", c)
	}
}

func TestParseHostLiteral(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want string // "" = not a literal
	}{
		{"169.254.169.254", "169.254.169.254"},
		{"2852039166", "169.254.169.254"},
		{"0xA9FEA9FE", "169.254.169.254"},
		{"0xa9fea9fe", "169.254.169.254"},
		{"0251.0376.0251.0376", "169.254.169.254"},
		{"0xa9.0xfe.0xa9.0xfe", "169.254.169.254"},
		{"169.254.43518", "169.254.169.254"},
		{"169.16689662", "169.254.169.254"},
		{"0251.0xfe.169.0376", "169.254.169.254"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"10.1.1", "10.1.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0x00000000007f000001", "127.0.0.1"},
		{"0", "0.0.0.0"},
		{"0.0.0.0", "0.0.0.0"},
		{"127.0.0.1.", "127.0.0.1"},
		{"0x", "0.0.0.0"},
		{"4294967295", "255.255.255.255"},
		{"::1", "::1"},
		{"[::1]", "::1"},
		{"[::ffff:127.0.0.1]", "::ffff:127.0.0.1"},
		{"fe80::1%eth0", "fe80::1"},
		{"[fe80::1%25eth0]", "fe80::1"},
		// Not literals.
		{"", ""},
		{"example.com", ""},
		{"1.2.3.4.5", ""},
		{"4294967296", ""},
		{"256.1.1.1", ""},
		{"1.256.1.1", ""},
		{"1.1.65536", ""},
		{"08.1.1.1", ""},
		{"1..1", ""},
		{".1.1", ""},
		{"1.1.1.1..", ""},
		{"0xg", ""},
		{"1e3", ""},
		{"[127.0.0.1]", ""},
		{"[::1", ""},
		{"::1]", ""},
		{"127.0.0.1:80", ""},
		{" 127.0.0.1", ""},
		{"-1", ""},
		{"+1", ""},
	}
	for _, tt := range tests {
		a, ok := ParseHostLiteral(tt.in)
		got := ""
		if ok {
			got = a.String()
		}
		if got != tt.want {
			t.Errorf("ParseHostLiteral(%q) = %q, %v; want %q", tt.in, got, ok, tt.want)
		}
	}
}

func TestNormalizeName(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"Example.COM.":     "example.com",
		"a-b.example.com":  "a-b.example.com",
		"_dmarc.example":   "_dmarc.example",
		"bücher.de":        "xn--bcher-kva.de",
		"xn--bcher-kva.de": "xn--bcher-kva.de",
		"1.example.com":    "1.example.com",
	}
	for in, want := range good {
		if got, err := NormalizeName(in); err != nil || got != want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", ".", "a..b", ".a", "-a.com", "a-.com", "a b.com", "a/b", "1.2.3.4", "foo.123", "foo.0x7f", "0x7f", "127.1", "a.99999999999999999999"} {
		if got, err := NormalizeName(in); err == nil {
			t.Errorf("NormalizeName(%q) = %q, want an error", in, got)
		}
	}
}
