package sandbox

import (
	"context"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netconf"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// audit records action on sandboxID (may be "") as c in the catalog's
// audit trail, with c.Via as the detail's "via". A failure to write is
// logged, never returned: the action happened.
func (m *Manager) audit(ctx context.Context, c Caller, sandboxID, action string, detail map[string]any) {
	if detail == nil {
		detail = map[string]any{}
	}
	if c.Via != "" {
		detail["via"] = c.Via
	}
	if _, err := m.Store.AppendEvent(context.WithoutCancel(ctx), store.Event{
		Tenant: c.Tenant, KeyID: c.KeyID, SandboxID: sandboxID, Action: action, Detail: detail,
	}); err != nil && m.Log != nil {
		m.Log.Error("audit", "action", action, "sandbox_id", sandboxID, "via", c.Via, "err", err)
	}
}

// auditCreate records the sandbox.create of sb.
func (m *Manager) auditCreate(ctx context.Context, c Caller, sb store.Sandbox) {
	d := map[string]any{"image": sb.Image, "cpus": sb.CPUs, "memory_mb": sb.MemoryMiB, "disk_mb": sb.DiskMiB,
		"network": NetworkAudit(sb.Network), "idle_pause_s": int64(sb.IdlePause / time.Second)}
	if sb.Source != "" {
		d["source"] = sb.Source
	}
	m.audit(ctx, c, sb.ID, "sandbox.create", d)
}

// NetworkAudit is the audit detail of a network spec: mode, rule and port
// counts, and secret names (never values or placeholders).
func NetworkAudit(n netconf.Spec) map[string]any {
	d := map[string]any{"mode": n.Mode, "allow": len(n.Allow), "ports": len(n.Ports)}
	if len(n.Secrets) > 0 {
		names := make([]string, 0, len(n.Secrets))
		for _, sec := range n.Secrets {
			names = append(names, sec.Name)
		}
		d["secrets"] = names
	}
	return d
}
