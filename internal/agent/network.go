package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
)

// Limits on NetworkConfig.
const (
	maxNameservers = 4
	maxCAPEM       = 64 << 10
	minMTU         = 68
	maxMTU         = 65535
)

// Marks around the egress CA in the system bundle: the block is replaced,
// never duplicated, by later Syncs.
const (
	caBlockBegin = "# airlock-egress-ca begin"
	caBlockEnd   = "# airlock-egress-ca end"
)

// Guest paths the network config writes, relative to netFiles.root.
const (
	resolvConfPath = "etc/resolv.conf"
	hostsPath      = "etc/hosts"
	caCertPath     = "usr/local/share/ca-certificates/airlock-egress.crt"
	caBundlePath   = "etc/ssl/certs/ca-certificates.crt"
)

// netConfig is a validated agentv1.NetworkConfig.
type netConfig struct {
	Enabled     bool
	Address     netip.Prefix // the guest's address and its prefix length
	Gateway     netip.Addr
	Nameservers []netip.Addr
	CAPEM       []byte // "" or one or more PEM CERTIFICATE blocks
	MTU         uint32 // 0: leave as is
}

// equal reports whether c and o configure the same thing.
func (c netConfig) equal(o netConfig) bool {
	return c.Enabled == o.Enabled && c.Address == o.Address && c.Gateway == o.Gateway &&
		slices.Equal(c.Nameservers, o.Nameservers) && bytes.Equal(c.CAPEM, o.CAPEM) && c.MTU == o.MTU
}

// parseNetworkConfig validates m. A disabled config carries nothing else:
// its other fields are ignored. Errors are InvalidArgument.
func parseNetworkConfig(m *agentv1.NetworkConfig) (netConfig, error) {
	if !m.GetEnabled() {
		return netConfig{}, nil
	}
	c := netConfig{Enabled: true, MTU: m.GetMtu()}
	var err error
	if c.Address, err = netip.ParsePrefix(m.GetAddress()); err != nil || !c.Address.Addr().Is4() {
		return netConfig{}, invalidf("network.address must be an IPv4 address with a prefix length")
	}
	a, bits := c.Address.Addr(), c.Address.Bits()
	if bits < 1 || bits > 30 || !a.IsGlobalUnicast() {
		return netConfig{}, invalidf("network.address must be a unicast address in a /1 to /30 network")
	}
	if a == c.Address.Masked().Addr() || a == lastAddr(c.Address) {
		return netConfig{}, invalidf("network.address is its network's network or broadcast address")
	}
	if c.Gateway, err = netip.ParseAddr(m.GetGateway()); err != nil || !c.Gateway.Is4() {
		return netConfig{}, invalidf("network.gateway must be an IPv4 address")
	}
	if !c.Address.Contains(c.Gateway) || c.Gateway == a || c.Gateway == c.Address.Masked().Addr() || c.Gateway == lastAddr(c.Address) {
		return netConfig{}, invalidf("network.gateway must be another host of the address's network")
	}
	if n := len(m.GetNameservers()); n > maxNameservers {
		return netConfig{}, invalidf("network.nameservers: %d given, at most %d", n, maxNameservers)
	}
	for _, s := range m.GetNameservers() {
		ns, err := netip.ParseAddr(s)
		if err != nil || ns.Zone() != "" || ns.IsUnspecified() || ns.IsMulticast() {
			return netConfig{}, invalidf("network.nameservers: each must be an IP address literal")
		}
		c.Nameservers = append(c.Nameservers, ns.Unmap())
	}
	if c.MTU != 0 && (c.MTU < minMTU || c.MTU > maxMTU) {
		return netConfig{}, invalidf("network.mtu must be 0 or %d to %d", minMTU, maxMTU)
	}
	if pemBytes := m.GetCaCertPem(); len(pemBytes) > 0 {
		if err := validateCAPEM(pemBytes); err != nil {
			return netConfig{}, invalidf("network.ca_cert_pem: %v", err)
		}
		c.CAPEM = bytes.TrimSpace(pemBytes)
	}
	return c, nil
}

// lastAddr is the last (broadcast) address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// validateCAPEM checks that b is at most maxCAPEM bytes of one or more PEM
// CERTIFICATE blocks that parse as X.509, with nothing else but space.
func validateCAPEM(b []byte) error {
	if len(b) > maxCAPEM {
		return fmt.Errorf("more than %d bytes", maxCAPEM)
	}
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if len(bytes.TrimSpace(rest)) != 0 {
				return errors.New("data outside PEM blocks")
			}
			break
		}
		if blk.Type != "CERTIFICATE" || len(blk.Headers) != 0 {
			return errors.New("only CERTIFICATE blocks are allowed")
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return errors.New("a certificate does not parse")
		}
		n++
	}
	if n == 0 {
		return errors.New("no PEM certificate")
	}
	return nil
}

// netFiles edits the guest files of the network config under root ("/" in
// the guest, a temporary directory in tests). Every edit is idempotent: a
// file that already says the right thing is not rewritten.
type netFiles struct {
	root string
}

func (f netFiles) path(rel string) string { return filepath.Join(f.root, rel) }

// apply writes resolv.conf, hosts and the CA for an enabled config.
func (f netFiles) apply(c netConfig) error {
	if err := f.writeResolvConf(c.Nameservers); err != nil {
		return err
	}
	if err := f.ensureHosts(); err != nil {
		return err
	}
	return f.setCA(c.CAPEM)
}

// resolvConf is the content of /etc/resolv.conf for servers.
func resolvConf(servers []netip.Addr) []byte {
	var b strings.Builder
	b.WriteString("# written by airlock-agent\n")
	for _, s := range servers {
		b.WriteString("nameserver " + s.String() + "\n")
	}
	b.WriteString("options timeout:2 attempts:2\n")
	return []byte(b.String())
}

// writeResolvConf replaces /etc/resolv.conf (a symlink too: the link
// itself is replaced by a regular file). With no servers it is left alone.
func (f netFiles) writeResolvConf(servers []netip.Addr) error {
	if len(servers) == 0 {
		return nil
	}
	p := f.path(resolvConfPath)
	want := resolvConf(servers)
	if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
		if cur, err := os.ReadFile(p); err == nil && bytes.Equal(cur, want) {
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	if err := writeAtomic(p, want, 0o644); err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	return nil
}

// ensureHosts makes /etc/hosts map localhost to 127.0.0.1, appending the
// line to an existing file that lacks it.
func (f netFiles) ensureHosts() error {
	p := f.path(hostsPath)
	cur, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("hosts: %w", err)
	}
	if err == nil && hasLocalhost(cur) {
		return nil
	}
	next := cur
	if len(next) > 0 && next[len(next)-1] != '\n' {
		next = append(next, '\n')
	}
	next = append(next, "127.0.0.1 localhost\n"...)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	if err := writeAtomic(p, next, 0o644); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	return nil
}

// hasLocalhost reports whether a hosts file maps localhost to 127.0.0.1.
func hasLocalhost(b []byte) bool {
	for line := range strings.Lines(string(b)) {
		line, _, _ = strings.Cut(line, "#")
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "127.0.0.1" {
			continue
		}
		for _, name := range fields[1:] {
			if name == "localhost" {
				return true
			}
		}
	}
	return false
}

// setCA installs pemBytes as the egress CA (or removes it if empty): its
// own file under /usr/local/share/ca-certificates, and a marked block in
// the system bundle if the image has one.
func (f netFiles) setCA(pemBytes []byte) error {
	crt := f.path(caCertPath)
	if len(pemBytes) == 0 {
		if err := os.Remove(crt); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("egress ca: %w", err)
		}
	} else {
		want := append(bytes.TrimSpace(pemBytes), '\n')
		if cur, err := os.ReadFile(crt); err != nil || !bytes.Equal(cur, want) {
			if err := os.MkdirAll(filepath.Dir(crt), 0o755); err != nil {
				return fmt.Errorf("egress ca: %w", err)
			}
			if err := writeAtomic(crt, want, 0o644); err != nil {
				return fmt.Errorf("egress ca: %w", err)
			}
		}
	}
	bundle := f.path(caBundlePath)
	if real, err := filepath.EvalSymlinks(bundle); err == nil {
		bundle = real
	}
	fi, err := os.Stat(bundle)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("ca bundle: %w", err)
	}
	cur, err := os.ReadFile(bundle)
	if err != nil {
		return fmt.Errorf("ca bundle: %w", err)
	}
	if len(pemBytes) == 0 && !bytes.Contains(cur, []byte(caBlockBegin)) {
		return nil // the common case, checked without parsing the bundle
	}
	next := editCABundle(cur, pemBytes)
	if bytes.Equal(cur, next) {
		return nil
	}
	if err := writeAtomic(bundle, next, fi.Mode().Perm()); err != nil {
		return fmt.Errorf("ca bundle: %w", err)
	}
	return nil
}

// editCABundle returns bundle without any airlock block, plus a new block
// holding pemBytes if it is not empty. A begin mark without its end (a
// hand edit) is kept with what follows it.
func editCABundle(bundle, pemBytes []byte) []byte {
	var out, pending []byte // pending: the open block, dropped at its end
	in := false
	for line := range strings.Lines(string(bundle)) {
		switch strings.TrimRight(line, "\r\n") {
		case caBlockBegin:
			out = append(out, pending...)
			pending, in = []byte(line), true
			continue
		case caBlockEnd:
			if in {
				pending, in = nil, false
				continue
			}
		}
		if in {
			pending = append(pending, line...)
		} else {
			out = append(out, line...)
		}
	}
	out = append(out, pending...)
	if len(pemBytes) == 0 {
		return out
	}
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = append(out, caBlockBegin+"\n"...)
	out = append(out, bytes.TrimSpace(pemBytes)...)
	out = append(out, "\n"+caBlockEnd+"\n"...)
	return out
}

// writeAtomic replaces path with data through a temporary file in the same
// directory and a rename (which replaces a symlink, not its target). No
// fsync: every Sync rewrites these files, and the guest's disk does not
// outlive a crash of the guest that would need them.
func writeAtomic(path string, data []byte, mode fs.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: ENOENT, ignored
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
