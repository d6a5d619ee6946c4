package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// A placement is the control tier's record of one sandbox of a cluster:
// the node that runs it and what it holds of its tenant's quotas. It is
// reserved before the node is asked (so quotas hold across replicas:
// ReservePlacement checks and reserves in one transaction), bound to the
// sandbox id the node answers, and marked lost when its node is.
//
// A sandbox paused through the control tier may have a bundle (package
// bundle): its saved state in a store every node reads. The placement
// keeps the bundle's digest until a call that could resume the sandbox
// (the node deletes the bundle before it resumes it); a placement with a
// bundle is not lost with its node, but moves to another (MovePlacement)
// on its next call.

// Placement states.
const (
	PlacementPending = "pending" // reserved; the node has not answered
	PlacementPlaced  = "placed"  // the node runs (or ran) the sandbox
	PlacementLost    = "lost"    // its node was lost; Reason says how
)

// Placement is one row.
type Placement struct {
	ID        string // the reservation's id
	SandboxID string // "" while pending
	Tenant    string
	Node      string
	CPUs      int
	MemoryMiB int
	State     string
	Reason    string
	Created   time.Time
	// BundleDigest and BundleBytes name the paused sandbox's bundle (""
	// if it has none now).
	BundleDigest string
	BundleBytes  int64
	// Runtime and Arch are those of the node it was placed on ("" if
	// unknown): a bundle imports only on a node of both.
	Runtime, Arch string
}

// pendingFor bounds how long a create may wait for its node (creates from
// a snapshot's template build can take minutes under TCG).
const pendingFor = 30 * time.Minute

// PlacementQuota is what ReservePlacement checks: a tenant's limits (0:
// none).
type PlacementQuota struct {
	MaxSandboxes, MaxVCPUs, MaxMemoryMiB int
}

// QuotaExceeded is ReservePlacement's error over a quota: which, and how
// much the tenant holds.
type QuotaExceeded struct {
	Quota      string // max_sandboxes, max_vcpus, max_memory_mb
	Used, Max  int
	Additional int
}

func (e *QuotaExceeded) Error() string {
	return fmt.Sprintf("quota %s: the tenant uses %d of %d; this sandbox needs %d more", e.Quota, e.Used, e.Max, e.Additional)
}

// ReservePlacement reserves a sandbox of p.Tenant on p.Node if the
// tenant's pending and placed sandboxes leave room for it within q, in one
// transaction (writers are serialized: see dialect.go); p.ID, State and
// Created are set. Over a quota the error is a *QuotaExceeded.
func (s *Store) ReservePlacement(ctx context.Context, p Placement, q PlacementQuota) (Placement, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	p.ID, p.State, p.Created, p.SandboxID = hex.EncodeToString(b), PlacementPending, time.Now(), ""
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return p, fmt.Errorf("reserve placement: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var n, cpus, mem int
	// A pending reservation older than pendingFor is a create whose
	// replica died before the node answered: it is dropped here.
	if _, err := tx.ExecContext(ctx, `DELETE FROM placements WHERE state = ? AND created < ?`, PlacementPending, p.Created.Add(-pendingFor).UnixNano()); err != nil {
		return p, fmt.Errorf("reserve placement: %w", err)
	}
	err = tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(cpus), 0), coalesce(sum(memory_mib), 0) FROM placements WHERE tenant = ? AND state != ?`,
		p.Tenant, PlacementLost).Scan(&n, &cpus, &mem)
	if err != nil {
		return p, fmt.Errorf("reserve placement: %w", err)
	}
	for _, c := range []struct {
		name            string
		used, max, more int
	}{{"max_sandboxes", n, q.MaxSandboxes, 1}, {"max_vcpus", cpus, q.MaxVCPUs, p.CPUs}, {"max_memory_mb", mem, q.MaxMemoryMiB, p.MemoryMiB}} {
		if c.max > 0 && c.used+c.more > c.max {
			return p, &QuotaExceeded{Quota: c.name, Used: c.used, Max: c.max, Additional: c.more}
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO placements(id, sandbox_id, tenant, node, cpus, memory_mib, state, created, runtime, arch) VALUES(?,NULL,?,?,?,?,?,?,?,?)`,
		p.ID, p.Tenant, p.Node, p.CPUs, p.MemoryMiB, p.State, p.Created.UnixNano(), p.Runtime, p.Arch); err != nil {
		return p, fmt.Errorf("reserve placement: %w", err)
	}
	return p, tx.Commit()
}

// BindPlacement records the sandbox id the node answered for reservation
// id.
func (s *Store) BindPlacement(ctx context.Context, id, sandboxID string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE placements SET sandbox_id = ?, state = ? WHERE id = ? AND state = ?`, sandboxID, PlacementPlaced, id, PlacementPending)
	if err != nil {
		return fmt.Errorf("bind placement: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("%w: placement %s is not pending", errdefs.ErrConflict, id)
	}
	return nil
}

// DeletePlacement removes reservation id (a create that failed) or the
// placement of a sandbox that is gone.
func (s *Store) DeletePlacement(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM placements WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete placement: %w", err)
	}
	return nil
}

const placementCols = `id, coalesce(sandbox_id, ''), tenant, node, cpus, memory_mib, state, reason, created, bundle_digest, bundle_bytes, runtime, arch`

func scanPlacement(r scanner) (Placement, error) {
	var p Placement
	var created int64
	err := r.Scan(&p.ID, &p.SandboxID, &p.Tenant, &p.Node, &p.CPUs, &p.MemoryMiB, &p.State, &p.Reason, &created, &p.BundleDigest, &p.BundleBytes, &p.Runtime, &p.Arch)
	p.Created = time.Unix(0, created)
	return p, err
}

// PlacementOf returns the placement of sandbox id (ErrNotFound if none).
func (s *Store) PlacementOf(ctx context.Context, sandboxID string) (Placement, error) {
	p, err := scanPlacement(s.db.QueryRowContext(ctx, `SELECT `+placementCols+` FROM placements WHERE sandbox_id = ?`, sandboxID))
	if errors.Is(err, sql.ErrNoRows) {
		return p, fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, sandboxID)
	}
	if err != nil {
		return p, fmt.Errorf("placement of %s: %w", sandboxID, err)
	}
	return p, nil
}

// ListPlacements returns the bound placements of tenant ("" for every
// tenant's), oldest first.
func (s *Store) ListPlacements(ctx context.Context, tenant string) ([]Placement, error) {
	q := `SELECT ` + placementCols + ` FROM placements WHERE sandbox_id IS NOT NULL`
	var args []any
	if tenant != "" {
		q += ` AND tenant = ?`
		args = append(args, tenant)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created`, args...)
	if err != nil {
		return nil, fmt.Errorf("list placements: %w", err)
	}
	defer rows.Close()
	var out []Placement
	for rows.Next() {
		p, err := scanPlacement(rows)
		if err != nil {
			return nil, fmt.Errorf("list placements: %w", err)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// MarkNodeLost marks every placement on node lost, with reason, but for
// those with a bundle (they move on their next call), and returns how
// many it marked. Lost placements no longer count against quotas.
func (s *Store) MarkNodeLost(ctx context.Context, node, reason string) (int64, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE placements SET state = ?, reason = ? WHERE node = ? AND state != ? AND bundle_digest = ''`, PlacementLost, reason, node, PlacementLost)
	if err != nil {
		return 0, fmt.Errorf("mark node %s lost: %w", node, err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

// SetPlacementBundle records the bundle a pause of the placement's
// sandbox wrote.
func (s *Store) SetPlacementBundle(ctx context.Context, placementID, digest string, size int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE placements SET bundle_digest = ?, bundle_bytes = ? WHERE id = ?`, digest, size, placementID); err != nil {
		return fmt.Errorf("placement bundle: %w", err)
	}
	return nil
}

// DropPlacementBundle forgets the bundle of a placement: a call may
// resume its sandbox, after which the bundle is stale (its node also
// deletes it from the store before it resumes the sandbox).
func (s *Store) DropPlacementBundle(ctx context.Context, placementID string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE placements SET bundle_digest = '', bundle_bytes = 0 WHERE id = ? AND bundle_digest != ''`, placementID); err != nil {
		return fmt.Errorf("placement bundle: %w", err)
	}
	return nil
}

// MovePlacement moves placement id from node from to node to, if it is
// still on from with the same bundle (so two replicas never move one
// sandbox twice); it reports whether it did.
func (s *Store) MovePlacement(ctx context.Context, id, from, to, digest string) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE placements SET node = ?, state = ?, reason = '' WHERE id = ? AND node = ? AND bundle_digest = ?`, to, PlacementPlaced, id, from, digest)
	if err != nil {
		return false, fmt.Errorf("move placement: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// NodeLoad is what a node's placements hold.
type NodeLoad struct {
	Sandboxes, CPUs, MemoryMiB int
}

// PlacementLoad returns, by node, what its pending and placed sandboxes
// hold: placement counts them at once, before the node's own status says
// so.
func (s *Store) PlacementLoad(ctx context.Context) (map[string]NodeLoad, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT node, count(*), sum(cpus), sum(memory_mib) FROM placements WHERE state != ? GROUP BY node`, PlacementLost)
	if err != nil {
		return nil, fmt.Errorf("placement load: %w", err)
	}
	defer rows.Close()
	out := map[string]NodeLoad{}
	for rows.Next() {
		var n string
		var l NodeLoad
		if err := rows.Scan(&n, &l.Sandboxes, &l.CPUs, &l.MemoryMiB); err != nil {
			return nil, fmt.Errorf("placement load: %w", err)
		}
		out[n] = l
	}
	return out, rows.Err()
}

// LosePlacement marks one placement lost with reason (a sandbox that
// could not move off its lost node) and forgets its bundle.
func (s *Store) LosePlacement(ctx context.Context, id, reason string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE placements SET state = ?, reason = ?, bundle_digest = '', bundle_bytes = 0 WHERE id = ?`, PlacementLost, reason, id); err != nil {
		return fmt.Errorf("lose placement: %w", err)
	}
	return nil
}

// RestorePlacement places a lost placement on node again (its node came
// back with the sandbox).
func (s *Store) RestorePlacement(ctx context.Context, id, node string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE placements SET state = ?, reason = '' WHERE id = ? AND node = ? AND state = ?`, PlacementPlaced, id, node, PlacementLost); err != nil {
		return fmt.Errorf("restore placement: %w", err)
	}
	return nil
}
