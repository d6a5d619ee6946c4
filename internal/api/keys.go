package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// KeyUpdater is an optional ability of Config.Keys: an admin changes a
// key's limits through the API (PATCH /v1/keys/{key_id}), as `airlock keys
// update` does on the host. Without it the route answers 503.
type KeyUpdater interface {
	GetKey(ctx context.Context, id string) (store.APIKey, error)
	UpdateKeyLimits(ctx context.Context, k store.APIKey) error
}

var _ KeyUpdater = (*store.Store)(nil)

var (
	errKeysNeedAdmin = &Error{http.StatusForbidden, "permission_denied", "keys are managed with an admin key"}
	errNoKeyAdmin    = &Error{http.StatusServiceUnavailable, "unavailable", "this server does not manage keys through the API"}
	errNoKey         = &Error{http.StatusNotFound, "not_found", "no such key"}
)

// keyInfo is a key as the API shows it: never its secret or hash. Limits
// of 0 are the server's defaults; a network limit of -1 is none.
type keyInfo struct {
	ID             string    `json:"id"`
	Tenant         string    `json:"tenant"`
	Admin          bool      `json:"admin"`
	Revoked        bool      `json:"revoked"`
	Created        time.Time `json:"created"`
	MaxSandboxes   int       `json:"max_sandboxes"`
	MaxVCPUs       int       `json:"max_vcpus"`
	MaxMemoryMiB   int       `json:"max_memory_mb"`
	MaxDiskMiB     int       `json:"max_disk_mb"`
	MaxSnapshots   int       `json:"max_snapshots"`
	MaxVolumes     int       `json:"max_volumes"`
	RatePerMin     int       `json:"rate_per_min"`
	NetConnRate    int       `json:"net_conn_rate"`
	NetDestsPerMin int       `json:"net_dests_per_min"`
	NetUDPRate     int       `json:"net_udp_pps"`
}

func toKeyInfo(k store.APIKey) keyInfo {
	return keyInfo{ID: k.ID, Tenant: k.Tenant, Admin: k.Admin, Revoked: k.Revoked, Created: k.Created.UTC(),
		MaxSandboxes: k.MaxSandboxes, MaxVCPUs: k.MaxVCPUs, MaxMemoryMiB: k.MaxMemoryMiB, MaxDiskMiB: k.MaxDiskMiB,
		MaxSnapshots: k.MaxSnapshots, MaxVolumes: k.MaxVolumes, RatePerMin: k.RatePerMin,
		NetConnRate: k.NetConnRate, NetDestsPerMin: k.NetDestsPerMin, NetUDPRate: k.NetUDPRate}
}

// listKeys answers every key (GET /v1/keys): admin keys only.
func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	if !callerOf(r).Admin {
		s.fail(w, r, errKeysNeedAdmin)
		return
	}
	kl, ok := s.cfg.Keys.(KeyLister)
	if !ok {
		s.fail(w, r, errNoKeyAdmin)
		return
	}
	keys, err := kl.ListKeys(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]keyInfo, 0, len(keys))
	for _, k := range keys {
		out = append(out, toKeyInfo(k))
	}
	writeJSON(w, http.StatusOK, map[string][]keyInfo{"keys": out})
}

// updateKey changes the limits a request names (PATCH /v1/keys/{key_id}; the
// others stay): admin keys only, audited as key.update. The network
// limits apply to the sandboxes the key's tenant creates from then on.
func (s *Server) updateKey(w http.ResponseWriter, r *http.Request) {
	if !callerOf(r).Admin {
		s.fail(w, r, errKeysNeedAdmin)
		return
	}
	ku, ok := s.cfg.Keys.(KeyUpdater)
	if !ok {
		s.fail(w, r, errNoKeyAdmin)
		return
	}
	var req struct {
		MaxSandboxes   *int `json:"max_sandboxes"`
		MaxVCPUs       *int `json:"max_vcpus"`
		MaxMemoryMiB   *int `json:"max_memory_mb"`
		MaxDiskMiB     *int `json:"max_disk_mb"`
		MaxSnapshots   *int `json:"max_snapshots"`
		MaxVolumes     *int `json:"max_volumes"`
		RatePerMin     *int `json:"rate_per_min"`
		NetConnRate    *int `json:"net_conn_rate"`
		NetDestsPerMin *int `json:"net_dests_per_min"`
		NetUDPRate     *int `json:"net_udp_pps"`
	}
	if err := decodeJSON(w, r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	k, err := ku.GetKey(r.Context(), r.PathValue("key_id"))
	if errors.Is(err, store.ErrBadKey) {
		s.fail(w, r, errNoKey)
		return
	} else if err != nil {
		s.fail(w, r, err)
		return
	}
	changed := map[string]any{}
	for _, f := range []struct {
		name string
		from *int
		to   *int
	}{
		{"max_sandboxes", req.MaxSandboxes, &k.MaxSandboxes}, {"max_vcpus", req.MaxVCPUs, &k.MaxVCPUs},
		{"max_memory_mb", req.MaxMemoryMiB, &k.MaxMemoryMiB}, {"max_disk_mb", req.MaxDiskMiB, &k.MaxDiskMiB},
		{"max_snapshots", req.MaxSnapshots, &k.MaxSnapshots}, {"max_volumes", req.MaxVolumes, &k.MaxVolumes},
		{"rate_per_min", req.RatePerMin, &k.RatePerMin}, {"net_conn_rate", req.NetConnRate, &k.NetConnRate},
		{"net_dests_per_min", req.NetDestsPerMin, &k.NetDestsPerMin}, {"net_udp_pps", req.NetUDPRate, &k.NetUDPRate},
	} {
		if f.from != nil {
			*f.to = *f.from
			changed[f.name] = *f.from
		}
	}
	if err := ku.UpdateKeyLimits(context.WithoutCancel(r.Context()), k); err != nil {
		s.fail(w, r, err)
		return
	}
	k, err = ku.GetKey(r.Context(), k.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	changed["key_id"], changed["tenant"] = k.ID, k.Tenant
	s.audit(r, "", "key.update", changed)
	writeJSON(w, http.StatusOK, toKeyInfo(k))
}
