package secrets

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"sync"
	"time"
)

const (
	// caValidity is how long a CA (and so every leaf it issues) is valid.
	// The CA lives only as long as the process that made it, so this only
	// has to outlast the longest-running sandbox.
	caValidity = 366 * 24 * time.Hour
	// clockSkew backdates certificates so a guest whose clock runs slightly
	// behind the host's still accepts them.
	clockSkew = time.Hour
	// maxLeaves caps the leaf cache: wildcard patterns let a guest ask for
	// any number of names.
	maxLeaves = 1024
)

// CA is an in-memory certificate authority (ECDSA P-256) that issues leaf
// certificates for the hosts that carry secrets. Its private key is never
// serialised: it exists only in this process's memory. Its certificate
// carries critical X.509 name constraints, so even a guest that trusts it can
// be fooled only about the hosts it was made for.
//
// A CA is safe for concurrent use.
type CA struct {
	hosts []string // normalised patterns, as given to NewCA
	key   *ecdsa.PrivateKey
	cert  *x509.Certificate
	pem   []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate // by normalised name
}

// NewCA makes a CA whose certificate permits only the given host patterns
// ("api.example.com" or "*.example.com"). Name constraints are DNS subtrees
// (RFC 5280 4.2.1.10): "*.x.com" becomes the constraint "x.com", which
// permits x.com and every name below it, and an exact host "api.x.com"
// unavoidably permits its subtree ("a.api.x.com") as well. [CA.Leaf] is
// stricter and issues only names that match a pattern. All IP addresses are
// excluded, so the CA can never vouch for an IP SAN.
func NewCA(hosts []string) (*CA, error) {
	if len(hosts) == 0 {
		return nil, errors.New("new ca: no hosts")
	}
	var permitted []string
	seen := map[string]bool{}
	for _, h := range hosts {
		p := normalizeHost(h)
		if !validPattern(p) {
			return nil, fmt.Errorf("new ca: invalid host pattern %q", h)
		}
		c := strings.TrimPrefix(p, "*.")
		if !seen[c] {
			seen[c] = true
			permitted = append(permitted, c)
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new ca: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("new ca: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{Organization: []string{"airlock"}, CommonName: "airlock sandbox secrets CA"},
		NotBefore:                   now.Add(-clockSkew),
		NotAfter:                    now.Add(caValidity),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLen:                  0,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
		ExcludedIPRanges: []*net.IPNet{
			{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("new ca: create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new ca: parse certificate: %w", err)
	}
	norm := make([]string, len(hosts))
	for i, h := range hosts {
		norm[i] = normalizeHost(h)
	}
	return &CA{
		hosts:  norm,
		key:    key,
		cert:   cert,
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{},
	}, nil
}

// CertPEM returns the CA certificate as one PEM "CERTIFICATE" block, for the
// guest's trust store. The caller must not modify it.
func (c *CA) CertPEM() []byte { return c.pem }

// Certificate returns the parsed CA certificate. The caller must not modify it.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Leaf returns a certificate for name, which must match one of the CA's host
// patterns (see [HostMatches]). Leaves are cached per name (up to a bound,
// after which an arbitrary entry is evicted). Each has its own ECDSA P-256
// key, a single dNSName SAN, the serverAuth extended key usage and a validity
// from an hour ago to the CA's expiry.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	n := normalizeHost(name)
	if !validDNSName(n) {
		return nil, fmt.Errorf("leaf: invalid host name %q", name)
	}
	if !c.permits(n) {
		return nil, fmt.Errorf("leaf: %q matches none of the CA's hosts", name)
	}
	c.mu.Lock()
	leaf := c.leaves[n]
	c.mu.Unlock()
	if leaf != nil {
		return leaf, nil
	}
	leaf, err := c.issue(n)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cached := c.leaves[n]; cached != nil {
		return cached, nil // lost a race; keep one certificate per name
	}
	if len(c.leaves) >= maxLeaves {
		for k := range c.leaves {
			delete(c.leaves, k)
			break
		}
	}
	c.leaves[n] = leaf
	return leaf, nil
}

// permits reports whether name matches one of the CA's host patterns.
func (c *CA) permits(name string) bool {
	for _, p := range c.hosts {
		if HostMatches(p, name) {
			return true
		}
	}
	return false
}

// issue signs a leaf for name without checking it against the CA's hosts
// (tests use it to forge a leaf outside the name constraints).
func (c *CA) issue(name string) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("leaf: generate key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("leaf: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-clockSkew),
		NotAfter:              c.cert.NotAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{name},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("leaf: create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("leaf: parse certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}, nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return serial, nil
}
