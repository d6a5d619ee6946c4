package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

// netFlags are the network flags of run and create.
type netFlags struct {
	mode     string
	allow    []string
	secrets  []string
	publish  []string
	rate     string
	maxConns int
}

func (f *netFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "net", "", "network: public (default), deny (only --allow), or none")
	fl.StringArrayVar(&f.allow, "allow", nil, "allow RULE: host, *.suffix, IP or CIDR, optionally :port or :lo-hi (repeatable; implies --net deny)")
	fl.StringArrayVar(&f.secrets, "secret", nil, "NAME@host[,host][:Header-Name]: the guest sees a placeholder in $NAME; the value of $NAME in airlock's own environment is sent to those hosts only (HTTP/1.1, HTTP/2, WebSocket handshakes), and with :Header-Name in that request header only; vault:NAME[@host,...][:Header-Name]: the value of vault secret NAME (see airlock secret set), to its hosts or those given (repeatable)")
	fl.StringArrayVarP(&f.publish, "publish", "p", nil, "publish a guest port: [host-ip:]host-port:guest-port (repeatable; host ip default 127.0.0.1)")
	fl.StringVar(&f.rate, "net-rate", "", "cap network throughput each way, bytes/s (e.g. 10M, 512K)")
	fl.IntVar(&f.maxConns, "max-conns", 0, fmt.Sprintf("cap TCP connections plus UDP flows (default %d)", netconf.DefaultMaxConns))
}

// spec parses the flags into a network spec and the secrets' values, read
// from the environment with lookup (never from argv), and validates them so
// that bad input fails before anything is created, naming the flag.
func (f *netFlags) spec(lookup func(string) (string, bool)) (netconf.Spec, netconf.Values, error) {
	var s netconf.Spec
	bad := func(flag string, err error) (netconf.Spec, netconf.Values, error) {
		return netconf.Spec{}, nil, fmt.Errorf("%s: %w", flag, err)
	}
	if f.mode != "" && !slices.Contains([]string{"public", "deny", "none"}, f.mode) {
		return bad("--net", fmt.Errorf("%w: %q: want public, deny or none", errdefs.ErrInvalid, f.mode))
	}
	s.Mode, s.Allow = f.mode, f.allow
	if _, err := s.Normalize(nil); err != nil {
		return bad("--allow", err)
	}
	var vals netconf.Values
	var vault []netconf.Secret // resolved by the server
	for _, flag := range f.secrets {
		sec, err := parseSecretFlag(flag)
		if err != nil {
			return netconf.Spec{}, nil, err
		}
		if sec.Vault != "" {
			vault = append(vault, sec)
			continue
		}
		v, ok := lookup(sec.Name)
		if !ok || v == "" {
			return bad("--secret "+sec.Name, fmt.Errorf("%w: $%s is unset or empty: airlock reads a secret's value from its own environment (export %s=...), never from the command line",
				errdefs.ErrInvalid, sec.Name, sec.Name))
		}
		if vals == nil {
			vals = netconf.Values{}
		}
		vals[sec.Name] = v
		s.Secrets = append(s.Secrets, sec)
	}
	if _, err := s.Normalize(vals); err != nil {
		return bad("--secret", err)
	}
	for _, sec := range vault {
		if slices.ContainsFunc(s.Secrets, func(o netconf.Secret) bool { return o.Name == sec.Name }) {
			return bad("--secret", fmt.Errorf("%w: secret %s given twice", errdefs.ErrInvalid, sec.Name))
		}
	}
	for _, flag := range f.publish {
		p, err := netconf.ParsePortFlag(flag)
		if err != nil {
			return netconf.Spec{}, nil, err // names -p
		}
		s.Ports = append(s.Ports, p)
	}
	if _, err := (netconf.Spec{Ports: s.Ports}).Normalize(nil); err != nil {
		return bad("-p/--publish", err)
	}
	if f.rate != "" {
		r, err := netconf.ParseRate(f.rate)
		if err != nil {
			return bad("--net-rate", err)
		}
		s.RateBytes = r
	}
	s.MaxConns = f.maxConns
	if _, err := (netconf.Spec{MaxConns: s.MaxConns}).Normalize(nil); err != nil {
		return bad("--max-conns", err)
	}
	if _, err := s.Normalize(vals); err != nil {
		return netconf.Spec{}, nil, err
	}
	s.Secrets = append(s.Secrets, vault...)
	return s, vals, nil
}

// parseSecretFlag parses one --secret (netconf.ParseSecretFlag), refusing
// what looks like a value on the command line without echoing it.
func parseSecretFlag(flag string) (netconf.Secret, error) {
	if name, _, _ := strings.Cut(flag, "@"); strings.Contains(name, "=") {
		// Looks like NAME=VALUE: do not echo what may be the value.
		return netconf.Secret{}, fmt.Errorf("--secret: %w: want NAME@host[,host...] or vault:NAME[@host...]; the value is read from $NAME in airlock's environment or from the vault, never from the command line", errdefs.ErrInvalid)
	}
	sec, err := netconf.ParseSecretFlag(flag)
	if err != nil {
		return netconf.Secret{}, err // names --secret
	}
	if !netconf.ValidEnvName(sec.Name) {
		return netconf.Secret{}, fmt.Errorf("--secret: %w: %q is not an environment variable name", errdefs.ErrInvalid, sec.Name)
	}
	return sec, nil
}

// lookupEnv reads the CLI's environment (tests replace it).
func (g *globals) lookupEnv(name string) (string, bool) {
	if g.env != nil {
		v, ok := g.env[name]
		return v, ok
	}
	return os.LookupEnv(name)
}

// apiNetwork is the API's form of a network spec with its values; nil
// for the default network.
func apiNetwork(s netconf.Spec, vals netconf.Values) *airlock.Network {
	if s.Mode == "" && len(s.Allow) == 0 && len(s.Secrets) == 0 && len(s.Ports) == 0 && s.RateBytes == 0 && s.MaxConns == 0 {
		return nil
	}
	n := &airlock.Network{Mode: s.Mode, Allow: s.Allow, RateBytes: s.RateBytes, MaxConns: s.MaxConns}
	for _, sec := range s.Secrets {
		n.Secrets = append(n.Secrets, airlock.Secret{Name: sec.Name, Hosts: sec.Hosts, Header: sec.Header, Value: vals[sec.Name], Vault: sec.Vault})
	}
	for _, p := range s.Ports {
		n.Ports = append(n.Ports, airlock.Port{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort})
	}
	return n
}

// networkView is how inspect shows a network: secrets by name with their
// hosts and placeholder (values are never stored).
type networkView struct {
	Mode      string                `json:"mode"`
	Allow     []string              `json:"allow,omitempty"`
	Secrets   map[string]secretView `json:"secrets,omitempty"`
	Ports     []netconf.Port        `json:"ports,omitempty"`
	RateBytes int64                 `json:"rate_bytes,omitempty"`
	MaxConns  int                   `json:"max_conns,omitempty"`
	// The outbound abuse limits the sandbox got from its tenant (-1:
	// none).
	ConnRate    int `json:"conn_rate,omitempty"`
	DestsPerMin int `json:"dests_per_min,omitempty"`
	UDPRate     int `json:"udp_pps,omitempty"`
}

type secretView struct {
	Hosts       []string `json:"hosts"`
	Header      string   `json:"header,omitempty"`
	Placeholder string   `json:"placeholder"`
	Vault       string   `json:"vault,omitempty"`
}

func viewNetwork(s netconf.Spec) *networkView {
	if s.Mode == "" && len(s.Allow) == 0 && len(s.Secrets) == 0 && len(s.Ports) == 0 && s.RateBytes == 0 && s.MaxConns == 0 {
		return nil // a row from before networking
	}
	v := &networkView{Mode: s.Mode, Allow: s.Allow, Ports: s.Ports, RateBytes: s.RateBytes, MaxConns: s.MaxConns,
		ConnRate: s.ConnRate, DestsPerMin: s.DestsPerMin, UDPRate: s.UDPRate}
	for _, sec := range s.Secrets {
		if v.Secrets == nil {
			v.Secrets = map[string]secretView{}
		}
		v.Secrets[sec.Name] = secretView{Hosts: sec.Hosts, Header: sec.Header, Placeholder: sec.Placeholder, Vault: sec.Vault}
	}
	return v
}

func viewAPINetwork(n airlock.Network) *networkView {
	s := netconf.Spec{Mode: n.Mode, Allow: n.Allow, RateBytes: n.RateBytes, MaxConns: n.MaxConns,
		ConnRate: n.ConnRate, DestsPerMin: n.DestsPerMin, UDPRate: n.UDPRate}
	for _, sec := range n.Secrets {
		s.Secrets = append(s.Secrets, netconf.Secret{Name: sec.Name, Hosts: sec.Hosts, Placeholder: sec.Placeholder, Header: sec.Header, Vault: sec.Vault})
	}
	for _, p := range n.Ports {
		s.Ports = append(s.Ports, netconf.Port{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort})
	}
	return viewNetwork(s)
}
