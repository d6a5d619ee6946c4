package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"sync"
)

var secretNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^secret\.[a-z0-9.-]{1,64}$`) })

// Secret returns the catalog's secret name (32 random bytes, made on first
// use and kept): a key that every process of this state dir shares, to
// derive tokens from (E2B's per-sandbox access tokens). Anyone who reads
// the catalog reads it, as they could read the sandboxes themselves. name
// is "secret." and a lower-case word.
func (s *Store) Secret(ctx context.Context, name string) ([]byte, error) {
	if !secretNameRe().MatchString(name) {
		return nil, fmt.Errorf("secret name %q: want secret.<word>", name)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	// The first process to ask makes it; the others read the same value.
	if _, err := s.db.ExecContext(ctx, `INSERT INTO settings(name,value) VALUES(?,?) ON CONFLICT(name) DO NOTHING`, name, hex.EncodeToString(b)); err != nil {
		return nil, fmt.Errorf("make %s: %w", name, err)
	}
	var str string
	if err := s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE name = ?`, name).Scan(&str); err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	v, err := hex.DecodeString(str)
	if err != nil || len(v) < 32 {
		return nil, fmt.Errorf("%s in the catalog is not 32 hex-encoded bytes", name)
	}
	return v, nil
}
