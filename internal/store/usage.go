package store

import (
	"context"
	"fmt"
)

// AddTenantEgress adds n bytes to the egress total of tenant's ended shim
// runs (a shim adds its sandbox's count when its network closes).
func (s *Store) AddTenantEgress(ctx context.Context, tenant string, n uint64) error {
	if n == 0 {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO tenant_usage(tenant, egress_bytes) VALUES(?, ?)
		ON CONFLICT(tenant) DO UPDATE SET egress_bytes = tenant_usage.egress_bytes + excluded.egress_bytes`, tenant, int64(min(n, 1<<62)))
	if err != nil {
		return fmt.Errorf("add tenant egress: %w", err)
	}
	return nil
}

// TenantEgress returns every tenant's recorded egress total (ended shim
// runs only: a running sandbox's count is its shim's).
func (s *Store) TenantEgress(ctx context.Context) (map[string]uint64, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant, egress_bytes FROM tenant_usage`)
	if err != nil {
		return nil, fmt.Errorf("tenant egress: %w", err)
	}
	defer rows.Close()
	out := map[string]uint64{}
	for rows.Next() {
		var t string
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			return nil, fmt.Errorf("tenant egress: %w", err)
		}
		out[t] = uint64(max(n, 0))
	}
	return out, rows.Err()
}
