// Package netconf is a sandbox's network configuration as users write it
// (CLI flags, the API's "network" object) and as the catalog stores it: the
// egress mode and allow rules, secrets bound to hosts, published ports and
// limits. It parses and validates; the shim enforces (internal/egress).
//
// Secret values are not part of Spec. They travel from the caller to the
// shim in memory only ([Values]); the catalog keeps each secret's name,
// hosts and guest placeholder.
package netconf

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"net/textproto"
	"slices"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/policy"
)

// Limits.
const (
	MaxAllowRules = 256
	MaxSecrets    = 32
	MaxSecretLen  = 16 << 10 // bytes of one secret value
	MaxPorts      = 32
	// DefaultMaxConns is the default cap on a sandbox's TCP connections
	// plus UDP flows.
	DefaultMaxConns = 512
	MaxMaxConns     = 65536
	// Outbound abuse limits (Spec.ConnRate, DestsPerMin, UDPRate). The
	// defaults leave room for package installs and crawlers several times
	// over (README, "Outbound abuse"): pip download of 80 packages from a
	// server without keep-alive opened 160 connections in 1.6 s (83 in its
	// busiest second), npm install of 80 packages 166 (60 in its busiest
	// second); with keep-alive, 1 and 15.
	DefaultConnRate    = 100  // new connections per second, sustained
	ConnBurstFactor    = 5    // the bucket holds this many seconds of ConnRate
	DefaultDestsPerMin = 600  // distinct destinations (address:port) per minute
	DefaultUDPRate     = 5000 // UDP datagrams per second the guest sends
	MaxAbuseLimit      = 1 << 16
	// PlaceholderPrefix starts every secret placeholder.
	PlaceholderPrefix = "airlock-secret-"
)

// GuestMAC is every guest NIC's address (QEMU's default); each guest has
// its own link, so they never meet. Runtimes give the NIC this address and
// the shim's stack sends to it.
const GuestMAC = "52:54:00:12:34:56"

// Guest addressing (fixed: every sandbox has its own link and stack).
var (
	GuestIP   = netip.MustParseAddr("10.0.2.15")
	GatewayIP = netip.MustParseAddr("10.0.2.2")
	PrefixLen = 24
)

// Spec is a sandbox's network configuration. The zero value is mode public
// with no secrets, no published ports and default limits.
type Spec struct {
	// Mode is "public" (default), "deny" or "none"; see policy.ParsePolicy
	// ("" with Allow rules means deny).
	Mode  string   `json:"mode,omitempty"`
	Allow []string `json:"allow,omitempty"`
	// Secrets are bound to hosts; the guest sees Placeholder in its env.
	Secrets []Secret `json:"secrets,omitempty"`
	// Ports are published from the host into the guest.
	Ports []Port `json:"ports,omitempty"`
	// RateBytes caps each direction's throughput in bytes per second
	// (0: unlimited).
	RateBytes int64 `json:"rate_bytes,omitempty"`
	// MaxConns caps TCP connections plus UDP flows (0: DefaultMaxConns).
	MaxConns int `json:"max_conns,omitempty"`
	// Outbound abuse limits, per sandbox: 0 takes the default, a negative
	// value means no limit (Normalize makes it -1). The control plane sets
	// them from the tenant's settings (an admin's), never from what the
	// creator asks.
	//
	// ConnRate is new outbound TCP connections plus UDP flows per second,
	// a token bucket holding ConnBurstFactor seconds of it
	// (DefaultConnRate).
	ConnRate int `json:"conn_rate,omitempty"`
	// DestsPerMin is distinct destinations (address:port) per minute
	// (DefaultDestsPerMin).
	DestsPerMin int `json:"dests_per_min,omitempty"`
	// UDPRate is UDP datagrams per second the guest may send, a token
	// bucket holding one second of it (DefaultUDPRate).
	UDPRate int `json:"udp_pps,omitempty"`
}

// Secret is one secret's public half.
type Secret struct {
	// Name is the guest environment variable (A-Z, a-z, 0-9, _; not
	// starting with a digit).
	Name string `json:"name"`
	// Hosts are the names the real value may be sent to: exact names or
	// "*.suffix" (policy rule syntax without ports or addresses).
	Hosts []string `json:"hosts"`
	// Placeholder is what the guest sees; filled in by Normalize.
	Placeholder string `json:"placeholder,omitempty"`
	// Header, if set, is the one request header field the value may be
	// put in (canonicalised by Normalize; matched case-insensitively); the
	// placeholder anywhere else in a request to Hosts is refused. Empty:
	// any header, the URL's query and path.
	Header string `json:"header,omitempty"`
	// Vault names the secret of the owner's vault (the host-side store)
	// whose value this one has; "" when the caller gave the value. The
	// control plane looks it up; the spec never holds the value.
	Vault string `json:"vault,omitempty"`
}

// Port is one published port.
type Port struct {
	// HostIP is the host address to listen on (default 127.0.0.1).
	HostIP string `json:"host_ip,omitempty"`
	// HostPort is the host port (0: pick a free one; the shim reports it).
	HostPort  uint16 `json:"host_port"`
	GuestPort uint16 `json:"guest_port"`
}

// Values maps a secret's name to its real value. Never stored, logged or
// sent to the guest.
type Values map[string]string

// Policy returns the egress policy of s.
func (s Spec) Policy() (policy.Policy, error) { return policy.ParsePolicy(s.Mode, s.Allow) }

// Normalize validates s against vals (every secret needs a value and every
// value a secret), fills defaults and missing placeholders, and returns the
// result. Errors wrap errdefs.ErrInvalid and never contain a secret value.
func (s Spec) Normalize(vals Values) (Spec, error) {
	bad := func(format string, a ...any) (Spec, error) {
		return Spec{}, fmt.Errorf("%w: network: "+format, append([]any{errdefs.ErrInvalid}, a...)...)
	}
	if len(s.Allow) > MaxAllowRules {
		return bad("%d allow rules (at most %d)", len(s.Allow), MaxAllowRules)
	}
	p, err := s.Policy()
	if err != nil {
		return Spec{}, err
	}
	s.Mode = string(p.Mode())
	s.Allow = slices.Clone(s.Allow)
	if len(s.Secrets) > MaxSecrets {
		return bad("%d secrets (at most %d)", len(s.Secrets), MaxSecrets)
	}
	if len(s.Secrets) > 0 && p.Mode() == policy.ModeNone {
		return bad("secrets need network access, but the network mode is none")
	}
	seen := map[string]bool{}
	secrets := make([]Secret, 0, len(s.Secrets))
	for i, sec := range s.Secrets {
		if !ValidEnvName(sec.Name) {
			return bad("secret %d: name %q must be letters, digits and _, not starting with a digit", i, sec.Name)
		}
		if seen[sec.Name] {
			return bad("secret %s given twice", sec.Name)
		}
		seen[sec.Name] = true
		if len(sec.Hosts) == 0 {
			return bad("secret %s: no host (write NAME@host)", sec.Name)
		}
		hosts := make([]string, 0, len(sec.Hosts))
		for _, h := range sec.Hosts {
			r, err := policy.ParseRule(h)
			if err != nil {
				return bad("secret %s: host %q: %v", sec.Name, h, err)
			}
			if r.Domain == "" || r.PortLo != 0 {
				return bad("secret %s: host %q must be a name or *.suffix, without a port", sec.Name, h)
			}
			name := r.Domain
			if r.Wildcard {
				name = "*." + name
			}
			hosts = append(hosts, name)
		}
		v, ok := vals[sec.Name]
		if !ok {
			return bad("secret %s has no value", sec.Name)
		}
		if v == "" || len(v) > MaxSecretLen {
			return bad("secret %s: value must be 1 to %d bytes", sec.Name, MaxSecretLen)
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return bad("secret %s: value must not contain CR, LF or NUL (it is sent in HTTP headers)", sec.Name)
		}
		ph := sec.Placeholder
		if ph == "" {
			ph = NewPlaceholder()
		} else if !ValidPlaceholder(ph) {
			return bad("secret %s: placeholder %q is not %s followed by 32 hex digits", sec.Name, ph, PlaceholderPrefix)
		}
		header := sec.Header
		if header != "" {
			if !ValidSecretHeader(header) {
				return bad("secret %s: header %q must be a header field name starting with a letter (hosts take no port), other than Host, Content-Length, Transfer-Encoding, TE, Trailer, Connection, Keep-Alive, Proxy-Connection, Upgrade and HTTP2-Settings", sec.Name, header)
			}
			header = textproto.CanonicalMIMEHeaderKey(header)
		}
		if sec.Vault != "" && !ValidEnvName(sec.Vault) {
			return bad("secret %s: vault name %q must be letters, digits and _, not starting with a digit", sec.Name, sec.Vault)
		}
		secrets = append(secrets, Secret{Name: sec.Name, Hosts: hosts, Placeholder: ph, Header: header, Vault: sec.Vault})
	}
	for name := range vals {
		if !seen[name] {
			return bad("a value was given for %q, which is not a declared secret", name)
		}
	}
	s.Secrets = secrets
	if len(s.Ports) > MaxPorts {
		return bad("%d published ports (at most %d)", len(s.Ports), MaxPorts)
	}
	ports := make([]Port, 0, len(s.Ports))
	used := map[string]bool{}
	for _, pt := range s.Ports {
		if pt.HostIP == "" {
			pt.HostIP = "127.0.0.1"
		}
		a, err := netip.ParseAddr(pt.HostIP)
		if err != nil || a.Zone() != "" {
			return bad("published port: host address %q is not an IP address", pt.HostIP)
		}
		pt.HostIP = a.String()
		if pt.GuestPort == 0 {
			return bad("published port: guest port must be 1-65535")
		}
		key := netip.AddrPortFrom(a, pt.HostPort).String()
		if pt.HostPort != 0 && used[key] {
			return bad("published port: %s given twice", key)
		}
		used[key] = true
		ports = append(ports, pt)
	}
	s.Ports = ports
	if len(ports) > 0 && p.Mode() == policy.ModeNone {
		return bad("published ports need network access, but the network mode is none")
	}
	if s.RateBytes < 0 {
		return bad("rate must not be negative")
	}
	switch {
	case s.MaxConns < 0 || s.MaxConns > MaxMaxConns:
		return bad("max connections must be 0 to %d", MaxMaxConns)
	case s.MaxConns == 0:
		s.MaxConns = DefaultMaxConns
	}
	for _, l := range []struct {
		v    *int
		def  int
		what string
	}{{&s.ConnRate, DefaultConnRate, "connection rate"}, {&s.DestsPerMin, DefaultDestsPerMin, "destinations per minute"}, {&s.UDPRate, DefaultUDPRate, "UDP packet rate"}} {
		switch {
		case *l.v > MaxAbuseLimit:
			return bad("%s must be at most %d (or negative: no limit)", l.what, MaxAbuseLimit)
		case *l.v < 0:
			*l.v = -1
		case *l.v == 0:
			*l.v = l.def
		}
	}
	return s, nil
}

// Env returns the guest environment a spec adds: each secret's placeholder.
func (s Spec) Env() map[string]string {
	if len(s.Secrets) == 0 {
		return nil
	}
	env := make(map[string]string, len(s.Secrets))
	for _, sec := range s.Secrets {
		env[sec.Name] = sec.Placeholder
	}
	return env
}

// NewPlaceholder returns a fresh random placeholder.
func NewPlaceholder() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return PlaceholderPrefix + hex.EncodeToString(b[:])
}

// ValidPlaceholder reports whether s has the placeholder form.
func ValidPlaceholder(s string) bool {
	rest, ok := strings.CutPrefix(s, PlaceholderPrefix)
	if !ok || len(rest) != 32 {
		return false
	}
	for _, c := range rest {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ValidEnvName reports whether s is a portable environment variable name.
func ValidEnvName(s string) bool {
	if s == "" || len(s) > 128 || '0' <= s[0] && s[0] <= '9' {
		return false
	}
	for _, c := range s {
		if !(c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// VaultFlagPrefix starts the CLI's --secret that takes its value from the
// vault ("vault:NAME[@host,...]").
const VaultFlagPrefix = "vault:"

// ParseSecretFlag parses "NAME@host[,host...][:Header-Name]" (the CLI's
// --secret; its value comes from $NAME) or
// "vault:NAME[@host[,host...]][:Header-Name]" (the value of the vault
// secret NAME, bound to $NAME; without hosts, the vault secret's).
func ParseSecretFlag(s string) (Secret, error) {
	if rest, ok := strings.CutPrefix(s, VaultFlagPrefix); ok {
		rest, header, scoped := strings.Cut(rest, ":")
		name, hosts, _ := strings.Cut(rest, "@")
		if name == "" || strings.HasSuffix(rest, "@") || scoped && header == "" {
			return Secret{}, fmt.Errorf("%w: --secret %q: want vault:NAME[@host[,host...]][:Header-Name]", errdefs.ErrInvalid, s)
		}
		sec := Secret{Name: name, Vault: name, Header: header}
		if hosts != "" {
			sec.Hosts = strings.Split(hosts, ",")
		}
		return sec, nil
	}
	name, hosts, ok := strings.Cut(s, "@")
	hosts, header, scoped := strings.Cut(hosts, ":")
	if !ok || name == "" || hosts == "" || scoped && header == "" {
		return Secret{}, fmt.Errorf("%w: --secret %q: want NAME@host[,host...][:Header-Name]", errdefs.ErrInvalid, s)
	}
	return Secret{Name: name, Hosts: strings.Split(hosts, ","), Header: header}, nil
}

// ValidSecretHeader reports whether name can scope a secret
// (Secret.Header): an HTTP header field name (an RFC 9110 token) that
// starts with a letter, other than the fields that frame or route a
// request. internal/secrets checks the same (secrets.ValidScopeHeader).
func ValidSecretHeader(name string) bool {
	if name == "" || !('a' <= name[0]|0x20 && name[0]|0x20 <= 'z') {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "te", "trailer", "connection",
		"keep-alive", "proxy-connection", "upgrade", "http2-settings":
		return false
	}
	return true
}

// ParsePortFlag parses "[hostip:]hostport:guestport" or "guestport" (the
// CLI's -p; a bare guest port publishes it on the same host port). IPv6
// host addresses go in brackets.
func ParsePortFlag(s string) (Port, error) {
	bad := fmt.Errorf("%w: -p %q: want [host-ip:]host-port:guest-port", errdefs.ErrInvalid, s)
	var p Port
	rest := s
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]:")
		if end < 0 {
			return p, bad
		}
		p.HostIP, rest = rest[1:end], rest[end+2:]
	}
	parts := strings.Split(rest, ":")
	port := func(v string, zeroOK bool) (uint16, bool) {
		n, err := strconv.ParseUint(v, 10, 16)
		return uint16(n), err == nil && (zeroOK || n > 0)
	}
	var ok1, ok2 bool
	switch {
	case len(parts) == 1 && p.HostIP == "":
		p.GuestPort, ok1 = port(parts[0], false)
		p.HostPort, ok2 = p.GuestPort, ok1
	case len(parts) == 2:
		p.HostPort, ok1 = port(parts[0], true)
		p.GuestPort, ok2 = port(parts[1], false)
	case len(parts) == 3 && p.HostIP == "":
		p.HostIP = parts[0]
		p.HostPort, ok1 = port(parts[1], true)
		p.GuestPort, ok2 = port(parts[2], false)
	}
	if !ok1 || !ok2 {
		return Port{}, bad
	}
	return p, nil
}

// ParseRate parses a byte rate: a number with an optional K, M or G suffix
// (powers of 1024) and an optional "B/s" or "/s" ("10M", "512KB/s").
func ParseRate(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "/S"), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("%w: rate %q: want bytes per second like 10M or 512K", errdefs.ErrInvalid, s)
	}
	return n * mult, nil
}

// WithEgress returns s, a normalised spec, with its egress policy replaced
// by mode and allow (the rest of a live policy change keeps: secrets,
// published ports and limits). A change into or out of mode none is
// refused: the guest's network device is set up, or left down, when the
// sandbox starts. Errors wrap errdefs.ErrInvalid.
func (s Spec) WithEgress(mode string, allow []string) (Spec, error) {
	if len(allow) > MaxAllowRules {
		return Spec{}, fmt.Errorf("%w: network: %d allow rules (at most %d)", errdefs.ErrInvalid, len(allow), MaxAllowRules)
	}
	p, err := policy.ParsePolicy(mode, allow)
	if err != nil {
		return Spec{}, err
	}
	was := policy.ModePublic
	if s.Mode != "" {
		was = policy.Mode(s.Mode)
	}
	if (p.Mode() == policy.ModeNone) != (was == policy.ModeNone) {
		return Spec{}, fmt.Errorf("%w: network: a running sandbox cannot change to or from mode none (its network device is set up when it starts); use mode deny without rules to block all egress", errdefs.ErrInvalid)
	}
	s.Mode = string(p.Mode())
	s.Allow = slices.Clone(allow)
	return s, nil
}
