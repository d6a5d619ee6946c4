package mcp

import (
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// portIn is one published port of sandbox_create.
type portIn struct {
	GuestPort uint16 `json:"guest_port" jsonschema:"the TCP port inside the sandbox"`
	HostPort  uint16 `json:"host_port,omitempty" jsonschema:"the port on the server's host (default 0: a free one, shown in the result)"`
	HostIP    string `json:"host_ip,omitempty" jsonschema:"the host address to listen on (default 127.0.0.1)"`
}

// portView is a published port as sandbox_create reports it.
type portView struct {
	GuestPort uint16 `json:"guest_port"`
	HostPort  uint16 `json:"host_port"`
	HostIP    string `json:"host_ip"`
}

// publishPorts turns in into the spec's ports for caller c.
func publishPorts(c sandbox.Caller, in []portIn) ([]netconf.Port, error) {
	if len(in) == 0 {
		return nil, nil
	}
	if !c.Admin {
		// The HTTP API's rule (the manager applies it too): a port on the
		// server's host is the operator's to open; tenants use the preview
		// route. A stdio session (the local user's agent) is not an admin
		// either: an agent picks its own arguments.
		return nil, sandbox.ErrPortsNeedAdmin
	}
	out := make([]netconf.Port, 0, len(in))
	for _, p := range in {
		out = append(out, netconf.Port{HostIP: p.HostIP, HostPort: p.HostPort, GuestPort: p.GuestPort})
	}
	return out, nil
}

func viewPorts(ps []netconf.Port) []portView {
	var out []portView
	for _, p := range ps {
		out = append(out, portView{GuestPort: p.GuestPort, HostPort: p.HostPort, HostIP: p.HostIP})
	}
	return out
}
