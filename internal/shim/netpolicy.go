package shim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// networkService serves NetworkService (proto/airlock/shim/v2) on the
// shim socket.
type networkService struct{ s *shim }

var _ shimv2connect.NetworkServiceHandler = networkService{}

// SetPolicy swaps the egress policy of the running network (see
// egress.Engine.SetPolicy). The control plane has stored the new policy
// in the catalog, so a later shim (a resume) starts with it.
func (ns networkService) SetPolicy(_ context.Context, req *connect.Request[shimv2.SetPolicyRequest]) (*connect.Response[shimv2.SetPolicyResponse], error) {
	n := ns.s.net
	closed, err := n.setPolicy(req.Msg.GetMode(), req.Msg.GetAllow())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewResponse(&shimv2.SetPolicyResponse{Closed: uint32(closed)}), nil
}

// setPolicy validates mode and allow against the network's spec and hands
// them to the engine; it returns how many open flows were closed. A
// sandbox without a network device (the fake runtime) has nothing to
// enforce: the change is accepted and closes nothing.
func (n *network) setPolicy(mode string, allow []string) (int, error) {
	if n == nil {
		return 0, nil
	}
	if _, err := n.spec.WithEgress(mode, allow); err != nil {
		return 0, err
	}
	if n.eng == nil || n.spec.Mode == "none" {
		return 0, nil
	}
	closed, err := n.eng.SetPolicy(mode, allow)
	if err != nil {
		return 0, err
	}
	n.s.log.Info("egress policy changed", "mode", mode, "allow_rules", len(allow), "closed", closed)
	return closed, nil
}

// syncTimeout bounds giving the guest a new interception CA.
const syncTimeout = 30 * time.Second

// SetSecrets replaces the running sandbox's secrets (see
// egress.Engine.SetSecrets) and its default environment. The control plane
// has stored the public half and the environment in the catalog and
// sealed the values, so a later shim (a resume) starts with them.
func (ns networkService) SetSecrets(ctx context.Context, req *connect.Request[shimv2.SetSecretsRequest]) (*connect.Response[shimv2.SetSecretsResponse], error) {
	specs := make([]netconf.Secret, 0, len(req.Msg.GetSecrets()))
	vals := netconf.Values{}
	for _, b := range req.Msg.GetSecrets() {
		specs = append(specs, netconf.Secret{Name: b.GetName(), Hosts: b.GetHosts(), Placeholder: b.GetPlaceholder()})
		vals[b.GetName()] = b.GetValue()
	}
	closed, err := ns.s.net.setSecrets(ctx, specs, vals)
	clear(vals)
	if err != nil {
		return nil, err
	}
	ns.s.defEnv.set(req.Msg.GetEnv())
	ns.s.own.setEnv(req.Msg.GetEnv())
	return connect.NewResponse(&shimv2.SetSecretsResponse{Closed: uint32(closed)}), nil
}

// setSecrets validates specs and vals against the network's spec, hands
// them to the engine and, when the interception CA changed, gives the
// guest the new one. A sandbox without a network device (the fake
// runtime) has nothing to inject: the change is accepted and closes
// nothing. Errors are connect errors; none holds a value.
func (n *network) setSecrets(ctx context.Context, specs []netconf.Secret, vals netconf.Values) (int, error) {
	if n == nil {
		return 0, nil
	}
	next := n.spec
	next.Secrets = specs
	if len(specs) > 0 && next.Mode == "none" {
		return 0, connect.NewError(connect.CodeFailedPrecondition, errors.New("secrets need network access, but the sandbox's network mode is none"))
	}
	norm, err := next.Normalize(vals)
	if err != nil {
		return 0, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if n.eng == nil || n.spec.Mode == "none" {
		return 0, nil
	}
	ch, err := n.eng.SetSecrets(norm.Secrets, vals)
	if err != nil {
		return 0, connect.NewError(connect.CodeInvalidArgument, err)
	}
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.Name)
	}
	n.s.log.Info("secrets changed", "secrets", names, "closed", ch.Closed, "ca_changed", ch.CAChanged)
	if ch.CAChanged && n.s.agent != nil {
		sctx, cancel := context.WithTimeout(ctx, syncTimeout)
		defer cancel()
		if _, err := n.s.agent.SyncWith(sctx, agentapi.SyncOptions{Network: n.guestConfig()}); err != nil {
			// The engine injects with the new set; the guest does not
			// trust its CA yet, so its TLS clients refuse the new hosts
			// (fail closed) until the next resume gives it the CA.
			n.s.log.Warn("give the guest the new interception CA", "err", err)
			return ch.Closed, connect.NewError(connect.CodeUnavailable, fmt.Errorf("the guest did not take the new interception CA: %w", err))
		}
	}
	return ch.Closed, nil
}
