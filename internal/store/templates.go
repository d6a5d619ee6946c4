package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// Template is a tenant's template built from a Dockerfile: the unlisted
// snapshot its sandboxes start from, what it was built on, and the image
// configuration the Dockerfile left (Config, JSON the control plane
// defines).
type Template struct {
	Tenant   string
	Name     string
	Snapshot string // the snapshot's name (unlisted: it starts with '_'); "" for an image template
	// Runtime is the runtime the template was built on and serves: qemu
	// (a snapshot, memory and disk) or gvisor (an image).
	Runtime string
	// ImageDigest is a gvisor template's image blob ("" for qemu).
	ImageDigest string
	Base        string // the FROM line's image, as resolved
	Config      json.RawMessage
	Steps       int
	BuildMS     int64
	Created     time.Time
}

const templateCols = `tenant,name,snapshot,base,config,steps,build_ms,created,runtime,image_digest`

// PutTemplate records t, replacing the tenant's template of that name. It
// returns the snapshot the replaced one used ("" if the name was new).
func (s *Store) PutTemplate(ctx context.Context, t Template) (old string, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("record template: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	err = tx.QueryRowContext(ctx, `SELECT snapshot FROM templates WHERE tenant = ? AND name = ?`, t.Tenant, t.Name).Scan(&old)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("record template: %w", err)
	}
	cfg := string(t.Config)
	if cfg == "" {
		cfg = "{}"
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO templates(`+templateCols+`) VALUES(?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(tenant,name) DO UPDATE SET snapshot=excluded.snapshot, base=excluded.base, config=excluded.config,
		steps=excluded.steps, build_ms=excluded.build_ms, created=excluded.created, runtime=excluded.runtime,
		image_digest=excluded.image_digest`,
		t.Tenant, t.Name, t.Snapshot, t.Base, cfg, t.Steps, t.BuildMS, t.Created.UnixNano(), cmp.Or(t.Runtime, "qemu"), t.ImageDigest); err != nil {
		return "", fmt.Errorf("record template: %w", err)
	}
	return old, tx.Commit()
}

// GetTemplate returns tenant's template name, or an error wrapping
// ErrNotFound.
func (s *Store) GetTemplate(ctx context.Context, tenant, name string) (Template, error) {
	t, err := scanTemplate(s.db.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE tenant = ? AND name = ?`, tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("%w: no template %q (see `airlock template ls`)", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return t, fmt.Errorf("get template: %w", err)
	}
	return t, nil
}

// ListTemplates returns tenant's templates by name, or with all every
// tenant's.
func (s *Store) ListTemplates(ctx context.Context, tenant string, all bool) ([]Template, error) {
	q, args := `SELECT `+templateCols+` FROM templates WHERE tenant = ? ORDER BY name`, []any{tenant}
	if all {
		q, args = `SELECT `+templateCols+` FROM templates ORDER BY tenant, name`, nil
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	defer rows.Close()
	var out []Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, fmt.Errorf("list templates: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTemplate removes tenant's template name and returns it, or an
// error wrapping ErrNotFound.
func (s *Store) DeleteTemplate(ctx context.Context, tenant, name string) (Template, error) {
	t, err := s.GetTemplate(ctx, tenant, name)
	if err != nil {
		return t, err
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM templates WHERE tenant = ? AND name = ?`, tenant, name); err != nil {
		return t, fmt.Errorf("delete template: %w", err)
	}
	return t, nil
}

// TemplateUsesSnapshot reports whether a template of tenant starts from
// the snapshot called snapshot.
func (s *Store) TemplateUsesSnapshot(ctx context.Context, tenant, snapshot string) (bool, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM templates WHERE tenant = ? AND snapshot = ?`, tenant, snapshot).Scan(&n)
	return n > 0, err
}

func scanTemplate(r scanner) (Template, error) {
	var t Template
	var cfg string
	var created int64
	if err := r.Scan(&t.Tenant, &t.Name, &t.Snapshot, &t.Base, &cfg, &t.Steps, &t.BuildMS, &created, &t.Runtime, &t.ImageDigest); err != nil {
		return t, err
	}
	t.Config = json.RawMessage(cfg)
	t.Created = time.Unix(0, created).UTC()
	return t, nil
}
