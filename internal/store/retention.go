package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Retention bounds the audit trail, the one table a guest or a caller can
// grow without end: events older than MaxAge are deleted, and while the
// catalog's used size (its pages less its free list) is over MaxBytes the
// oldest events go, so the keys and sandboxes that share the file always
// fit. Every process that appends events applies it (every pruneEvery-th
// append), so no daemon needs to be running for it to hold.
type Retention struct {
	MaxAge   time.Duration // 0: events are not deleted by age
	MaxBytes int64         // 0: no size bound
}

// DefaultRetention keeps 90 days of events in at most 1 GiB of catalog.
var DefaultRetention = Retention{MaxAge: 90 * 24 * time.Hour, MaxBytes: 1 << 30}

// minRetentionBytes is the smallest size bound: below it the keys and
// sandboxes alone could keep the catalog over the bound.
const minRetentionBytes = 16 << 20

// pruneEvery is how many appends a process makes between prunes.
const pruneEvery = 1000

// pruneBatch is how many events one DELETE takes.
const pruneBatch = 5000

const (
	settingMaxAge   = "audit.max_age_s"
	settingMaxBytes = "audit.max_bytes"
)

// Validate refuses bounds that would make the audit trail useless.
func (r Retention) Validate() error {
	if r.MaxAge < 0 || (r.MaxAge > 0 && r.MaxAge < time.Hour) {
		return fmt.Errorf("audit max age %s: must be 0 (no bound) or at least 1h", r.MaxAge)
	}
	if r.MaxBytes < 0 || (r.MaxBytes > 0 && r.MaxBytes < minRetentionBytes) {
		return fmt.Errorf("audit max size %d bytes: must be 0 (no bound) or at least %d MiB", r.MaxBytes, minRetentionBytes>>20)
	}
	return nil
}

// Retention returns the catalog's retention (DefaultRetention where unset).
func (s *Store) Retention(ctx context.Context) (Retention, error) {
	r := DefaultRetention
	age, ok, err := s.setting(ctx, settingMaxAge)
	if err != nil {
		return r, err
	}
	if ok {
		r.MaxAge = time.Duration(age) * time.Second
	}
	size, ok, err := s.setting(ctx, settingMaxBytes)
	if err != nil {
		return r, err
	}
	if ok {
		r.MaxBytes = size
	}
	return r, nil
}

// setting reads an integer setting; ok is false if it is unset.
func (s *Store) setting(ctx context.Context, name string) (v int64, ok bool, err error) {
	var str string
	err = s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE name = ?`, name).Scan(&str)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err == nil {
		v, err = strconv.ParseInt(str, 10, 64)
	}
	if err != nil {
		return 0, false, fmt.Errorf("read setting %s: %w", name, err)
	}
	return v, true, nil
}

// SetRetention stores r for every process of this catalog.
func (s *Store) SetRetention(ctx context.Context, r Retention) error {
	if err := r.Validate(); err != nil {
		return err
	}
	for name, v := range map[string]int64{settingMaxAge: int64(r.MaxAge / time.Second), settingMaxBytes: r.MaxBytes} {
		if _, err := s.db.ExecContext(ctx, `INSERT INTO settings(name,value) VALUES(?,?) ON CONFLICT(name) DO UPDATE SET value=excluded.value`, name, strconv.FormatInt(v, 10)); err != nil {
			return fmt.Errorf("set retention: %w", err)
		}
	}
	return nil
}

// UsedBytes is the catalog's size less its free pages: what its rows take.
func (s *Store) UsedBytes(ctx context.Context) (int64, error) {
	if s.db.pg {
		return s.pgUsedBytes(ctx)
	}
	var pages, free, size int64
	for _, q := range []struct {
		pragma string
		dst    *int64
	}{{"page_count", &pages}, {"freelist_count", &free}, {"page_size", &size}} {
		if err := s.db.QueryRowContext(ctx, "PRAGMA "+q.pragma).Scan(q.dst); err != nil {
			return 0, fmt.Errorf("catalog size: %w", err)
		}
	}
	return (pages - free) * size, nil
}

// PruneEvents applies the retention now and returns how many events it
// deleted. Deleting by size is recorded as an audit.prune event, so the
// trail says it was cut.
func (s *Store) PruneEvents(ctx context.Context) (int64, error) {
	r, err := s.Retention(ctx)
	if err != nil {
		return 0, err
	}
	var deleted int64
	if r.MaxAge > 0 {
		cutoff := s.now().Add(-r.MaxAge).UnixNano()
		for range 100 { // at most 500,000 rows a call; the next prune goes on
			res, err := s.db.ExecContext(ctx, `DELETE FROM events WHERE seq IN (SELECT seq FROM events ORDER BY seq LIMIT ?) AND time < ?`, pruneBatch, cutoff)
			if err != nil {
				return deleted, fmt.Errorf("prune events: %w", err)
			}
			n, _ := res.RowsAffected()
			deleted += n
			if n == 0 {
				break // the oldest batch is all younger than the cutoff
			}
		}
	}
	if r.MaxBytes <= 0 {
		return deleted, nil
	}
	var bySize int64
	for range 20 {
		used, err := s.UsedBytes(ctx)
		if err != nil {
			return deleted, err
		}
		if used <= r.MaxBytes {
			break
		}
		var lo, hi sql.NullInt64
		if err := s.db.QueryRowContext(ctx, `SELECT min(seq), max(seq) FROM events`).Scan(&lo, &hi); err != nil {
			return deleted, fmt.Errorf("prune events: %w", err)
		}
		if !lo.Valid {
			break // no events left: the rest is not the audit trail's
		}
		// The oldest tenth of the trail (at least a batch) at a time.
		upto := lo.Int64 + max((hi.Int64-lo.Int64)/10, pruneBatch)
		res, err := s.db.ExecContext(ctx, `DELETE FROM events WHERE seq < ?`, upto)
		if err != nil {
			return deleted, fmt.Errorf("prune events: %w", err)
		}
		n, _ := res.RowsAffected()
		bySize += n
	}
	if bySize > 0 {
		deleted += bySize
		_, err = s.db.ExecContext(ctx, `INSERT INTO events(time,tenant,key_id,sandbox_id,action,detail) VALUES(?,'','','','audit.prune',?)`,
			s.now().UnixNano(), fmt.Sprintf(`{"deleted":%d,"reason":"the audit trail reached its size bound (%d bytes); the oldest events were deleted"}`, bySize, r.MaxBytes))
		if err != nil {
			return deleted, fmt.Errorf("prune events: %w", err)
		}
	}
	return deleted, nil
}

// Checkpoint copies the write-ahead log into the catalog file and
// truncates the log (so the file's size is the catalog's). On PostgreSQL
// it does nothing: the server manages its own log.
func (s *Store) Checkpoint(ctx context.Context) error {
	if s.db.pg {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return fmt.Errorf("checkpoint catalog: %w", err)
	}
	return nil
}
