// Package store is airlock's catalog: one SQLite database (modernc.org/sqlite,
// no cgo) in the state dir, shared by the CLI and every shim, or a
// PostgreSQL database (pgx) shared by several processes on several hosts
// (postgres.go). It records images (name -> content digest) and sandboxes
// with their lifecycle state, API keys, the audit trail and the rest.
//
// Concurrency: many processes open the same catalog; on SQLite, WAL mode
// and a busy timeout make that safe (on PostgreSQL, see dialect.go). Every
// write is a single statement or a short transaction.
package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/netconf"
)

// State is a sandbox lifecycle state.
type State string

// Lifecycle states (DESIGN.md: creating, running, paused, stopped, failed).
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StateStopping State = "stopping"
	StateFailed   State = "failed"
	// StatePausing: the shim is saving the guest to disk.
	StatePausing State = "pausing"
	// StatePaused: memory, devices and disk are on disk; no process runs.
	StatePaused State = "paused"
	// StateResuming: a shim is restoring a paused sandbox.
	StateResuming State = "resuming"
)

// Sandbox is one catalog row.
type Sandbox struct {
	ID          string
	State       State
	Reason      string // why it failed, one line
	Image       string // image name as asked
	ImageDigest string
	CPUs        int
	MemoryMiB   int
	DiskMiB     int
	TimeoutSec  int
	CreatedAt   time.Time
	ExpiresAt   time.Time
	Accel       string // "kvm" or "tcg", set by the shim
	Kernel      string // guest kernel release
	StartMode   string // "template", "cold", "restore" or "gvisor"
	Metadata    map[string]string
	Tenant      string            // owner ("" for local CLI use)
	Env         map[string]string // default environment of every exec
	// Network is the egress policy, secrets (names, hosts, placeholders;
	// never values), published ports and limits.
	Network netconf.Spec
	// IdlePause pauses the sandbox after this long without activity (0:
	// never).
	IdlePause time.Duration
	// LifetimeLeft is the running time left when the sandbox was paused;
	// a resume sets ExpiresAt to now plus it.
	LifetimeLeft time.Duration
	// PausedAt is when it was last paused (zero if never).
	PausedAt time.Time
	// Source says where the sandbox came from: "" (its image), or
	// "snapshot:<name>" / "fork:<sandbox id>".
	Source string
	// Runtime runs it: "qemu" or "gvisor" (rows from before schema 5 are
	// qemu). Chosen at create, kept for its lifetime.
	Runtime string
	// Gen is the owner generation (see Transition): 1 at create, one more
	// at each resume.
	Gen int64
	// Mounts are its volumes and host directories, fixed at create.
	Mounts []Mount
	// ExecDefaults are the working directory and user of an exec that
	// names none (a template's WORKDIR and USER).
	ExecDefaults ExecDefaults
}

// ExecDefaults are what an exec that does not say runs in and as.
type ExecDefaults struct {
	Cwd  string `json:"cwd,omitempty"`
	User string `json:"user,omitempty"`
}

func (d ExecDefaults) json() string {
	b, _ := json.Marshal(d)
	return string(b)
}

// PauseView is how views show sb's pause state: when it was last paused
// (nil if never), and while it is paused the running time it has left in
// seconds (nil otherwise).
func (sb Sandbox) PauseView() (pausedAt *time.Time, lifetimeLeftS *int64) {
	if !sb.PausedAt.IsZero() {
		t := sb.PausedAt.UTC()
		pausedAt = &t
	}
	if sb.State == StatePaused {
		left := int64(sb.LifetimeLeft / time.Second)
		lifetimeLeftS = &left
	}
	return pausedAt, lifetimeLeftS
}

// ImageRecord maps an image name to its content-addressed blob.
type ImageRecord struct {
	Name    string
	Digest  string
	Size    int64
	Created time.Time
	Source  string
}

// Store is the catalog. Safe for concurrent use.
type Store struct {
	db *database
	// sandboxReads counts GetSandbox calls (SandboxReads).
	sandboxReads atomic.Int64
	// appends counts AppendEvent calls; every pruneEvery-th prunes.
	appends atomic.Int64
	// now is the clock retention reads (tests set it).
	now func() time.Time
}

// SandboxReads reports how many times GetSandbox read a sandbox's row
// (tests and benchmarks check how often a path reads the catalog).
func (s *Store) SandboxReads() int64 { return s.sandboxReads.Load() }

const schema = `
CREATE TABLE IF NOT EXISTS images (
	name TEXT PRIMARY KEY,
	digest TEXT NOT NULL,
	size INTEGER NOT NULL,
	created INTEGER NOT NULL,
	source TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sandboxes (
	id TEXT PRIMARY KEY,
	state TEXT NOT NULL,
	reason TEXT NOT NULL DEFAULT '',
	image TEXT NOT NULL,
	image_digest TEXT NOT NULL,
	cpus INTEGER NOT NULL,
	memory_mib INTEGER NOT NULL,
	disk_mib INTEGER NOT NULL,
	timeout_s INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL,
	accel TEXT NOT NULL DEFAULT '',
	kernel TEXT NOT NULL DEFAULT '',
	start_mode TEXT NOT NULL DEFAULT '',
	metadata TEXT NOT NULL DEFAULT '{}'
);
PRAGMA user_version = 1;
`

// migrations[i] moves the schema from version i+1 to i+2.
var migrations = []string{
	// v2: tenants (API keys with limits), the audit trail, sandbox owner and
	// default exec environment.
	`ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN env TEXT NOT NULL DEFAULT '{}';
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		tenant TEXT NOT NULL,
		hash TEXT NOT NULL,
		admin INTEGER NOT NULL DEFAULT 0,
		created INTEGER NOT NULL,
		revoked INTEGER NOT NULL DEFAULT 0,
		max_sandboxes INTEGER NOT NULL DEFAULT 0,
		max_vcpus INTEGER NOT NULL DEFAULT 0,
		max_memory_mb INTEGER NOT NULL DEFAULT 0,
		rate_per_min INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE events (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		time INTEGER NOT NULL,
		tenant TEXT NOT NULL,
		key_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		action TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT '{}'
	);
	CREATE INDEX events_sandbox ON events(sandbox_id, seq);
	CREATE INDEX events_tenant ON events(tenant, seq);
	PRAGMA user_version = 2;`,
	// v3: the network configuration.
	`ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{}';
	PRAGMA user_version = 3;`,
	// v4: pause/resume and snapshots.
	`ALTER TABLE sandboxes ADD COLUMN idle_pause_ms INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN lifetime_left_ms INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN paused_at INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN source TEXT NOT NULL DEFAULT '';
	CREATE TABLE snapshots (
		tenant TEXT NOT NULL,
		name TEXT NOT NULL,
		id TEXT NOT NULL UNIQUE,
		sandbox_id TEXT NOT NULL,
		image TEXT NOT NULL,
		image_digest TEXT NOT NULL,
		cpus INTEGER NOT NULL,
		memory_mib INTEGER NOT NULL,
		disk_mib INTEGER NOT NULL,
		network TEXT NOT NULL DEFAULT '{}',
		env TEXT NOT NULL DEFAULT '{}',
		size INTEGER NOT NULL,
		created INTEGER NOT NULL,
		PRIMARY KEY (tenant, name)
	);
	PRAGMA user_version = 4;`,
	`ALTER TABLE sandboxes ADD COLUMN runtime TEXT NOT NULL DEFAULT 'qemu';
	PRAGMA user_version = 5;`,
	// v6: owner generations (Transition) and disk references as rows
	// (refs.go; the ref files of older versions are imported after it).
	`ALTER TABLE sandboxes ADD COLUMN gen INTEGER NOT NULL DEFAULT 1;
	CREATE TABLE refs (
		holder_kind TEXT NOT NULL,
		holder_id TEXT NOT NULL,
		role TEXT NOT NULL,
		target_kind TEXT NOT NULL,
		target_id TEXT NOT NULL,
		PRIMARY KEY (holder_kind, holder_id, role, target_kind, target_id)
	);
	CREATE INDEX refs_target ON refs(target_kind, target_id);
	PRAGMA user_version = 6;`,
	// v7: catalog-wide settings (the audit retention, retention.go).
	`CREATE TABLE settings (
		name TEXT PRIMARY KEY,
		value TEXT NOT NULL
	);
	PRAGMA user_version = 7;`,
	// v8: a tenant's disk quota.
	`ALTER TABLE api_keys ADD COLUMN max_disk_mb INTEGER NOT NULL DEFAULT 0;
	PRAGMA user_version = 8;`,
	// v9: a tenant's snapshot count quota.
	`ALTER TABLE api_keys ADD COLUMN max_snapshots INTEGER NOT NULL DEFAULT 0;
	PRAGMA user_version = 9;`,
	// v10: volumes, the sandboxes that mount them, and a tenant's volume
	// count quota.
	`CREATE TABLE volumes (
		id TEXT PRIMARY KEY,
		tenant TEXT NOT NULL,
		name TEXT NOT NULL,
		size_mib INTEGER NOT NULL,
		created INTEGER NOT NULL,
		guest_written INTEGER NOT NULL DEFAULT 0,
		UNIQUE (tenant, name)
	);
	CREATE TABLE volume_mounts (
		volume_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		path TEXT NOT NULL,
		read_only INTEGER NOT NULL,
		PRIMARY KEY (sandbox_id, path)
	);
	CREATE INDEX volume_mounts_volume ON volume_mounts(volume_id);
	ALTER TABLE sandboxes ADD COLUMN mounts TEXT NOT NULL DEFAULT '[]';
	ALTER TABLE api_keys ADD COLUMN max_volumes INTEGER NOT NULL DEFAULT 0;
	PRAGMA user_version = 10;`,
	// v11: a tenant's outbound abuse limits (0: the server's default, -1:
	// none) and the egress bytes of its sandboxes' ended shim runs.
	`ALTER TABLE api_keys ADD COLUMN net_conn_rate INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE api_keys ADD COLUMN net_dests_per_min INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE api_keys ADD COLUMN net_udp_pps INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE tenant_usage (
		tenant TEXT PRIMARY KEY,
		egress_bytes INTEGER NOT NULL DEFAULT 0
	);
	PRAGMA user_version = 11;`,
	// v12: the tenants' vaults of host-side secrets (vault.go): values
	// sealed by the control plane, never in clear.
	`CREATE TABLE vault_secrets (
		tenant TEXT NOT NULL,
		name TEXT NOT NULL,
		hosts TEXT NOT NULL DEFAULT '[]',
		sealed BLOB NOT NULL,
		created INTEGER NOT NULL,
		updated INTEGER NOT NULL,
		PRIMARY KEY (tenant, name)
	);
	PRAGMA user_version = 12;`,
	// v13: templates built from Dockerfiles (templates.go), and the exec
	// defaults (working directory, user) a sandbox and a snapshot carry
	// from a template.
	`CREATE TABLE templates (
		tenant TEXT NOT NULL,
		name TEXT NOT NULL,
		snapshot TEXT NOT NULL,
		base TEXT NOT NULL,
		config TEXT NOT NULL DEFAULT '{}',
		steps INTEGER NOT NULL,
		build_ms INTEGER NOT NULL,
		created INTEGER NOT NULL,
		PRIMARY KEY (tenant, name)
	);
	ALTER TABLE sandboxes ADD COLUMN exec_defaults TEXT NOT NULL DEFAULT '{}';
	ALTER TABLE snapshots ADD COLUMN exec_defaults TEXT NOT NULL DEFAULT '{}';
	PRAGMA user_version = 13;`,
	// v14: templates built on gVisor are images, not snapshots: the
	// runtime a template was built for, and its image blob's digest.
	`ALTER TABLE templates ADD COLUMN runtime TEXT NOT NULL DEFAULT 'qemu';
	ALTER TABLE templates ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';
	PRAGMA user_version = 14;`,
	// v15: a cluster's control tier (placements.go): which node runs
	// each sandbox, and what it holds of its tenant's quotas.
	`CREATE TABLE placements (
		id TEXT PRIMARY KEY,
		sandbox_id TEXT UNIQUE,
		tenant TEXT NOT NULL,
		node TEXT NOT NULL,
		cpus INTEGER NOT NULL,
		memory_mib INTEGER NOT NULL,
		state TEXT NOT NULL,
		reason TEXT NOT NULL DEFAULT '',
		created INTEGER NOT NULL
	);
	CREATE INDEX placements_tenant ON placements(tenant);
	CREATE INDEX placements_node ON placements(node);
	PRAGMA user_version = 15;`,
	// v16: the bundle a paused sandbox's node wrote, so that another node
	// resumes it if its own is lost.
	`ALTER TABLE placements ADD COLUMN bundle_digest TEXT NOT NULL DEFAULT '';
	ALTER TABLE placements ADD COLUMN bundle_bytes INTEGER NOT NULL DEFAULT 0;
	PRAGMA user_version = 16;`,
	// v17: the runtime and architecture of the node a sandbox was placed
	// on, so that a lost node's sandbox moves to a node that can import its
	// bundle ('' in rows written before: any).
	`ALTER TABLE placements ADD COLUMN runtime TEXT NOT NULL DEFAULT '';
	ALTER TABLE placements ADD COLUMN arch TEXT NOT NULL DEFAULT '';
	PRAGMA user_version = 17;`,
}

// schemaVersion is the version this build writes.
const schemaVersion = 17

// Open opens (creating if needed) the catalog at path: a SQLite file, or
// a PostgreSQL database when path is a postgres:// or postgresql:// URL
// (see OpenPostgres).
func Open(ctx context.Context, path string) (*Store, error) {
	if IsPostgresURL(path) {
		return OpenPostgres(ctx, path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("open catalog: %w", err)
	}
	dsn := "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	sqldb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open catalog: %w", err)
	}
	sqldb.SetMaxOpenConns(4)
	d := &database{sql: sqldb}
	version, err := firstQuery(ctx, sqldb)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("open catalog %s: %w", path, err)
	}
	if err := checkVersion(version); err != nil {
		d.Close()
		return nil, err
	}
	// Version 0 -> 1 is the base schema; like every step it runs in an
	// immediate transaction that re-checks the version, so processes
	// opening a new catalog at once cannot reset a migrated one to v1.
	for ; version < schemaVersion; version++ {
		if err := migrate(ctx, d, filepath.Dir(path), version); err != nil {
			d.Close()
			return nil, err
		}
	}
	_ = os.Chmod(path, 0o600)
	return &Store{db: d, now: time.Now}, nil
}

func checkVersion(version int) error {
	if version > schemaVersion {
		return fmt.Errorf("%w: catalog schema version %d is newer than this airlock (%d)", errdefs.ErrFailedPrecondition, version, schemaVersion)
	}
	return nil
}

// firstQuery reads the schema version on the catalog's first connection.
// Opening it applies the DSN's pragmas, and switching a new database to
// WAL takes an exclusive lock for which SQLite does not always wait on the
// busy handler: processes opening a new catalog at once can get
// SQLITE_BUSY here (TestConcurrentProcessesShareCatalog under load). That
// one is retried, with a short backoff, for up to the busy timeout.
func firstQuery(ctx context.Context, db *sql.DB) (int, error) {
	deadline := time.Now().Add(10 * time.Second)
	wait := 5 * time.Millisecond
	for {
		var version int
		err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version)
		var se interface{ Code() int }
		if err == nil || !errors.As(err, &se) || se.Code()&0xff != sqliteBusy || time.Now().After(deadline) {
			return version, err
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// sqliteBusy is SQLite's primary result code SQLITE_BUSY.
const sqliteBusy = 5

// migrate runs migration from -> from+1 in one transaction; a concurrent
// process that migrated first makes it a no-op.
// stateDir is the catalog's directory (the state dir), for steps that
// import files.
func migrate(ctx context.Context, d *database, stateDir string, from int) error {
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate catalog: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // sql.ErrTxDone after Commit
	var v int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("migrate catalog: %w", err)
	}
	if v != from {
		return nil
	}
	if _, err := tx.ExecContext(ctx, schemaStep(from)); err != nil {
		return fmt.Errorf("migrate catalog to v%d: %w", from+1, err)
	}
	if from+1 == 6 {
		if err := importRefFiles(ctx, tx, stateDir); err != nil {
			return fmt.Errorf("migrate catalog to v6: %w", err)
		}
	}
	return tx.Commit()
}

// schemaStep is the step from version from to from+1.
func schemaStep(from int) string {
	if from == 0 {
		return schema
	}
	return migrations[from-1]
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// PutImage inserts or replaces an image name.
func (s *Store) PutImage(ctx context.Context, r ImageRecord) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO images(name,digest,size,created,source) VALUES(?,?,?,?,?)
		ON CONFLICT(name) DO UPDATE SET digest=excluded.digest,size=excluded.size,created=excluded.created,source=excluded.source`,
		r.Name, r.Digest, r.Size, r.Created.UnixNano(), r.Source)
	if err != nil {
		return fmt.Errorf("put image %q: %w", r.Name, err)
	}
	return nil
}

// GetImage returns the image called name, or an error wrapping ErrNotFound.
func (s *Store) GetImage(ctx context.Context, name string) (ImageRecord, error) {
	var r ImageRecord
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT name,digest,size,created,source FROM images WHERE name=?`, name).
		Scan(&r.Name, &r.Digest, &r.Size, &created, &r.Source)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("%w: image %q", errdefs.ErrNotFound, name)
	}
	if err != nil {
		return r, fmt.Errorf("get image %q: %w", name, err)
	}
	r.Created = time.Unix(0, created)
	return r, nil
}

// ListImages returns all images by name.
func (s *Store) ListImages(ctx context.Context) ([]ImageRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name,digest,size,created,source FROM images ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	defer rows.Close()
	var out []ImageRecord
	for rows.Next() {
		var r ImageRecord
		var created int64
		if err := rows.Scan(&r.Name, &r.Digest, &r.Size, &created, &r.Source); err != nil {
			return nil, fmt.Errorf("list images: %w", err)
		}
		r.Created = time.Unix(0, created)
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteImage removes an image name (not its blob).
func (s *Store) DeleteImage(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM images WHERE name=?`, name)
	if err != nil {
		return fmt.Errorf("delete image %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: image %q", errdefs.ErrNotFound, name)
	}
	return nil
}

const sandboxCols = `id,state,reason,image,image_digest,cpus,memory_mib,disk_mib,timeout_s,created_at,expires_at,accel,kernel,start_mode,metadata,tenant,env,network,idle_pause_ms,lifetime_left_ms,paused_at,source,runtime,gen,mounts,exec_defaults`

// CreateSandbox inserts a new sandbox row, owned by generation 1. Its
// state is sb.State: StateCreating for a new sandbox (other states are for
// tests and imports); Transition changes it from then on.
func (s *Store) CreateSandbox(ctx context.Context, sb Sandbox) error {
	md, err := json.Marshal(sb.Metadata)
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	env, err := json.Marshal(sb.Env)
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	network, err := json.Marshal(sb.Network)
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	if sb.Mounts == nil {
		sb.Mounts = []Mount{}
	}
	mounts, err := json.Marshal(sb.Mounts)
	if err != nil {
		return fmt.Errorf("create sandbox: %w", err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,1,?,?)`,
		sb.ID, string(sb.State), sb.Reason, sb.Image, sb.ImageDigest, sb.CPUs, sb.MemoryMiB, sb.DiskMiB, sb.TimeoutSec,
		sb.CreatedAt.UnixNano(), sb.ExpiresAt.UnixNano(), sb.Accel, sb.Kernel, sb.StartMode, string(md), sb.Tenant, string(env), string(network),
		sb.IdlePause.Milliseconds(), sb.LifetimeLeft.Milliseconds(), unixNano(sb.PausedAt), sb.Source, cmp.Or(sb.Runtime, "qemu"), string(mounts), sb.ExecDefaults.json())
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	if err := attachVolumes(ctx, tx, sb); err != nil {
		return err
	}
	return tx.Commit()
}

type scanner interface{ Scan(...any) error }

func scanSandbox(r scanner) (Sandbox, error) {
	var sb Sandbox
	var state, md, env, network, mounts, defaults string
	var created, expires, idle, left, paused int64
	err := r.Scan(&sb.ID, &state, &sb.Reason, &sb.Image, &sb.ImageDigest, &sb.CPUs, &sb.MemoryMiB, &sb.DiskMiB,
		&sb.TimeoutSec, &created, &expires, &sb.Accel, &sb.Kernel, &sb.StartMode, &md, &sb.Tenant, &env, &network,
		&idle, &left, &paused, &sb.Source, &sb.Runtime, &sb.Gen, &mounts, &defaults)
	if err != nil {
		return sb, err
	}
	_ = json.Unmarshal([]byte(defaults), &sb.ExecDefaults)
	sb.State = State(state)
	sb.CreatedAt, sb.ExpiresAt = time.Unix(0, created), time.Unix(0, expires)
	sb.IdlePause, sb.LifetimeLeft = time.Duration(idle)*time.Millisecond, time.Duration(left)*time.Millisecond
	if paused != 0 {
		sb.PausedAt = time.Unix(0, paused)
	}
	_ = json.Unmarshal([]byte(md), &sb.Metadata)
	_ = json.Unmarshal([]byte(env), &sb.Env)
	_ = json.Unmarshal([]byte(network), &sb.Network)
	_ = json.Unmarshal([]byte(mounts), &sb.Mounts)
	return sb, nil
}

// GetSandbox returns one sandbox, or an error wrapping ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	s.sandboxReads.Add(1)
	sb, err := scanSandbox(s.db.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return sb, fmt.Errorf("%w: no sandbox %q (see `airlock ls`)", errdefs.ErrNotFound, id)
	}
	if err != nil {
		return sb, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes returns all sandboxes, oldest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY created_at`)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// SetRuntimeInfo records what the shim learned while starting the sandbox.
func (s *Store) SetRuntimeInfo(ctx context.Context, id, accel, kernel, startMode string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET accel=?, kernel=?, start_mode=? WHERE id=?`, accel, kernel, startMode, id)
	if err != nil {
		return fmt.Errorf("set sandbox %s runtime info: %w", id, err)
	}
	return nil
}

// DeleteSandbox removes a sandbox row and the disk references it holds
// (Collect may then free what they kept). Deleting a missing row is not an
// error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id=?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM refs WHERE holder_kind = ? AND holder_id = ?`, string(KindSandbox), id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM volume_mounts WHERE sandbox_id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return tx.Commit()
}

// SetLifetimeLeft sets the running time a paused sandbox has left; it
// reports false (and changes nothing) if the sandbox is not paused.
func (s *Store) SetLifetimeLeft(ctx context.Context, id string, left time.Duration) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET lifetime_left_ms = ? WHERE id = ? AND state = ?`, left.Milliseconds(), id, string(StatePaused))
	if err != nil {
		return false, fmt.Errorf("set lifetime %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// SetNetwork replaces a sandbox's network spec (the shim records the host
// ports it chose for published ports).
func (s *Store) SetNetwork(ctx context.Context, id string, n netconf.Spec) error {
	b, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("set network: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET network = ? WHERE id = ?`, string(b), id); err != nil {
		return fmt.Errorf("set network %s: %w", id, err)
	}
	return nil
}

// SetExpiry moves a sandbox's end of life; the shim watches it.
func (s *Store) SetExpiry(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET expires_at=? WHERE id=?`, at.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("set sandbox %s expiry: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, id)
	}
	return nil
}

// Claim is what a create sets on the warm pool's sandbox it takes: the
// creator's tenant and everything of its request that a running sandbox
// can still take (ClaimSandbox).
type Claim struct {
	Tenant    string
	Metadata  map[string]string
	Env       map[string]string
	Network   netconf.Spec
	IdlePause time.Duration
	Timeout   time.Duration
	Source    string
	At        time.Time // its creation time from now on
}

// ClaimSandbox gives running sandbox id, owned by tenant from (a warm
// pool's), to c.Tenant with c's settings, in one statement: of two claims
// one wins, and the other gets ErrConflict, as does a sandbox that is no
// longer running or no longer from's.
func (s *Store) ClaimSandbox(ctx context.Context, id, from string, c Claim) (Sandbox, error) {
	md, err := json.Marshal(c.Metadata)
	if err != nil {
		return Sandbox{}, fmt.Errorf("claim sandbox: %w", err)
	}
	env, err := json.Marshal(c.Env)
	if err != nil {
		return Sandbox{}, fmt.Errorf("claim sandbox: %w", err)
	}
	network, err := json.Marshal(c.Network)
	if err != nil {
		return Sandbox{}, fmt.Errorf("claim sandbox: %w", err)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET tenant=?, metadata=?, env=?, network=?, idle_pause_ms=?, timeout_s=?, created_at=?, expires_at=?, source=?
		WHERE id=? AND tenant=? AND state=?`,
		c.Tenant, string(md), string(env), string(network), c.IdlePause.Milliseconds(), int(c.Timeout/time.Second), c.At.UnixNano(), c.At.Add(c.Timeout).UnixNano(), c.Source,
		id, from, string(StateRunning))
	if err != nil {
		return Sandbox{}, fmt.Errorf("claim sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Sandbox{}, fmt.Errorf("%w: sandbox %s is no longer a running sandbox of %q", errdefs.ErrConflict, id, from)
	}
	return s.GetSandbox(ctx, id)
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// SetNetworkEnv replaces a sandbox's network spec and default environment
// together (a live change of its secrets: their placeholders are in the
// environment).
func (s *Store) SetNetworkEnv(ctx context.Context, id string, n netconf.Spec, env map[string]string) error {
	nb, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("set network: %w", err)
	}
	eb, err := json.Marshal(env)
	if err != nil {
		return fmt.Errorf("set network: %w", err)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET network = ?, env = ? WHERE id = ?`, string(nb), string(eb), id)
	if err != nil {
		return fmt.Errorf("set network %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no sandbox %q", errdefs.ErrNotFound, id)
	}
	return nil
}
