package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Volume is a named, per-tenant filesystem that outlives sandboxes. Its
// data is one ext4 image file (statedir.Layout.VolumeImage(ID)).
type Volume struct {
	ID      string // "vol" + a random id; names the files
	Tenant  string
	Name    string
	SizeMiB int
	Created time.Time
	// GuestWritten is true once a microVM (qemu) guest has had it
	// read-write: its blocks were written by a guest kernel, so the host
	// never mounts it (a gvisor attach is refused).
	GuestWritten bool
}

// Mount is one of a sandbox's mounts, fixed at create: a named volume (VolumeID
// set) or a host directory (HostPath set), at guest path Path.
type Mount struct {
	VolumeID   string `json:"volume_id,omitempty"`
	VolumeName string `json:"volume_name,omitempty"` // for display; the id is what counts
	// HostPath is the host directory, absolute and resolved when the
	// sandbox was created.
	HostPath string `json:"host_path,omitempty"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Attachment is a sandbox that has a volume mounted.
type Attachment struct {
	SandboxID string
	Path      string
	ReadOnly  bool
}

const volumeCols = `id,tenant,name,size_mib,created,guest_written`

func scanVolume(r scanner) (Volume, error) {
	var v Volume
	var created int64
	if err := r.Scan(&v.ID, &v.Tenant, &v.Name, &v.SizeMiB, &created, &v.GuestWritten); err != nil {
		return v, err
	}
	v.Created = time.Unix(0, created)
	return v, nil
}

// CreateVolume records a new volume; a name the tenant already uses is
// ErrConflict.
func (s *Store) CreateVolume(ctx context.Context, v Volume) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM volumes WHERE tenant = ? AND name = ?`, v.Tenant, v.Name).Scan(&n); err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: volume %q exists", errdefs.ErrConflict, v.Name)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO volumes(`+volumeCols+`) VALUES(?,?,?,?,?,?)`,
		v.ID, v.Tenant, v.Name, v.SizeMiB, v.Created.UnixNano(), v.GuestWritten); err != nil {
		return fmt.Errorf("create volume: %w", err)
	}
	return tx.Commit()
}

// GetVolume returns tenant's volume name, or an error wrapping ErrNotFound.
func (s *Store) GetVolume(ctx context.Context, tenant, name string) (Volume, error) {
	v, err := scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%w: no volume %q (see `airlock volume ls`)", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return v, fmt.Errorf("get volume %s: %w", name, err)
	}
	return v, nil
}

// ListVolumes returns the volumes of every tenant, by tenant then name.
func (s *Store) ListVolumes(ctx context.Context) ([]Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+volumeCols+` FROM volumes ORDER BY tenant, name`)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Attachments lists the sandboxes that have volume id mounted (every
// sandbox row counts, failed ones too, until it is removed).
func (s *Store) Attachments(ctx context.Context, volumeID string) ([]Attachment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox_id, path, read_only FROM volume_mounts WHERE volume_id = ? ORDER BY sandbox_id`, volumeID)
	if err != nil {
		return nil, fmt.Errorf("volume attachments: %w", err)
	}
	defer rows.Close()
	var out []Attachment
	for rows.Next() {
		var a Attachment
		if err := rows.Scan(&a.SandboxID, &a.Path, &a.ReadOnly); err != nil {
			return nil, fmt.Errorf("volume attachments: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// DeleteVolume removes tenant's volume name's row, and returns it for its
// files to be removed; a volume any sandbox has mounted is ErrConflict.
func (s *Store) DeleteVolume(ctx context.Context, tenant, name string) (Volume, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Volume{}, fmt.Errorf("delete volume: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	v, err := scanVolume(tx.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%w: no volume %q (see `airlock volume ls`)", errdefs.ErrNotFound, name)
	} else if err != nil {
		return v, fmt.Errorf("delete volume: %w", err)
	}
	if err := refuseAttached(ctx, tx, v, "remove"); err != nil {
		return v, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, v.ID); err != nil {
		return v, fmt.Errorf("delete volume: %w", err)
	}
	return v, tx.Commit()
}

// ResizeVolume records tenant's volume name's new size, which must not be
// smaller; resize may fail after the row changed and must restore the old
// size (the row is only committed if resize succeeds). A volume any
// sandbox has mounted is ErrConflict.
func (s *Store) ResizeVolume(ctx context.Context, tenant, name string, sizeMiB int, resize func(Volume) error) (Volume, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Volume{}, fmt.Errorf("resize volume: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	v, err := scanVolume(tx.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%w: no volume %q (see `airlock volume ls`)", errdefs.ErrNotFound, name)
	} else if err != nil {
		return v, fmt.Errorf("resize volume: %w", err)
	}
	if sizeMiB < v.SizeMiB {
		return v, fmt.Errorf("%w: volume %q is %d MiB; a volume can only grow", errdefs.ErrInvalid, name, v.SizeMiB)
	}
	if err := refuseAttached(ctx, tx, v, "resize"); err != nil {
		return v, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE volumes SET size_mib = ? WHERE id = ?`, sizeMiB, v.ID); err != nil {
		return v, fmt.Errorf("resize volume: %w", err)
	}
	old := v
	v.SizeMiB = sizeMiB
	if err := resize(v); err != nil {
		return old, err
	}
	return v, tx.Commit()
}

func refuseAttached(ctx context.Context, tx *tx, v Volume, what string) error {
	var sb string
	err := tx.QueryRowContext(ctx, `SELECT sandbox_id FROM volume_mounts WHERE volume_id = ? ORDER BY sandbox_id LIMIT 1`, v.ID).Scan(&sb)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s volume: %w", what, err)
	}
	return fmt.Errorf("%w: cannot %s volume %q: sandbox %s has it mounted (remove the sandbox first)", errdefs.ErrConflict, what, v.Name, sb)
}

// MarkGuestWritten records that a microVM guest has volume id read-write.
func (s *Store) MarkGuestWritten(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE volumes SET guest_written = 1 WHERE id = ?`, id); err != nil {
		return fmt.Errorf("mark volume %s: %w", id, err)
	}
	return nil
}

// attachVolumes records sb's volume mounts in tx, refusing (ErrConflict)
// a read-write mount of a volume any other sandbox has mounted and a
// read-only one of a volume mounted read-write: a volume is one ext4
// filesystem, which one kernel may write or many may only read.
func attachVolumes(ctx context.Context, tx *tx, sb Sandbox) error {
	for _, m := range sb.Mounts {
		if m.VolumeID == "" {
			continue
		}
		var tenant string
		err := tx.QueryRowContext(ctx, `SELECT tenant FROM volumes WHERE id = ?`, m.VolumeID).Scan(&tenant)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && tenant != sb.Tenant) {
			return fmt.Errorf("%w: no volume %q (see `airlock volume ls`)", errdefs.ErrNotFound, m.VolumeName)
		} else if err != nil {
			return fmt.Errorf("attach volume: %w", err)
		}
		var other string
		var ro bool
		q := `SELECT sandbox_id, read_only FROM volume_mounts WHERE volume_id = ? AND sandbox_id != ?`
		if m.ReadOnly {
			q += ` AND read_only = 0`
		}
		err = tx.QueryRowContext(ctx, q+` ORDER BY sandbox_id LIMIT 1`, m.VolumeID, sb.ID).Scan(&other, &ro)
		switch {
		case err == nil && m.ReadOnly:
			return fmt.Errorf("%w: volume %q is mounted read-write by sandbox %s: it cannot be mounted read-only elsewhere until that sandbox is removed", errdefs.ErrConflict, m.VolumeName, other)
		case err == nil && ro:
			return fmt.Errorf("%w: volume %q is mounted read-only by sandbox %s: a read-write mount needs it mounted nowhere else (mount it read-only, or remove the readers)", errdefs.ErrConflict, m.VolumeName, other)
		case err == nil:
			return fmt.Errorf("%w: volume %q is mounted read-write by sandbox %s: one sandbox at a time may write it", errdefs.ErrConflict, m.VolumeName, other)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("attach volume: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO volume_mounts(volume_id, sandbox_id, path, read_only) VALUES(?,?,?,?)`,
			m.VolumeID, sb.ID, m.Path, m.ReadOnly); err != nil {
			return fmt.Errorf("attach volume %q: %w", m.VolumeName, err)
		}
	}
	return nil
}
