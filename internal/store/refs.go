package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Disk references. A sandbox's or a snapshot's disk is a qcow2 overlay
// whose backing chain runs through snapshot disks and a template's disk;
// those files must stay while anything is backed by them. The catalog
// records each such dependency as a row (holder, role, target) in refs;
// the files themselves stay what the runtime needs (the qcow2 chain).
//
// A holder keeps its targets, and they keep theirs: holding a snapshot is
// enough to keep its whole chain. Collect frees what nothing holds.

// Kind is what a reference holds or is held by.
type Kind string

const (
	KindSandbox  Kind = "sandbox"
	KindSnapshot Kind = "snapshot" // by snapshot id (its content address)
	KindTemplate Kind = "template" // by template id (its directory name)
)

// Role says why a holder holds a target.
type Role string

const (
	// RoleDisk: the holder's disk is backed by the target's disk.
	RoleDisk Role = "disk"
	// RoleOrigin: the sandbox starts from the target snapshot's state
	// (its shim clones the snapshot's template).
	RoleOrigin Role = "origin"
)

// Obj names a holder or a target.
type Obj struct {
	Kind Kind
	ID   string
}

func (o Obj) String() string { return string(o.Kind) + " " + o.ID }

// Sandbox, Snapshot and Template name objects.
func SandboxObj(id string) Obj  { return Obj{KindSandbox, id} }
func SnapshotObj(id string) Obj { return Obj{KindSnapshot, id} }
func TemplateObj(id string) Obj { return Obj{KindTemplate, id} }

// AddRefs records that holder holds targets in role. A snapshot target
// must have its catalog row (ErrNotFound otherwise): checked in the same
// transaction, so a snapshot Collect has released cannot be held again.
func (s *Store) AddRefs(ctx context.Context, holder Obj, role Role, targets ...Obj) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add refs: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := addRefs(ctx, tx, holder, role, targets, true); err != nil {
		return err
	}
	return tx.Commit()
}

func addRefs(ctx context.Context, tx *tx, holder Obj, role Role, targets []Obj, check bool) error {
	for _, t := range targets {
		if check && t.Kind == KindSnapshot {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM snapshots WHERE id = ?`, t.ID).Scan(&n); err != nil {
				return fmt.Errorf("add refs: %w", err)
			}
			if n == 0 {
				return fmt.Errorf("%w: snapshot %s is gone", errdefs.ErrNotFound, t.ID)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO refs(holder_kind,holder_id,role,target_kind,target_id) VALUES(?,?,?,?,?) ON CONFLICT DO NOTHING`,
			string(holder.Kind), holder.ID, string(role), string(t.Kind), t.ID); err != nil {
			return fmt.Errorf("add refs: %w", err)
		}
	}
	return nil
}

// Holders returns what holds target (each once).
func (s *Store) Holders(ctx context.Context, target Obj) ([]Obj, error) {
	return queryObjs(ctx, s.db, `SELECT DISTINCT holder_kind, holder_id FROM refs WHERE target_kind = ? AND target_id = ? ORDER BY holder_kind, holder_id`,
		string(target.Kind), target.ID)
}

// Targets returns what holder holds in role ("" for any role), each once.
func (s *Store) Targets(ctx context.Context, holder Obj, role Role) ([]Obj, error) {
	q := `SELECT DISTINCT target_kind, target_id FROM refs WHERE holder_kind = ? AND holder_id = ?`
	args := []any{string(holder.Kind), holder.ID}
	if role != "" {
		q += ` AND role = ?`
		args = append(args, string(role))
	}
	return queryObjs(ctx, s.db, q+` ORDER BY target_kind, target_id`, args...)
}

type querier interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

func queryObjs(ctx context.Context, q querier, query string, args ...any) ([]Obj, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("refs: %w", err)
	}
	defer rows.Close()
	var out []Obj
	for rows.Next() {
		var o Obj
		var k string
		if err := rows.Scan(&k, &o.ID); err != nil {
			return nil, fmt.Errorf("refs: %w", err)
		}
		o.Kind = Kind(k)
		out = append(out, o)
	}
	return out, rows.Err()
}

// DropHolder forgets every reference holder holds (a snapshot directory
// without a catalog row being deleted). Sandboxes and snapshots with rows
// drop theirs with DeleteSandbox and DeleteSnapshot.
func (s *Store) DropHolder(ctx context.Context, holder Obj) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM refs WHERE holder_kind = ? AND holder_id = ?`, string(holder.Kind), holder.ID); err != nil {
		return fmt.Errorf("drop refs of %s: %w", holder, err)
	}
	return nil
}

// Collect is the one collector of disk references. Of candidates (what
// the caller would free once unused: fork bases, stale templates), it
// releases every one that nothing holds, in one transaction: a released
// snapshot loses its catalog row, and a released object's own references
// go with it, so the candidates only it held are released too. It returns
// the released objects, whose files the caller deletes (a snapshot
// candidate without a catalog row is not released again). Objects that are
// not candidates (named snapshots, current templates) are never released
// and keep what they hold.
func (s *Store) Collect(ctx context.Context, candidates []Obj) ([]Obj, error) {
	if len(candidates) == 0 {
		return nil, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	released := map[Obj]bool{}
	var out []Obj
	for changed := true; changed; {
		changed = false
		for _, c := range candidates {
			if released[c] {
				continue
			}
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM refs WHERE target_kind = ? AND target_id = ?`, string(c.Kind), c.ID).Scan(&n); err != nil {
				return nil, fmt.Errorf("collect: %w", err)
			}
			if n > 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM refs WHERE holder_kind = ? AND holder_id = ?`, string(c.Kind), c.ID); err != nil {
				return nil, fmt.Errorf("collect: %w", err)
			}
			if c.Kind == KindSnapshot {
				res, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, c.ID)
				if err != nil {
					return nil, fmt.Errorf("collect: %w", err)
				}
				if n, _ := res.RowsAffected(); n == 0 {
					released[c] = true // released before: not again
					continue
				}
			}
			released[c] = true
			out = append(out, c)
			changed = true
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	return out, nil
}

// Legacy reference files (catalog schema 5 and older), imported into refs
// by the v6 migration and no longer written: per sandbox and per snapshot
// directory, snapshot.refs (the snapshot ids its disk chain goes
// through, one a line) and template.ref (the template directory its disk
// is backed by), and per sandbox from.snapshot (the snapshot it starts
// from).
const (
	legacySnapshotRefs = "snapshot.refs"
	legacyTemplateRef  = "template.ref"
	legacyFromSnapshot = "from.snapshot"
)

// importRefFiles records the legacy reference files under stateDir as
// rows: those of sandboxes with a catalog row and of every snapshot
// directory (one without a row may back a sandbox's disk).
func importRefFiles(ctx context.Context, tx *tx, stateDir string) error {
	read := func(p string) []string {
		b, _ := os.ReadFile(p)
		return strings.Fields(string(b))
	}
	imp := func(holder Obj, dir string) error {
		var disk, origin []Obj
		for _, sid := range read(filepath.Join(dir, legacySnapshotRefs)) {
			disk = append(disk, SnapshotObj(sid))
		}
		for _, t := range read(filepath.Join(dir, legacyTemplateRef)) {
			disk = append(disk, TemplateObj(filepath.Base(t)))
		}
		for _, sid := range read(filepath.Join(dir, legacyFromSnapshot)) {
			origin = append(origin, SnapshotObj(sid))
		}
		return errors.Join(addRefs(ctx, tx, holder, RoleDisk, disk, false), addRefs(ctx, tx, holder, RoleOrigin, origin, false))
	}
	rows, err := tx.QueryContext(ctx, `SELECT id FROM sandboxes`)
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range ids {
		if err := imp(SandboxObj(id), filepath.Join(stateDir, "sandboxes", id)); err != nil {
			return err
		}
	}
	snaps, _ := os.ReadDir(filepath.Join(stateDir, "snapshots"))
	for _, d := range snaps {
		if !d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			continue
		}
		if err := imp(SnapshotObj(d.Name()), filepath.Join(stateDir, "snapshots", d.Name())); err != nil {
			return err
		}
	}
	return nil
}
