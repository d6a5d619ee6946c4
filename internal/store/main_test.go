package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil/pgtest"
)

// pg is the PostgreSQL server the catalog's tests run on when the tier is
// asked for (AIRLOCK_TEST_POSTGRES=1, `make test-postgres`); nil: SQLite.
var pg *pgtest.Server

func TestMain(m *testing.M) {
	if !pgtest.Enabled() {
		os.Exit(m.Run())
	}
	var err error
	if pg, err = pgtest.Start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	pg.Stop()
	os.Exit(code)
}

// catalogAt is where a test's new catalog lives: a file in a temporary
// directory, or a new database on the tier's PostgreSQL server.
func catalogAt(t testing.TB) string {
	t.Helper()
	if pg == nil {
		return filepath.Join(t.TempDir(), "catalog.db")
	}
	u, err := pg.Database(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// sqliteOnly marks a test about the SQLite file itself (its migrations
// from old versions, several processes on one file): on the PostgreSQL
// tier it does not run, and says so.
func sqliteOnly(t *testing.T) {
	t.Helper()
	if pg != nil {
		t.Skip("about the SQLite catalog file; this run is the PostgreSQL tier")
	}
}
