package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// VaultSecret is one secret of a tenant's vault: a value kept on the host
// for sandboxes to reference by name. The catalog holds the value only as
// Sealed, which the control plane seals and opens (internal/sandbox); this
// package never sees it in clear.
type VaultSecret struct {
	Tenant string
	Name   string
	// Hosts are the hosts the value may be sent to (empty: whichever a
	// sandbox names).
	Hosts   []string
	Sealed  []byte // empty in ListVaultSecrets
	Created time.Time
	Updated time.Time
}

// PutVaultSecret stores v, replacing the tenant's secret of that name (its
// Created time stays). A new name beyond max secrets of the tenant (max >
// 0) is refused with ErrResourceExhausted. It reports whether the name
// was new.
func (s *Store) PutVaultSecret(ctx context.Context, v VaultSecret, maxCount int) (created bool, err error) {
	if len(v.Sealed) == 0 {
		return false, errors.New("put vault secret: nothing sealed")
	}
	hosts, err := json.Marshal(v.Hosts)
	if err != nil {
		return false, fmt.Errorf("put vault secret: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("put vault secret: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	var exists, n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM vault_secrets WHERE tenant = ? AND name = ?`, v.Tenant, v.Name).Scan(&exists); err != nil {
		return false, fmt.Errorf("put vault secret: %w", err)
	}
	if exists == 0 && maxCount > 0 {
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM vault_secrets WHERE tenant = ?`, v.Tenant).Scan(&n); err != nil {
			return false, fmt.Errorf("put vault secret: %w", err)
		}
		if n >= maxCount {
			return false, fmt.Errorf("%w: the vault holds %d secrets, the most it may (remove one with `airlock secret rm`)", errdefs.ErrResourceExhausted, n)
		}
	}
	now := v.Updated.UnixNano()
	if _, err := tx.ExecContext(ctx, `INSERT INTO vault_secrets(tenant,name,hosts,sealed,created,updated) VALUES(?,?,?,?,?,?)
		ON CONFLICT(tenant,name) DO UPDATE SET hosts=excluded.hosts, sealed=excluded.sealed, updated=excluded.updated`,
		v.Tenant, v.Name, string(hosts), v.Sealed, now, now); err != nil {
		return false, fmt.Errorf("put vault secret: %w", err)
	}
	return exists == 0, tx.Commit()
}

// GetVaultSecret returns tenant's vault secret name with its sealed value,
// or an error wrapping ErrNotFound.
func (s *Store) GetVaultSecret(ctx context.Context, tenant, name string) (VaultSecret, error) {
	v, err := scanVaultSecret(s.db.QueryRowContext(ctx, `SELECT tenant,name,hosts,sealed,created,updated FROM vault_secrets WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%w: no secret %q in the vault (see `airlock secret ls`)", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return v, fmt.Errorf("get vault secret: %w", err)
	}
	return v, nil
}

// ListVaultSecrets returns tenant's vault secrets by name, without their
// sealed values.
func (s *Store) ListVaultSecrets(ctx context.Context, tenant string) ([]VaultSecret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant,name,hosts,x'',created,updated FROM vault_secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list vault secrets: %w", err)
	}
	defer rows.Close()
	var out []VaultSecret
	for rows.Next() {
		v, err := scanVaultSecret(rows)
		if err != nil {
			return nil, fmt.Errorf("list vault secrets: %w", err)
		}
		v.Sealed = nil
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteVaultSecret removes tenant's vault secret name; a missing one is
// ErrNotFound. Sandboxes that were given its value keep it.
func (s *Store) DeleteVaultSecret(ctx context.Context, tenant, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM vault_secrets WHERE tenant = ? AND name = ?`, tenant, name)
	if err != nil {
		return fmt.Errorf("delete vault secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no secret %q in the vault (see `airlock secret ls`)", errdefs.ErrNotFound, name)
	}
	return nil
}

func scanVaultSecret(r scanner) (VaultSecret, error) {
	var v VaultSecret
	var hosts string
	var created, updated int64
	if err := r.Scan(&v.Tenant, &v.Name, &hosts, &v.Sealed, &created, &updated); err != nil {
		return v, err
	}
	_ = json.Unmarshal([]byte(hosts), &v.Hosts)
	v.Created, v.Updated = time.Unix(0, created), time.Unix(0, updated)
	return v, nil
}
