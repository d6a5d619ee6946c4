package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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
}

const snapshotCols = `tenant,name,id,sandbox_id,image,image_digest,cpus,memory_mib,disk_mib,network,env,size,created`

// PutSnapshot records a new snapshot; a name the tenant already uses is
// ErrAlreadyExists.
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	network, _ := json.Marshal(sn.Network)
	env, _ := json.Marshal(sn.Env)
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots(`+snapshotCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sn.Tenant, sn.Name, sn.ID, sn.SandboxID, sn.Image, sn.ImageDigest, sn.CPUs, sn.MemoryMiB, sn.DiskMiB,
		string(network), string(env), sn.Size, sn.Created.UnixNano())
	if err != nil {
		if _, gerr := s.GetSnapshot(ctx, sn.Tenant, sn.Name); gerr == nil {
			return fmt.Errorf("%w: snapshot %q exists", errdefs.ErrConflict, sn.Name)
		}
		return fmt.Errorf("record snapshot: %w", err)
	}
	return nil
}

func scanSnapshot(r scanner) (Snapshot, error) {
	var sn Snapshot
	var network, env string
	var created int64
	if err := r.Scan(&sn.Tenant, &sn.Name, &sn.ID, &sn.SandboxID, &sn.Image, &sn.ImageDigest, &sn.CPUs, &sn.MemoryMiB, &sn.DiskMiB,
		&network, &env, &sn.Size, &created); err != nil {
		return sn, err
	}
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

// DeleteSnapshot removes a snapshot's row.
func (s *Store) DeleteSnapshot(ctx context.Context, tenant, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("delete snapshot: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: snapshot %q", errdefs.ErrNotFound, name)
	}
	return nil
}
