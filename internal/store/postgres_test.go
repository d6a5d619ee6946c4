package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// TestPostgresErrorsHideThePassword: a catalog URL's password never
// reaches an error (they end up in logs), and an unreachable server is a
// clear error, not a hang. Port 1 on loopback has no listener.
func TestPostgresErrorsHideThePassword(t *testing.T) {
	_, err := Open(t.Context(), "postgres://airlock:hunter2secret@127.0.0.1:1/catalog?sslmode=disable&connect_timeout=5")
	if err == nil {
		t.Fatal("opened a catalog on a port with no server")
	}
	if strings.Contains(err.Error(), "hunter2secret") {
		t.Fatalf("the password is in the error: %v", err)
	}
	if !strings.Contains(err.Error(), "127.0.0.1") || !strings.Contains(err.Error(), "open catalog") {
		t.Fatalf("the error does not say which catalog: %v", err)
	}
	if got := RedactURL("postgresql://u:pw@h/db"); strings.Contains(got, "pw") || !strings.Contains(got, "u:") {
		t.Fatalf("RedactURL = %q", got)
	}
	if got := RedactURL("/var/lib/airlock/catalog.db"); got != "/var/lib/airlock/catalog.db" {
		t.Fatalf("RedactURL(path) = %q", got)
	}
}

// TestPostgresRefusesANewerSchema: a catalog migrated by a newer airlock
// is refused, not written with an older schema's assumptions.
func TestPostgresRefusesANewerSchema(t *testing.T) {
	if pg == nil {
		t.Skip("needs the PostgreSQL tier (make test-postgres)")
	}
	ctx := t.Context()
	at := catalogAt(t)
	s, err := Open(ctx, at)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE airlock_schema SET version = ?`, schemaVersion+1); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, at); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("a newer schema: %v", err)
	}
}

func TestRebind(t *testing.T) {
	q, args := rebind(true, `SELECT a FROM t WHERE b = ? AND c = '?' AND d IN (?,?)`, []any{true, "x", false})
	if q != `SELECT a FROM t WHERE b = $1 AND c = '?' AND d IN ($2,$3)` {
		t.Fatalf("rebind: %s", q)
	}
	if args[0] != int64(1) || args[1] != "x" || args[2] != int64(0) {
		t.Fatalf("args: %#v", args)
	}
	in := []any{true}
	rebind(true, `?`, in)
	if in[0] != true {
		t.Fatal("rebind changed the caller's arguments")
	}
	if q, _ := rebind(false, `a = ?`, nil); q != `a = ?` {
		t.Fatalf("sqlite rebind: %s", q)
	}
}
