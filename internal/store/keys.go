package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

// APIKey is one API key's record. The secret itself is never stored: only
// the SHA-256 of it. Zero limits mean "the server's default".
type APIKey struct {
	ID           string
	Tenant       string
	Admin        bool // sees and acts on every tenant's sandboxes
	Created      time.Time
	Revoked      bool
	MaxSandboxes int
	MaxVCPUs     int
	MaxMemoryMiB int
	MaxDiskMiB   int // sandboxes' disk sizes plus snapshots' bytes
	MaxSnapshots int // named snapshots
	MaxVolumes   int // named volumes
	RatePerMin   int
	// Outbound abuse limits of the tenant's sandboxes (netconf.Spec's
	// ConnRate, DestsPerMin, UDPRate): 0 means the server's default, -1
	// no limit.
	NetConnRate    int
	NetDestsPerMin int
	NetUDPRate     int
}

// Validate checks k's limits; it makes negative network limits -1.
func (k *APIKey) Validate() error { return k.validate() }

// validate checks k's limits; it makes negative network limits -1.
func (k *APIKey) validate() error {
	if k.MaxSandboxes < 0 || k.MaxVCPUs < 0 || k.MaxMemoryMiB < 0 || k.MaxDiskMiB < 0 || k.MaxSnapshots < 0 || k.MaxVolumes < 0 || k.RatePerMin < 0 {
		return fmt.Errorf("%w: key limits must not be negative", errdefs.ErrInvalid)
	}
	for _, v := range []*int{&k.NetConnRate, &k.NetDestsPerMin, &k.NetUDPRate} {
		if *v > maxNetLimit {
			return fmt.Errorf("%w: network limits must be at most %d (or negative: no limit)", errdefs.ErrInvalid, maxNetLimit)
		}
		*v = max(*v, -1)
	}
	return nil
}

// maxNetLimit is netconf.MaxAbuseLimit (the store does not import netconf).
const maxNetLimit = 1 << 16

// ErrBadKey is returned by LookupKey for any key that does not authenticate
// (malformed, unknown, wrong secret or revoked); callers cannot tell which.
var ErrBadKey = errors.New("invalid API key")

var (
	tenantRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`) })
	// Keys made before 2026-11-25: al_<8 base32 id>_<32 base32 secret>.
	keyIDRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z2-7]{8}$`) })
	secretRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z2-7]{32}$`) })
	// Keys made since: e2b_<10 hex id><40 hex secret>, the shape the E2B
	// SDKs up to 2.45 require of a key (/^e2b_[0-9a-f]+$/) before sending it.
	hexKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^e2b_([0-9a-f]{10})([0-9a-f]{40})$`) })
	hexIDRE  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-f]{10}$`) })
)

// ValidKeyID reports whether id has the shape of a key id (either kind).
func ValidKeyID(id string) bool { return keyIDRE().MatchString(id) || hexIDRE().MatchString(id) }

// ValidateTenant checks a tenant name: 1-63 of [a-z0-9_-], starting with a
// letter or digit.
func ValidateTenant(t string) error {
	if !tenantRE().MatchString(t) {
		return fmt.Errorf("%w: tenant must be 1-63 characters of [a-z0-9_-] starting with a letter or digit", errdefs.ErrInvalid)
	}
	return nil
}

func hashSecret(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// CreateKey records a new key for k.Tenant with k's flags and limits and
// returns the record and the key ("e2b_<id><secret>", 10 and 40 hex
// digits: 40 bits of id, 160 of secret), which is shown once: only its
// hash is kept. Keys of the older form "al_<id>_<secret>" still work.
func (s *Store) CreateKey(ctx context.Context, k APIKey) (APIKey, string, error) {
	if err := ValidateTenant(k.Tenant); err != nil {
		return k, "", err
	}
	if err := k.validate(); err != nil {
		return k, "", err
	}
	idb, secb := make([]byte, 5), make([]byte, 20)
	_, _ = rand.Read(idb) // crypto/rand.Read never fails (go1.24)
	_, _ = rand.Read(secb)
	k.ID, k.Revoked = hex.EncodeToString(idb), false
	secret := hex.EncodeToString(secb)
	if k.Created.IsZero() {
		k.Created = time.Now()
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys(id,tenant,hash,admin,created,revoked,max_sandboxes,max_vcpus,max_memory_mb,max_disk_mb,max_snapshots,rate_per_min,max_volumes,net_conn_rate,net_dests_per_min,net_udp_pps)
		VALUES(?,?,?,?,?,0,?,?,?,?,?,?,?,?,?,?)`, k.ID, k.Tenant, hashSecret(secret), k.Admin, k.Created.UnixNano(),
		k.MaxSandboxes, k.MaxVCPUs, k.MaxMemoryMiB, k.MaxDiskMiB, k.MaxSnapshots, k.RatePerMin, k.MaxVolumes, k.NetConnRate, k.NetDestsPerMin, k.NetUDPRate)
	if err != nil {
		return k, "", fmt.Errorf("create key: %w", err)
	}
	return k, "e2b_" + k.ID + secret, nil
}

const keyCols = `id,tenant,hash,admin,created,revoked,max_sandboxes,max_vcpus,max_memory_mb,max_disk_mb,max_snapshots,rate_per_min,max_volumes,net_conn_rate,net_dests_per_min,net_udp_pps`

func scanKey(r scanner) (APIKey, string, error) {
	var k APIKey
	var hash string
	var created int64
	err := r.Scan(&k.ID, &k.Tenant, &hash, &k.Admin, &created, &k.Revoked, &k.MaxSandboxes, &k.MaxVCPUs, &k.MaxMemoryMiB, &k.MaxDiskMiB, &k.MaxSnapshots, &k.RatePerMin, &k.MaxVolumes,
		&k.NetConnRate, &k.NetDestsPerMin, &k.NetUDPRate)
	k.Created = time.Unix(0, created)
	return k, hash, err
}

// ListKeys returns every key (revoked ones too), oldest first.
func (s *Store) ListKeys(ctx context.Context) ([]APIKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyCols+` FROM api_keys ORDER BY created`)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, _, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeKey revokes key id; later lookups of it fail. Revoking twice is fine.
func (s *Store) RevokeKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked=1 WHERE id=?`, id)
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no key %q (see `airlock keys ls`)", errdefs.ErrNotFound, id)
	}
	return nil
}

// UpdateKeyLimits sets the limits of key k.ID to k's (its tenant, admin
// flag and secret stay); they apply to what the key's tenant does from
// then on (sandboxes created since, for the network limits).
func (s *Store) UpdateKeyLimits(ctx context.Context, k APIKey) error {
	if err := k.validate(); err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET max_sandboxes=?,max_vcpus=?,max_memory_mb=?,max_disk_mb=?,max_snapshots=?,rate_per_min=?,max_volumes=?,
		net_conn_rate=?,net_dests_per_min=?,net_udp_pps=? WHERE id=?`,
		k.MaxSandboxes, k.MaxVCPUs, k.MaxMemoryMiB, k.MaxDiskMiB, k.MaxSnapshots, k.RatePerMin, k.MaxVolumes, k.NetConnRate, k.NetDestsPerMin, k.NetUDPRate, k.ID)
	if err != nil {
		return fmt.Errorf("update key: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no key %q (see `airlock keys ls`)", errdefs.ErrNotFound, k.ID)
	}
	return nil
}

// GetKey returns key id's record (revoked ones too), for a holder of a
// session bound to a key id that must re-check it; ErrBadKey if there is
// no such key.
func (s *Store) GetKey(ctx context.Context, id string) (APIKey, error) {
	k, _, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id=?`, id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return APIKey{}, ErrBadKey
	case err != nil:
		return APIKey{}, fmt.Errorf("get key: %w", err)
	}
	return k, nil
}

// dummyHash is compared against when a key id is unknown, so that unknown
// and wrong keys take the same path.
var dummyHash = hashSecret("")

// LookupKey authenticates a full key string and returns its record. Any
// failure (malformed, unknown id, wrong secret, revoked) is ErrBadKey; the
// secret is compared in constant time.
func (s *Store) LookupKey(ctx context.Context, key string) (APIKey, error) {
	var id, secret string
	if m := hexKeyRE().FindStringSubmatch(key); m != nil {
		id, secret = m[1], m[2]
	} else {
		rest, ok := strings.CutPrefix(key, "al_")
		var ok2 bool
		id, secret, ok2 = strings.Cut(rest, "_")
		if !ok || !ok2 || !keyIDRE().MatchString(id) || !secretRE().MatchString(secret) {
			return APIKey{}, ErrBadKey
		}
	}
	k, hash, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id=?`, id))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		subtle.ConstantTimeCompare([]byte(dummyHash), []byte(hashSecret(secret)))
		return APIKey{}, ErrBadKey
	case err != nil:
		return APIKey{}, fmt.Errorf("look up key: %w", err)
	}
	if subtle.ConstantTimeCompare([]byte(hash), []byte(hashSecret(secret))) != 1 || k.Revoked {
		return APIKey{}, ErrBadKey
	}
	return k, nil
}
