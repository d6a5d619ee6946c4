package api

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// networkRequest is the create request's "network": an object, or a bare
// mode string ("public", "deny", "none") as shorthand for {"mode": ...}.
// Secret values travel only here, then in netconf.Values to the manager.
type networkRequest struct {
	Mode      string          `json:"mode"`
	Allow     []string        `json:"allow"`
	Secrets   []secretRequest `json:"secrets"`
	Ports     []netconf.Port  `json:"ports"`
	RateBytes int64           `json:"rate_bytes"`
	MaxConns  int             `json:"max_conns"`
	// The outbound abuse limits are the tenant's (the manager sets them):
	// accepted so that a network read back can be sent again, and ignored.
	ConnRate    int `json:"conn_rate"`
	DestsPerMin int `json:"dests_per_min"`
	UDPRate     int `json:"udp_pps"`
}

type secretRequest struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
	Value string   `json:"value"`
	// Placeholder is optional (a fresh one is made); it lets a client
	// send back a sandbox's network as it got it.
	Placeholder string `json:"placeholder"`
	// Header, if set, is the one request header the value may go in.
	Header string `json:"header"`
	// Vault names a secret of the caller's vault whose value this one
	// gets (instead of Value); Hosts may then be empty (the vault
	// secret's).
	Vault string `json:"vault"`
}

// UnmarshalJSON accepts the mode shorthand and rejects unknown fields (the
// outer decoder's DisallowUnknownFields does not reach custom unmarshalers).
func (n *networkRequest) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		*n = networkRequest{}
		return json.Unmarshal(b, &n.Mode)
	}
	type plain networkRequest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p plain
	if err := dec.Decode(&p); err != nil {
		return err
	}
	*n = networkRequest(p)
	return nil
}

var errPortsNeedAdmin = &Error{http.StatusForbidden, "permission_denied",
	"network.ports publishes ports on the server's host and needs an admin key; use the preview route /v1/sandboxes/{id}/ports/{port}/ instead"}

// networkOptions turns req into the manager's spec and secret values and
// validates them (the manager validates again; this answers early). A nil
// req is the default network. Errors never hold a secret value.
func networkOptions(req *networkRequest, admin bool) (netconf.Spec, netconf.Values, error) {
	if req == nil {
		return netconf.Spec{}, nil, nil
	}
	spec := netconf.Spec{Mode: req.Mode, Allow: req.Allow, Ports: req.Ports, RateBytes: req.RateBytes, MaxConns: req.MaxConns}
	var vals netconf.Values
	// check is spec without the vault's secrets, validated here; the
	// manager resolves those (their values and default hosts).
	check := spec
	for _, sec := range req.Secrets {
		s := netconf.Secret{Name: sec.Name, Hosts: sec.Hosts, Placeholder: sec.Placeholder, Header: sec.Header, Vault: sec.Vault}
		spec.Secrets = append(spec.Secrets, s)
		if sec.Vault != "" {
			if sec.Value != "" {
				return netconf.Spec{}, nil, invalidf("network: secret %s has both a value and a vault secret", sec.Name)
			}
			continue
		}
		check.Secrets = append(check.Secrets, s)
		if sec.Value == "" {
			continue // Normalize names the secret that has no value
		}
		if vals == nil {
			vals = netconf.Values{}
		}
		if _, dup := vals[sec.Name]; dup {
			return netconf.Spec{}, nil, invalidf("network: secret %s given twice", sec.Name)
		}
		vals[sec.Name] = sec.Value
	}
	if len(spec.Ports) > 0 && !admin {
		return netconf.Spec{}, nil, errPortsNeedAdmin
	}
	if !admin {
		// Threat 62: the platform floor (private, loopback, link-local,
		// metadata...) is the operator's to open, not a tenant's; a live
		// change (PUT .../network) is refused the same way.
		if err := sandbox.CheckFloor(spec); err != nil {
			return netconf.Spec{}, nil, err
		}
	}
	if _, err := check.Normalize(vals); err != nil {
		return netconf.Spec{}, nil, err
	}
	return spec, vals, nil
}
