package secrets

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"
)

func verifyLeaf(t *testing.T, ca *CA, leaf *x509.Certificate, name string) error {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.CertPEM()) {
		t.Fatal("CertPEM did not parse into a pool")
	}
	_, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

func TestCA(t *testing.T) {
	t.Parallel()
	ca, err := NewCA([]string{"api.test", "*.wild.test", "API.Test."})
	if err != nil {
		t.Fatal(err)
	}
	block, rest := pem.Decode(ca.CertPEM())
	if block == nil || block.Type != "CERTIFICATE" || len(rest) != 0 {
		t.Fatalf("CertPEM is not one CERTIFICATE block: %q", ca.CertPEM())
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !cert.IsCA || !cert.PermittedDNSDomainsCritical || len(cert.PermittedDNSDomains) != 2 || len(cert.ExcludedIPRanges) != 2 {
		t.Errorf("CA certificate: IsCA=%v critical=%v permitted=%v excludedIPs=%v",
			cert.IsCA, cert.PermittedDNSDomainsCritical, cert.PermittedDNSDomains, cert.ExcludedIPRanges)
	}

	for _, name := range []string{"api.test", "a.wild.test", "a.b.wild.test", "API.TEST."} {
		leaf, err := ca.Leaf(name)
		if err != nil {
			t.Errorf("Leaf(%q): %v", name, err)
			continue
		}
		if err := verifyLeaf(t, ca, leaf.Leaf, normalizeHost(name)); err != nil {
			t.Errorf("verify leaf for %q: %v", name, err)
		}
		if leaf.Leaf.NotAfter != cert.NotAfter || len(leaf.Leaf.DNSNames) != 1 || leaf.Leaf.IsCA {
			t.Errorf("leaf for %q: NotAfter=%v DNSNames=%v IsCA=%v", name, leaf.Leaf.NotAfter, leaf.Leaf.DNSNames, leaf.Leaf.IsCA)
		}
	}
	for _, name := range []string{"evil.test", "wild.test", "a.api.test", "", "a b.test", "1.2.3.4.evil"} {
		if _, err := ca.Leaf(name); err == nil {
			t.Errorf("Leaf(%q) succeeded, want an error", name)
		}
	}

	a, _ := ca.Leaf("api.test")
	b, _ := ca.Leaf("API.test")
	if a != b {
		t.Error("Leaf is not cached per name")
	}

	// A leaf the CA key signs for a name outside the constraints must not
	// verify, whatever Leaf would allow.
	forged, err := ca.issue("evil.test")
	if err != nil {
		t.Fatal(err)
	}
	err = verifyLeaf(t, ca, forged.Leaf, "evil.test")
	var inv x509.CertificateInvalidError
	if !errors.As(err, &inv) || inv.Reason != x509.CANotAuthorizedForThisName {
		t.Errorf("verify forged leaf: %v, want CANotAuthorizedForThisName", err)
	}
}

func TestNewCAInvalid(t *testing.T) {
	t.Parallel()
	for _, hosts := range [][]string{nil, {""}, {"*"}, {"*.*.x.com"}, {"a b"}, {"x.com:443"}, {"1.2.3.4/8"}} {
		if _, err := NewCA(hosts); err == nil {
			t.Errorf("NewCA(%q) succeeded, want an error", hosts)
		}
	}
}
