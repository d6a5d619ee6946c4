package shimclient

import (
	"context"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// SetPolicy replaces the running sandbox's egress policy (mode and allow
// rules) and returns how many open connections and UDP flows the new
// policy closed. Errors: ErrInvalid (the shim cannot parse it, or a
// change into or out of mode none), ErrUnsupported (a shim that predates
// it), ErrUnavailable.
func (c *Client) SetPolicy(ctx context.Context, mode string, allow []string) (int, error) {
	cl := shimv2connect.NewNetworkServiceClient(c.hc, baseURL, clientOptions()...)
	resp, err := cl.SetPolicy(ctx, connect.NewRequest(&shimv2.SetPolicyRequest{Mode: mode, Allow: allow}))
	if err != nil {
		return 0, wireErr(ctx, "set network policy", err)
	}
	return int(resp.Msg.GetClosed()), nil
}

// SetSecrets replaces the running sandbox's secrets (the whole set, each
// with its value) and its default environment, and returns how many open
// connections the change closed. Errors: ErrInvalid (the shim cannot
// validate them), ErrFailedPrecondition (a sandbox without network),
// ErrUnsupported (a shim that predates it), ErrUnavailable. No error holds
// a value.
func (c *Client) SetSecrets(ctx context.Context, secrets []netconf.Secret, vals netconf.Values, env map[string]string) (int, error) {
	req := &shimv2.SetSecretsRequest{Env: env}
	for _, s := range secrets {
		req.Secrets = append(req.Secrets, &shimv2.SecretBinding{Name: s.Name, Hosts: s.Hosts, Placeholder: s.Placeholder, Value: vals[s.Name]})
	}
	cl := shimv2connect.NewNetworkServiceClient(c.hc, baseURL, clientOptions()...)
	resp, err := cl.SetSecrets(ctx, connect.NewRequest(req))
	if err != nil {
		return 0, wireErr(ctx, "set secrets", err)
	}
	return int(resp.Msg.GetClosed()), nil
}
