package store

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// The catalog speaks two SQL dialects: SQLite (the single-host default, a
// file in the state dir) and PostgreSQL (a catalog shared by the replicas
// of a cluster's control tier). The store's statements are written once,
// in SQLite's form with ? placeholders; database and tx rebind them for
// PostgreSQL, and the schema steps are translated (pgStep).
//
// Concurrency is the same on both. A SQLite write transaction is
// immediate: it holds the database's write lock from BEGIN, so a
// transaction's reads and the writes it bases on them are atomic. On
// PostgreSQL every transaction, and every write outside one, first takes
// one transaction-scoped advisory lock (pgWriteLock), which serializes the
// writers the same way; reads outside a transaction take nothing.

// pgWriteLock is the advisory lock key of the catalog's writers (any
// 64-bit constant that other users of the same database do not pick).
const pgWriteLock = 0x6169726c6f636b31 // "airlock1"

// database is the catalog's database handle in its dialect.
type database struct {
	sql *sql.DB
	pg  bool
}

// tx is one transaction; on PostgreSQL it holds pgWriteLock.
type tx struct {
	tx *sql.Tx
	pg bool
}

func (d *database) Close() error { return d.sql.Close() }

// BeginTx starts a write transaction (opts is nil at every call site: the
// isolation is the dialect's, see above).
func (d *database) BeginTx(ctx context.Context, opts *sql.TxOptions) (*tx, error) {
	t, err := d.sql.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if d.pg {
		if _, err := t.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgWriteLock)); err != nil {
			_ = t.Rollback()
			return nil, err
		}
	}
	return &tx{tx: t, pg: d.pg}, nil
}

// ExecContext runs one write. On PostgreSQL it runs in a transaction of
// its own that takes the writers' lock.
func (d *database) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if !d.pg {
		return d.sql.ExecContext(ctx, query, args...)
	}
	var res sql.Result
	err := d.inTx(ctx, func(t *tx) (err error) {
		res, err = t.ExecContext(ctx, query, args...)
		return err
	})
	return res, err
}

// inTx runs f in a write transaction and commits it if f succeeds.
func (d *database) inTx(ctx context.Context, f func(*tx) error) error {
	t, err := d.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = t.Rollback() }() // a no-op after Commit
	if err := f(t); err != nil {
		return err
	}
	return t.Commit()
}

func (d *database) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query, args = rebind(d.pg, query, args)
	return d.sql.QueryContext(ctx, query, args...)
}

func (d *database) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	query, args = rebind(d.pg, query, args)
	return d.sql.QueryRowContext(ctx, query, args...)
}

// insertID runs an INSERT into a table whose key column is an
// autoincrementing integer and returns the new row's key.
func (d *database) insertID(ctx context.Context, key, query string, args ...any) (int64, error) {
	if !d.pg {
		res, err := d.sql.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	var id int64
	err := d.inTx(ctx, func(t *tx) error {
		return t.QueryRowContext(ctx, query+` RETURNING `+key, args...).Scan(&id)
	})
	return id, err
}

func (t *tx) Commit() error   { return t.tx.Commit() }
func (t *tx) Rollback() error { return t.tx.Rollback() }

func (t *tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	query, args = rebind(t.pg, query, args)
	return t.tx.ExecContext(ctx, query, args...)
}

func (t *tx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query, args = rebind(t.pg, query, args)
	return t.tx.QueryContext(ctx, query, args...)
}

func (t *tx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	query, args = rebind(t.pg, query, args)
	return t.tx.QueryRowContext(ctx, query, args...)
}

// rebinds caches PostgreSQL forms of the store's statements (a fixed set,
// but for the IN lists some build, which are bounded too).
var rebinds sync.Map // string -> string

// rebind turns a statement's ? placeholders into PostgreSQL's $1, $2, ...
// and its bool arguments into the 0/1 integers the schema stores (SQLite's
// driver does that itself). A ? inside a quoted string is left alone.
func rebind(pg bool, query string, args []any) (string, []any) {
	if !pg {
		return query, args
	}
	copied := false
	for i, a := range args {
		if b, ok := a.(bool); ok {
			if !copied { // the caller's slice stays as it was
				args, copied = append([]any(nil), args...), true
			}
			args[i] = int64(0)
			if b {
				args[i] = int64(1)
			}
		}
	}
	if q, ok := rebinds.Load(query); ok {
		return q.(string), args
	}
	var b strings.Builder
	n, quoted := 0, false
	for _, r := range query {
		switch {
		case r == '\'':
			quoted = !quoted
		case r == '?' && !quoted:
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	rebinds.Store(query, b.String())
	return b.String(), args
}

var (
	pgAutoincrement = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\bINTEGER PRIMARY KEY AUTOINCREMENT\b`) })
	pgInteger       = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\bINTEGER\b`) })
	pgBlob          = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\bBLOB\b`) })
	pgUserVersion   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`PRAGMA user_version = (\d+);`) })
)

// pgStep translates one of the schema's steps (schema, migrations) to
// PostgreSQL: SQLite's INTEGER is 64 bits (BIGINT), an autoincrementing
// key is an identity column, BLOB is BYTEA, and the schema version lives
// in the airlock_schema table instead of SQLite's user_version.
func pgStep(step string) string {
	step = pgAutoincrement().ReplaceAllString(step, "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
	step = pgInteger().ReplaceAllString(step, "BIGINT")
	step = pgBlob().ReplaceAllString(step, "BYTEA")
	return pgUserVersion().ReplaceAllString(step, "UPDATE airlock_schema SET version = $1;")
}
