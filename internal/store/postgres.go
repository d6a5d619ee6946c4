package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// IsPostgresURL reports whether a catalog location is a PostgreSQL URL
// rather than a file path.
func IsPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// RedactURL is a catalog location fit for logs and errors: a URL's
// password is replaced by "xxxxx".
func RedactURL(s string) string {
	if !IsPostgresURL(s) {
		return s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "postgres://(a URL that does not parse)"
	}
	return u.Redacted()
}

// OpenPostgres opens (creating the schema if needed) the catalog in the
// PostgreSQL database at dsn, a postgres:// URL in libpq's form
// (sslmode and the other parameters are pgx's). The schema is the SQLite
// catalog's, translated (pgStep); its version is the row of the
// airlock_schema table. Every process that opens a new database at once
// migrates it under the writers' lock, so exactly one of them does.
func OpenPostgres(ctx context.Context, dsn string) (*Store, error) {
	where := RedactURL(dsn)
	if _, err := url.Parse(dsn); err != nil {
		return nil, fmt.Errorf("open catalog %s: the URL does not parse", where)
	}
	sqldb, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open catalog %s: %w", where, redactErr(err, dsn))
	}
	sqldb.SetMaxOpenConns(16)
	sqldb.SetMaxIdleConns(16)
	sqldb.SetConnMaxIdleTime(5 * time.Minute)
	d := &database{sql: sqldb, pg: true}
	if err := pgMigrate(ctx, d); err != nil {
		d.Close()
		return nil, fmt.Errorf("open catalog %s: %w", where, redactErr(err, dsn))
	}
	return &Store{db: d, now: time.Now}, nil
}

// pgMigrate brings the schema to schemaVersion in one transaction.
func pgMigrate(ctx context.Context, d *database) error {
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS airlock_schema (version BIGINT NOT NULL)`); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO airlock_schema(version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM airlock_schema)`); err != nil {
		return err
	}
	var version int
	if err := tx.QueryRowContext(ctx, `SELECT version FROM airlock_schema`).Scan(&version); err != nil {
		return err
	}
	if err := checkVersion(version); err != nil {
		return err
	}
	for ; version < schemaVersion; version++ {
		// A step is several statements and has no arguments: pgx sends it
		// in the simple protocol, which runs them all.
		if _, err := tx.tx.ExecContext(ctx, pgStep(schemaStep(version))); err != nil {
			return fmt.Errorf("migrate catalog to v%d: %w", version+1, err)
		}
	}
	return tx.Commit()
}

// redactErr keeps a DSN's password out of an error that quotes it.
func redactErr(err error, dsn string) error {
	u, perr := url.Parse(dsn)
	if perr != nil || u.User == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}

// pgUsedBytes is what the catalog's rows take on PostgreSQL: the sum of
// the live rows' lengths as text, uncompressed, of the tables that grow
// with use. The tables' sizes on disk are no measure: a deleted row's
// space stays until a vacuum reuses it, and a compressed one depends on
// what the guest wrote. It reads every row (the retention bounds them).
func (s *Store) pgUsedBytes(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT
		(SELECT coalesce(sum(octet_length(t::text)), 0) FROM events t) +
		(SELECT coalesce(sum(octet_length(t::text)), 0) FROM sandboxes t) +
		(SELECT coalesce(sum(octet_length(t::text)), 0) FROM snapshots t) +
		(SELECT coalesce(sum(octet_length(t::text)), 0) FROM refs t)`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("catalog size: %w", err)
	}
	return n, nil
}
