package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ActivityFilter selects the events that Activity counts.
type ActivityFilter struct {
	Tenant  string   // "" for every tenant
	Actions []string // exact action names (at least one)
	Since   time.Time
	Step    time.Duration // the width of a bucket (> 0)
	Buckets int           // how many, from Since (1..1000)
}

// Activity counts the events of f.Actions by action in f.Buckets buckets
// of f.Step from f.Since: out[action][i] counts those in [Since+i*Step,
// Since+(i+1)*Step). Events the retention already deleted are not counted.
//
// The events table has no index on time; its seq grows with time (each
// process stamps an event as it appends it), so the first event at or
// after Since is found by a binary search on seq, and the count reads the
// window's events only.
func (s *Store) Activity(ctx context.Context, f ActivityFilter) (map[string][]int, error) {
	if len(f.Actions) == 0 || f.Step <= 0 || f.Buckets < 1 || f.Buckets > 1000 {
		return nil, errors.New("activity: need actions, a positive step and 1..1000 buckets")
	}
	out := make(map[string][]int, len(f.Actions))
	for _, a := range f.Actions {
		out[a] = make([]int, f.Buckets)
	}
	from, err := s.firstSeqAt(ctx, f.Since.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("activity: %w", err)
	}
	step := f.Step.Nanoseconds()
	since := f.Since.UnixNano()
	until := since + step*int64(f.Buckets)
	q := `SELECT (time - ?) / ?, action, COUNT(*) FROM events WHERE seq >= ? AND time >= ? AND time < ? AND action IN (?` +
		strings.Repeat(",?", len(f.Actions)-1) + `)`
	args := []any{since, step, from, since, until}
	for _, a := range f.Actions {
		args = append(args, a)
	}
	if f.Tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, f.Tenant)
	}
	rows, err := s.db.QueryContext(ctx, q+` GROUP BY 1, 2`, args...)
	if err != nil {
		return nil, fmt.Errorf("activity: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i int64
		var action string
		var n int
		if err := rows.Scan(&i, &action, &n); err != nil {
			return nil, fmt.Errorf("activity: %w", err)
		}
		if c, ok := out[action]; ok && i >= 0 && i < int64(len(c)) {
			c[i] += n
		}
	}
	return out, rows.Err()
}

// firstSeqAt returns a seq such that every event at or after time t (Unix
// nanoseconds) has a seq at least it, found by binary search over seq on
// the primary key (events are appended in time order).
func (s *Store) firstSeqAt(ctx context.Context, t int64) (int64, error) {
	var lo, hi sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MIN(seq), MAX(seq) FROM events`).Scan(&lo, &hi); err != nil {
		return 0, err
	}
	if !lo.Valid {
		return 0, nil
	}
	l, h := lo.Int64, hi.Int64+1
	for l < h {
		mid := l + (h-l)/2
		var seq, tm int64
		if err := s.db.QueryRowContext(ctx, `SELECT seq, time FROM events WHERE seq >= ? ORDER BY seq LIMIT 1`, mid).Scan(&seq, &tm); err != nil {
			if errors.Is(err, sql.ErrNoRows) { // pruned meanwhile
				return mid, nil
			}
			return 0, err
		}
		if tm < t {
			l = seq + 1
		} else {
			h = mid
		}
	}
	return l, nil
}
