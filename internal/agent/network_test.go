package agent

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// testCAPEM returns a fresh self-signed CA certificate in PEM.
func testCAPEM(t *testing.T, name string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestParseNetworkConfig(t *testing.T) {
	t.Parallel()
	ca := testCAPEM(t, "egress")
	good := func() *agentv1.NetworkConfig {
		return &agentv1.NetworkConfig{
			Enabled: true, Address: "10.0.2.15/24", Gateway: "10.0.2.2",
			Nameservers: []string{"10.0.2.3", "2001:db8::53"}, CaCertPem: ca, Mtu: 1500,
		}
	}
	c, err := parseNetworkConfig(good())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Enabled || c.Address.String() != "10.0.2.15/24" || c.Gateway.String() != "10.0.2.2" ||
		len(c.Nameservers) != 2 || c.MTU != 1500 || !bytes.Equal(c.CAPEM, bytes.TrimSpace(ca)) {
		t.Errorf("parsed %+v", c)
	}
	// Disabled ignores everything else.
	if c, err := parseNetworkConfig(&agentv1.NetworkConfig{Address: "junk"}); err != nil || c.Enabled {
		t.Errorf("disabled: %+v, %v", c, err)
	}
	// Two certificates are fine.
	two := good()
	two.CaCertPem = append(append([]byte{}, ca...), testCAPEM(t, "second")...)
	if _, err := parseNetworkConfig(two); err != nil {
		t.Errorf("two certificates: %v", err)
	}

	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}})
	bad := map[string]func(*agentv1.NetworkConfig){
		"no prefix":          func(n *agentv1.NetworkConfig) { n.Address = "10.0.2.15" },
		"ipv6 address":       func(n *agentv1.NetworkConfig) { n.Address = "fd00::2/64" },
		"hostname address":   func(n *agentv1.NetworkConfig) { n.Address = "guest/24" },
		"/32":                func(n *agentv1.NetworkConfig) { n.Address = "10.0.2.15/32" },
		"loopback":           func(n *agentv1.NetworkConfig) { n.Address, n.Gateway = "127.0.0.2/8", "127.0.0.1" },
		"network address":    func(n *agentv1.NetworkConfig) { n.Address = "10.0.2.0/24" },
		"broadcast address":  func(n *agentv1.NetworkConfig) { n.Address = "10.0.2.255/24" },
		"gateway outside":    func(n *agentv1.NetworkConfig) { n.Gateway = "10.0.3.2" },
		"gateway is address": func(n *agentv1.NetworkConfig) { n.Gateway = "10.0.2.15" },
		"gateway missing":    func(n *agentv1.NetworkConfig) { n.Gateway = "" },
		"gateway name":       func(n *agentv1.NetworkConfig) { n.Gateway = "gw" },
		"5 nameservers": func(n *agentv1.NetworkConfig) {
			n.Nameservers = []string{"1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4", "1.1.1.5"}
		},
		"nameserver name":    func(n *agentv1.NetworkConfig) { n.Nameservers = []string{"dns.example"} },
		"nameserver zone":    func(n *agentv1.NetworkConfig) { n.Nameservers = []string{"fe80::1%eth0"} },
		"nameserver port":    func(n *agentv1.NetworkConfig) { n.Nameservers = []string{"10.0.2.3:53"} },
		"nameserver newline": func(n *agentv1.NetworkConfig) { n.Nameservers = []string{"10.0.2.3\noptions x"} },
		"mtu too small":      func(n *agentv1.NetworkConfig) { n.Mtu = 67 },
		"mtu too big":        func(n *agentv1.NetworkConfig) { n.Mtu = 65536 },
		"ca garbage":         func(n *agentv1.NetworkConfig) { n.CaCertPem = []byte("not pem") },
		"ca trailing junk":   func(n *agentv1.NetworkConfig) { n.CaCertPem = append(append([]byte{}, ca...), "junk"...) },
		"ca private key":     func(n *agentv1.NetworkConfig) { n.CaCertPem = keyPEM },
		"ca not x509": func(n *agentv1.NetworkConfig) {
			n.CaCertPem = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})
		},
		"ca too big": func(n *agentv1.NetworkConfig) {
			n.CaCertPem = bytes.Repeat(ca, maxCAPEM/len(ca)+1)
		},
	}
	for name, mutate := range bad {
		n := good()
		mutate(n)
		if _, err := parseNetworkConfig(n); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestResolvConf(t *testing.T) {
	t.Parallel()
	f := netFiles{root: t.TempDir()}
	p := f.path(resolvConfPath)
	// No /etc yet: it is created.
	servers := []netip.Addr{netip.MustParseAddr("10.0.2.3"), netip.MustParseAddr("1.1.1.1")}
	if err := f.writeResolvConf(servers); err != nil {
		t.Fatal(err)
	}
	want := "# written by airlock-agent\nnameserver 10.0.2.3\nnameserver 1.1.1.1\noptions timeout:2 attempts:2\n"
	if got := readString(t, p); got != want {
		t.Errorf("resolv.conf = %q", got)
	}
	// A symlink (systemd-resolved style) is replaced by a regular file; its
	// target is untouched.
	target := filepath.Join(f.root, "stub-resolv.conf")
	if err := os.WriteFile(target, []byte("nameserver 127.0.0.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	if err := f.writeResolvConf(servers); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("resolv.conf after symlink: %v, %v", fi, err)
	}
	if got := readString(t, p); got != want {
		t.Errorf("resolv.conf = %q", got)
	}
	if got := readString(t, target); got != "nameserver 127.0.0.53\n" {
		t.Errorf("symlink target changed: %q", got)
	}
	// No servers: left alone.
	if err := f.writeResolvConf(nil); err != nil || readString(t, p) != want {
		t.Errorf("no servers changed resolv.conf: %v", err)
	}
}

func TestEnsureHosts(t *testing.T) {
	t.Parallel()
	f := netFiles{root: t.TempDir()}
	p := f.path(hostsPath)
	if err := f.ensureHosts(); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, p); got != "127.0.0.1 localhost\n" {
		t.Errorf("new hosts = %q", got)
	}
	// An image's own file is kept, and the line added once.
	if err := os.WriteFile(p, []byte("10.1.1.1 db # x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.ensureHosts(); err != nil {
			t.Fatal(err)
		}
	}
	if got := readString(t, p); got != "10.1.1.1 db # x\n127.0.0.1 localhost\n" {
		t.Errorf("edited hosts = %q", got)
	}
	// A file that has it is not touched.
	keep := "127.0.0.1\tlocalhost.localdomain localhost\n::1 localhost\n"
	if err := os.WriteFile(p, []byte(keep), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.ensureHosts(); err != nil || readString(t, p) != keep {
		t.Errorf("hosts with localhost changed: %q, %v", readString(t, p), err)
	}
}

func TestSetCA(t *testing.T) {
	t.Parallel()
	f := netFiles{root: t.TempDir()}
	ca1, ca2 := testCAPEM(t, "one"), testCAPEM(t, "two")
	crt := f.path(caCertPath)

	// Without a system bundle only the certificate file is written.
	if err := f.setCA(ca1); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, crt); got != string(ca1) {
		t.Errorf("crt = %q", got)
	}
	if fi, err := os.Stat(crt); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("crt mode: %v, %v", fi, err)
	}

	bundle := f.path(caBundlePath)
	if err := os.MkdirAll(filepath.Dir(bundle), 0o755); err != nil {
		t.Fatal(err)
	}
	orig := "-----BEGIN CERTIFICATE-----\nSYSTEM\n-----END CERTIFICATE-----"
	if err := os.WriteFile(bundle, []byte(orig), 0o644); err != nil {
		t.Fatal(err)
	}
	block := func(ca []byte) string {
		return caBlockBegin + "\n" + strings.TrimSpace(string(ca)) + "\n" + caBlockEnd + "\n"
	}
	// Added once, however often Sync runs.
	for range 2 {
		if err := f.setCA(ca1); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := readString(t, bundle), orig+"\n"+block(ca1); got != want {
		t.Errorf("bundle = %q, want %q", got, want)
	}
	// Replaced, not duplicated.
	if err := f.setCA(ca2); err != nil {
		t.Fatal(err)
	}
	if got, want := readString(t, bundle), orig+"\n"+block(ca2); got != want {
		t.Errorf("bundle = %q, want %q", got, want)
	}
	if got := readString(t, crt); got != string(ca2) {
		t.Errorf("crt = %q", got)
	}
	// Removed with an empty CA.
	if err := f.setCA(nil); err != nil {
		t.Fatal(err)
	}
	if got := readString(t, bundle); got != orig+"\n" {
		t.Errorf("bundle after removal = %q", got)
	}
	if _, err := os.Stat(crt); !os.IsNotExist(err) {
		t.Errorf("crt still there: %v", err)
	}
	if err := f.setCA(nil); err != nil {
		t.Errorf("second removal: %v", err)
	}
}

func TestEditCABundleUnterminatedBlock(t *testing.T) {
	t.Parallel()
	// A begin mark without an end (a hand edit; writes are atomic) keeps
	// what follows it rather than dropping system certificates.
	in := "A\n" + caBlockBegin + "\nX\n"
	if got := string(editCABundle([]byte(in), nil)); got != in {
		t.Errorf("got %q", got)
	}
	got := string(editCABundle([]byte(in), []byte("C")))
	if want := in + caBlockBegin + "\nC\n" + caBlockEnd + "\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if again := string(editCABundle([]byte(got), []byte("C"))); again != got {
		t.Errorf("second edit: %q", again)
	}
}
