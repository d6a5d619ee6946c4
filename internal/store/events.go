package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Event is one audit-trail entry: who (tenant, key) did what to which
// sandbox, and when. Detail holds action-specific fields (argv, exit code,
// path, size...). Secrets never go in it.
type Event struct {
	Seq       int64          `json:"seq"`
	Time      time.Time      `json:"time"`
	Tenant    string         `json:"tenant"`
	KeyID     string         `json:"key_id"`
	SandboxID string         `json:"sandbox_id"`
	Action    string         `json:"action"`
	Detail    map[string]any `json:"detail"`
}

// EventFilter selects events. Zero fields match everything.
type EventFilter struct {
	Tenant    string // "" for all tenants (admin)
	SandboxID string
	// Type selects actions equal to Type or starting with Type+"." ("net"
	// matches net.allow and net.secret.inject; "exec.exit" only itself).
	Type  string
	Since int64 // events with Seq > Since
	Limit int   // default 1000, at most 10000
}

// AppendEvent records e (Seq and, if zero, Time are filled in).
func (s *Store) AppendEvent(ctx context.Context, e Event) (int64, error) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	d, err := json.Marshal(e.Detail)
	if err != nil {
		return 0, fmt.Errorf("append event: %w", err)
	}
	seq, err := s.db.insertID(ctx, "seq", `INSERT INTO events(time,tenant,key_id,sandbox_id,action,detail) VALUES(?,?,?,?,?,?)`,
		e.Time.UnixNano(), e.Tenant, e.KeyID, e.SandboxID, e.Action, string(d))
	if err != nil {
		return 0, fmt.Errorf("append event: %w", err)
	}
	if s.appends.Add(1)%pruneEvery == 1 {
		_, _ = s.PruneEvents(context.WithoutCancel(ctx)) // best effort: the next prune retries
	}
	return seq, nil
}

// ListEvents returns events matching f in order.
func (s *Store) ListEvents(ctx context.Context, f EventFilter) ([]Event, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	f.Limit = min(f.Limit, 10000)
	q := `SELECT seq,time,tenant,key_id,sandbox_id,action,detail FROM events WHERE seq > ?`
	args := []any{f.Since}
	if f.Tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, f.Tenant)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	if f.Type != "" {
		q += ` AND (action = ? OR substr(action, 1, ?) = ?)`
		args = append(args, f.Type, len(f.Type)+1, f.Type+".")
	}
	q += ` ORDER BY seq LIMIT ?`
	args = append(args, f.Limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var t int64
		var d string
		if err := rows.Scan(&e.Seq, &t, &e.Tenant, &e.KeyID, &e.SandboxID, &e.Action, &d); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		e.Time = time.Unix(0, t).UTC()
		_ = json.Unmarshal([]byte(d), &e.Detail)
		if e.Detail == nil {
			e.Detail = map[string]any{} // always an object on the wire
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
