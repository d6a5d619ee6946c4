package egress

import (
	"fmt"
	"slices"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/secrets"
)

// secretSet is the secrets an engine injects and guards: SetSecrets
// replaces it whole, never in part. A flow keeps the set it was dialled
// under (flowRef.sec) for its whole life; UDP datagrams and DNS queries
// are scanned with the set in force.
type secretSet struct {
	spec  []netconf.Secret
	ca    *secrets.CA          // nil without secrets
	ic    *secrets.Interceptor // nil without secrets
	scan  *secrets.Scanner     // nil without secrets
	hosts []string             // every secret host pattern
	// caHosts are the host patterns ca was made for (a later set whose
	// hosts are all among them keeps ca: the guest need not learn a new
	// one).
	caHosts []string
}

// newSecretSet builds the set of specs with their values. It keeps prev's
// CA when that was made for every host specs names.
func (e *Engine) newSecretSet(specs []netconf.Secret, vals netconf.Values, prev *secretSet) (*secretSet, error) {
	set := &secretSet{spec: slices.Clone(specs)}
	if len(specs) == 0 {
		return set, nil
	}
	var binds []secrets.Binding
	var phs []string
	for _, s := range specs {
		v, ok := vals[s.Name]
		if !ok {
			return nil, fmt.Errorf("secret %s has no value", s.Name)
		}
		binds = append(binds, secrets.Binding{Name: s.Name, Hosts: s.Hosts, Placeholder: s.Placeholder, Value: v, Header: s.Header})
		phs = append(phs, s.Placeholder)
		set.hosts = append(set.hosts, s.Hosts...)
	}
	if prev != nil && prev.ca != nil && !slices.ContainsFunc(set.hosts, func(h string) bool { return !slices.Contains(prev.caHosts, h) }) {
		set.ca, set.caHosts = prev.ca, prev.caHosts
	} else {
		ca, err := secrets.NewCA(set.hosts)
		if err != nil {
			return nil, fmt.Errorf("secrets CA: %w", err)
		}
		set.ca, set.caHosts = ca, slices.Clone(set.hosts)
	}
	set.scan = secrets.NewScanner(phs)
	set.ic = &secrets.Interceptor{
		CA:      set.ca,
		Secrets: binds,
		RootCAs: e.cfg.UpstreamRoots,
		Audit:   e.auditSecret,
		Logger:  e.cfg.Logger,
	}
	return set, nil
}

// secretHost reports whether name is a host some secret of set is bound
// to.
func (set *secretSet) secretHost(name string) bool {
	return slices.ContainsFunc(set.hosts, func(p string) bool { return secrets.HostMatches(p, name) })
}

// names maps a placeholder to the name of its secret.
func (set *secretSet) names(ph string) []string {
	for _, s := range set.spec {
		if s.Placeholder == ph {
			return []string{s.Name}
		}
	}
	return nil
}

// SecretsChange is what SetSecrets did.
type SecretsChange struct {
	// Closed counts the open TCP connections the change closed: those
	// whose requests were injected with the old set, and those opened
	// without a placeholder scan when the new set has secrets.
	Closed int
	// CAChanged is true when the interception CA changed (a new host, or
	// the first secrets): the guest must be given CACertPEM again to trust
	// the new one.
	CAChanged bool
}

// SetSecrets replaces the secrets the engine injects (specs, normalised,
// with their values) at once: new connections are intercepted, injected
// and scanned by the new set, and every open TCP connection whose handling
// depended on the old one is closed (each recorded as a "net.deny" event),
// so a removed secret is injected into no request from now on. On an
// error nothing changes. Values are never logged or audited. Safe for
// concurrent use with the engine's traffic; concurrent calls apply in some
// order, the last one wins.
func (e *Engine) SetSecrets(specs []netconf.Secret, vals netconf.Values) (SecretsChange, error) {
	e.secMu.Lock()
	defer e.secMu.Unlock()
	prev := e.sec.Load()
	set, err := e.newSecretSet(specs, vals, prev)
	if err != nil {
		return SecretsChange{}, err
	}
	var victims []*flowRef
	e.flowMu.Lock()
	e.sec.Store(set)
	for f := range e.flows {
		if f.proto == "tcp" && (f.wasIntercepted() || (f.sec.scan == nil && set.scan != nil)) {
			delete(e.flows, f)
			victims = append(victims, f)
		}
	}
	e.flowMu.Unlock()
	d := policy.Decision{RuleID: "secrets:changed", Reason: "closed by a change of the sandbox's secrets (reconnect)"}
	for _, f := range victims {
		f.close()
		e.audit("net.deny", f.proto, f.dst, f.names, d)
	}
	return SecretsChange{Closed: len(victims), CAChanged: set.ca != prev.ca}, nil
}
