package egress

import (
	"net/netip"

	"github.com/airlock-sandbox/airlock/internal/dns"
	"github.com/airlock-sandbox/airlock/internal/netstack"
	"github.com/airlock-sandbox/airlock/internal/policy"
	"github.com/airlock-sandbox/airlock/internal/secrets"
)

// audit records a flow decision.
func (e *Engine) audit(action, proto string, dst netip.AddrPort, names []string, d policy.Decision) {
	det := map[string]any{
		"proto":  proto,
		"dst":    dst.String(),
		"rule":   d.RuleID,
		"reason": d.Reason,
	}
	if len(names) > 0 {
		det["names"] = names
	}
	if d.Class != policy.ClassInvalid {
		det["class"] = d.Class.String()
	}
	e.cfg.Audit(Event{Action: action, Detail: det})
}

// auditBusy records a guest flow the stack refused or dropped before any
// policy decision because one of its caps was full ("net.busy"): a flood
// that outruns the host is in the audit trail, counted, not silent.
func (e *Engine) auditBusy(proto string, dst netip.AddrPort, limit string) {
	reason := "dropped: the sandbox's connection limit (max_conns) is reached"
	if limit == netstack.LimitDials {
		reason = "dropped: too many new flows are waiting for a decision; the guest may retry"
	}
	e.cfg.Audit(Event{Action: "net.busy", Detail: map[string]any{"proto": proto, "dst": dst.String(), "rule": limit, "reason": reason}})
}

// auditDNS records one DNS query.
func (e *Engine) auditDNS(ev dns.Event) {
	det := map[string]any{
		"name":      ev.Name,
		"qtype":     ev.QType,
		"rcode":     ev.Rcode,
		"rule":      ev.RuleID,
		"reason":    ev.Reason,
		"forwarded": ev.Forwarded,
	}
	if len(ev.Answers) > 0 {
		as := make([]string, len(ev.Answers))
		for i, a := range ev.Answers {
			as[i] = a.String()
		}
		det["answers"] = as
	}
	e.cfg.Audit(Event{Action: "net.dns", Detail: det})
}

// auditSecret records an interceptor or placeholder event. Events carry
// secret names, never values.
func (e *Engine) auditSecret(ev secrets.Event) {
	det := map[string]any{"host": ev.Host}
	if len(ev.Secrets) > 0 {
		det["secrets"] = ev.Secrets
	}
	for k, v := range map[string]string{"method": ev.Method, "path": ev.Path, "reason": ev.Reason} {
		if v != "" {
			det[k] = v
		}
	}
	e.cfg.Audit(Event{Action: ev.Action, Detail: det})
}
