package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// Snapshot is one saved sandbox state (memory, devices, disk) that new
// sandboxes start from. Its files live in snapshots/<ID>/.
type Snapshot struct {
	Tenant      string
	Name        string
	ID          string
	SandboxID   string // the sandbox it was taken from
	Image       string
	ImageDigest string
	CPUs        int
	MemoryMiB   int
	DiskMiB     int
	Network     netconf.Spec // without secrets: sandboxes with secrets are never saved
	Env         map[string]string
	Size        int64 // bytes on disk
	Created     time.Time
	// ExecDefaults are its sandbox's (a template's WORKDIR and USER).
	ExecDefaults ExecDefaults
}

const snapshotCols = `tenant,name,id,sandbox_id,image,image_digest,cpus,memory_mib,disk_mib,network,env,size,created,exec_defaults`

// PutSnapshot records a new snapshot; a name the tenant already uses is
// ErrAlreadyExists.
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("record snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := putSnapshot(ctx, tx, sn); err != nil {
		return err
	}
	return tx.Commit()
}

func putSnapshot(ctx context.Context, tx *tx, sn Snapshot) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM snapshots WHERE tenant = ? AND name = ?`, sn.Tenant, sn.Name).Scan(&n); err != nil {
		return fmt.Errorf("record snapshot: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: snapshot %q exists", errdefs.ErrConflict, sn.Name)
	}
	network, _ := json.Marshal(sn.Network)
	env, _ := json.Marshal(sn.Env)
	_, err := tx.ExecContext(ctx, `INSERT INTO snapshots(`+snapshotCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sn.Tenant, sn.Name, sn.ID, sn.SandboxID, sn.Image, sn.ImageDigest, sn.CPUs, sn.MemoryMiB, sn.DiskMiB,
		string(network), string(env), sn.Size, sn.Created.UnixNano(), sn.ExecDefaults.json())
	if err != nil {
		return fmt.Errorf("record snapshot: %w", err)
	}
	return nil
}

func scanSnapshot(r scanner) (Snapshot, error) {
	var sn Snapshot
	var network, env, defaults string
	var created int64
	if err := r.Scan(&sn.Tenant, &sn.Name, &sn.ID, &sn.SandboxID, &sn.Image, &sn.ImageDigest, &sn.CPUs, &sn.MemoryMiB, &sn.DiskMiB,
		&network, &env, &sn.Size, &created, &defaults); err != nil {
		return sn, err
	}
	_ = json.Unmarshal([]byte(defaults), &sn.ExecDefaults)
	_ = json.Unmarshal([]byte(network), &sn.Network)
	_ = json.Unmarshal([]byte(env), &sn.Env)
	sn.Created = time.Unix(0, created).UTC()
	return sn, nil
}

// GetSnapshot returns a tenant's snapshot by name (ErrNotFound if none).
func (s *Store) GetSnapshot(ctx context.Context, tenant, name string) (Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return sn, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	return sn, err
}

// ListSnapshots returns a tenant's snapshots ("" with all: every tenant's),
// oldest first.
func (s *Store) ListSnapshots(ctx context.Context, tenant string, all bool) ([]Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots`
	var args []any
	if !all {
		q += ` WHERE tenant = ?`
		args = append(args, tenant)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created`, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot's row and the disk references it
// holds, and returns it. While anything holds the snapshot (a disk backed
// by it, a sandbox started from it) it is refused with
// ErrFailedPrecondition naming the holders; the check and the delete are
// one transaction.
func (s *Store) DeleteSnapshot(ctx context.Context, tenant, name string) (Snapshot, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Snapshot{}, fmt.Errorf("delete snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	sn, err := scanSnapshot(tx.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return sn, fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return sn, fmt.Errorf("delete snapshot: %w", err)
	}
	holders, err := queryObjs(ctx, tx, `SELECT DISTINCT holder_kind, holder_id FROM refs WHERE target_kind = ? AND target_id = ? ORDER BY holder_kind, holder_id`,
		string(KindSnapshot), sn.ID)
	if err != nil {
		return sn, err
	}
	if len(holders) > 0 {
		var names []string
		for _, h := range holders {
			names = append(names, describeHolder(ctx, tx, sn, h))
		}
		return sn, fmt.Errorf("%w: snapshot %q is still in use: %s; remove those first", errdefs.ErrFailedPrecondition, name, strings.Join(names, "; "))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, sn.ID); err != nil {
		return sn, fmt.Errorf("delete snapshot: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM refs WHERE holder_kind = ? AND holder_id = ?`, string(KindSnapshot), sn.ID); err != nil {
		return sn, fmt.Errorf("delete snapshot: %w", err)
	}
	return sn, tx.Commit()
}

// describeHolder says what holds snapshot sn in the words a user acts
// on: the sandbox it was taken of (whose disk now continues from it), a
// sandbox started or forked from it, a later snapshot on top of it, or the
// unlisted base of a fork (which goes by itself once its forks are gone).
func describeHolder(ctx context.Context, tx *tx, sn Snapshot, h Obj) string {
	switch h.Kind {
	case KindSandbox:
		if h.ID == sn.SandboxID {
			return fmt.Sprintf("sandbox %s, which it was taken of (that sandbox's disk now continues from the snapshot's)", h.ID)
		}
		return fmt.Sprintf("sandbox %s, which started from it", h.ID)
	case KindSnapshot:
		var name, from string
		if err := tx.QueryRowContext(ctx, `SELECT name, sandbox_id FROM snapshots WHERE id = ?`, h.ID).Scan(&name, &from); err == nil {
			if strings.HasPrefix(name, "_fork-") {
				return fmt.Sprintf("the base of a fork of sandbox %s (it goes once the forks made from it are removed)", from)
			}
			return fmt.Sprintf("snapshot %q, taken later on top of it", name)
		}
	}
	return h.String()
}

// RecordSnapshot records a new snapshot taken of a sandbox, in one
// transaction: its row (a name the tenant already uses is ErrConflict),
// its disk references (whatever the sandbox's disk was backed by) and the
// sandbox's new one (its disk is now backed by the snapshot's).
func (s *Store) RecordSnapshot(ctx context.Context, sn Snapshot) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("record snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if err := putSnapshot(ctx, tx, sn); err != nil {
		return err
	}
	sb := SandboxObj(sn.SandboxID)
	chain, err := queryObjs(ctx, tx, `SELECT DISTINCT target_kind, target_id FROM refs WHERE holder_kind = ? AND holder_id = ? AND role = ?`,
		string(sb.Kind), sb.ID, string(RoleDisk))
	if err != nil {
		return err
	}
	if err := addRefs(ctx, tx, SnapshotObj(sn.ID), RoleDisk, chain, false); err != nil {
		return err
	}
	if err := addRefs(ctx, tx, sb, RoleDisk, []Obj{SnapshotObj(sn.ID)}, false); err != nil {
		return err
	}
	return tx.Commit()
}
