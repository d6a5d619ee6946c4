package e2b

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/api"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// E2B's snapshot, fork, network-update and metrics routes over api.Snapshots
// (metrics over api.Sandboxes.Usage).
// An airlock snapshot is named per tenant: its name is E2B's snapshotID and
// the only entry of its names, and a create whose templateID names one of
// the caller's snapshots starts from it.

// lifecycleTimeout bounds a snapshot, a fork and a create from a snapshot,
// which go on when the client goes away: cut half-way they help nobody.
const lifecycleTimeout = 5 * time.Minute

var (
	errCannotSnapshot = &api.Error{Status: http.StatusPreconditionFailed, Code: "failed_precondition",
		Message: "the sandbox cannot be saved now: it has secrets, runs commands or code, or is not running"}
	errSnapshotTaken = &api.Error{Status: http.StatusConflict, Code: "conflict",
		Message: "the team already has a snapshot of that name (delete it first)"}
	errSnapshotInUse = &api.Error{Status: http.StatusPreconditionFailed, Code: "failed_precondition",
		Message: "the snapshot backs sandboxes made from it or forked, or other snapshots; kill or delete them first"}
)

// SnapshotInfo is E2B's view of a snapshot.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotInfo(sn store.Snapshot) SnapshotInfo {
	return SnapshotInfo{SnapshotID: sn.Name, Names: []string{sn.Name}}
}

// ForkResult is one entry of a fork's answer; airlock's forks are all or
// none, so Error is never set.
type ForkResult struct {
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	Error   *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// lifecycleContext is the context of a snapshot or fork: not cancelled with
// the request, bounded by lifecycleTimeout.
func lifecycleContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(r.Context()), lifecycleTimeout)
}

// fork serves POST /sandboxes/{id}/fork: count (default 1) running copies,
// each with the lifetime timeout (seconds; 300 when omitted) from now.
func (h *handler) fork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Timeout *int `json:"timeout"`
		Count   *int `json:"count"`
	}
	if !decode(w, r, &req) {
		return
	}
	timeout := DefaultTimeout
	if req.Timeout != nil {
		if !validTimeout(w, *req.Timeout) {
			return
		}
		timeout = time.Duration(*req.Timeout) * time.Second
	}
	count := 1
	if req.Count != nil {
		if *req.Count < 1 || *req.Count > sandbox.MaxForks {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("count must be between 1 and %d", sandbox.MaxForks))
			return
		}
		count = *req.Count
	}
	id := r.PathValue("id")
	if _, ok := h.visible(w, r, c, id); !ok {
		return
	}
	ctx, cancel := lifecycleContext(r)
	defer cancel()
	forks, err := h.cfg.Snapshots.Fork(ctx, c, id, sandbox.ForkOptions{Count: count})
	if err != nil {
		if errors.Is(err, errdefs.ErrFailedPrecondition) {
			err = errCannotSnapshot
		}
		h.fail(w, r, err)
		return
	}
	// The manager gives forks the source's lifetime; E2B's is the
	// request's. A fork whose lifetime cannot be set is not handed out:
	// all of them go, as the manager's forks are all or none.
	for _, f := range forks {
		if err := h.cfg.Sandboxes.SetTimeout(ctx, c, f.ID, timeout); err != nil {
			for _, g := range forks {
				if rerr := h.cfg.Sandboxes.Remove(ctx, c, g.ID); rerr != nil {
					h.cfg.Log.Error("remove a fork after its timeout failed", "sandbox_id", g.ID, "err", rerr)
				}
			}
			h.fail(w, r, err)
			return
		}
	}
	out := make([]ForkResult, 0, len(forks))
	for _, f := range forks {
		sb := h.sandbox(f, f.Image)
		out = append(out, ForkResult{Sandbox: &sb})
	}
	writeJSON(w, http.StatusCreated, out)
}

// createSnapshot serves POST /sandboxes/{id}/snapshots: the sandbox saved
// as the tenant's snapshot name (generated when the request has none); the
// sandbox keeps running.
func (h *handler) createSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req struct {
		Name string `json:"name"`
	}
	if !decode(w, r, &req) {
		return
	}
	name := req.Name
	if name == "" {
		name = newSnapshotName()
	}
	if err := sandbox.ValidateSnapshotName(name); err != nil {
		h.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	if _, ok := h.visible(w, r, c, id); !ok {
		return
	}
	ctx, cancel := lifecycleContext(r)
	defer cancel()
	sn, err := h.cfg.Snapshots.Snapshot(ctx, c, id, name, false)
	if err != nil {
		switch {
		case errors.Is(err, errdefs.ErrConflict):
			err = errSnapshotTaken
		case errors.Is(err, errdefs.ErrFailedPrecondition):
			err = errCannotSnapshot
		}
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotInfo(sn))
}

// newSnapshotName is a snapshot name for a request that gives none:
// "snap-" and 10 random base32 characters (50 bits).
func newSnapshotName() string {
	b := make([]byte, 7)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "snap-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))[:10]
}

// listSnapshots serves GET /snapshots: the tenant's snapshots, newest
// first, filtered by source sandbox (sandboxID) and name, paged like the
// sandbox list (limit; nextToken is the last snapshotID of the previous
// page, in X-Next-Token).
func (h *handler) listSnapshots(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	q := r.URL.Query()
	limit, ok := pageLimit(w, q.Get("limit"))
	if !ok {
		return
	}
	sns, err := h.cfg.Snapshots.ListSnapshots(r.Context(), c, "", false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	slices.SortFunc(sns, func(a, b store.Snapshot) int {
		if d := b.Created.Compare(a.Created); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	source, name := q.Get("sandboxID"), q.Get("name")
	writePage(w, sns, q.Get("nextToken"), limit, func(sn store.Snapshot) string { return sn.Name },
		func(sn store.Snapshot) bool {
			return (source == "" || sn.SandboxID == source) && (name == "" || sn.Name == name)
		},
		snapshotInfo)
}

// writePage answers a list as E2B pages it: the items after the one whose
// id is after (all if after is ""), those keep passes, at most limit of
// them as view makes them, and in X-Next-Token the id of the last one
// when more remain.
func writePage[T, V any](w http.ResponseWriter, items []T, after string, limit int, id func(T) string, keep func(T) bool, view func(T) V) {
	out := []V{}
	skipping := after != ""
	last, next := "", ""
	for _, it := range items {
		if skipping {
			skipping = id(it) != after
			continue
		}
		if !keep(it) {
			continue
		}
		if len(out) == limit {
			next = last
			break
		}
		out, last = append(out, view(it)), id(it)
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

// pageLimit parses a list's limit (100 when omitted) and answers 400 for a
// bad one.
func pageLimit(w http.ResponseWriter, v string) (int, bool) {
	if v == "" {
		return 100, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		writeError(w, http.StatusBadRequest, "limit must be between 1 and 1000")
		return 0, false
	}
	return n, true
}

// deleteSnapshot serves DELETE /templates/{id} for snapshots: 204, or 404
// (the SDK's false) for a name the tenant has no snapshot of. airlock's
// images are not deleted through this route.
func (h *handler) deleteSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	name := r.PathValue("id")
	if err := h.cfg.Snapshots.RemoveSnapshot(r.Context(), c, "", name); err != nil {
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found", name))
			return
		case errors.Is(err, errdefs.ErrFailedPrecondition):
			err = errSnapshotInUse
		}
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// createFromSnapshot finishes a create whose templateID names the
// tenant's snapshot sn: its size, image, env and network are the
// snapshot's, so envVars, and allow_internet_access false for a snapshot
// with internet access, are refused rather than ignored.
func (h *handler) createFromSnapshot(w http.ResponseWriter, r *http.Request, c sandbox.Caller, req newSandboxRequest, sn store.Snapshot, timeout time.Duration) {
	switch {
	case len(req.EnvVars) > 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is a snapshot: a sandbox from it has the snapshot's environment; leave envVars out", sn.Name))
		return
	case len(req.VolumeMounts) > 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is a snapshot: a sandbox from a snapshot cannot mount volumes; leave volumeMounts out", sn.Name))
		return
	case req.AllowInternetAccess != nil && !*req.AllowInternetAccess && internetAccess(sn.Network.Mode, len(sn.Network.Allow)):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q is a snapshot of a sandbox with internet access: a sandbox from it has the snapshot's network; leave allow_internet_access out", sn.Name))
		return
	}
	ctx, cancel := lifecycleContext(r)
	defer cancel()
	sb, err := h.cfg.Snapshots.CreateFromSnapshot(ctx, c, sn.Name, sandbox.CreateOptions{Timeout: timeout, Metadata: req.Metadata})
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found", sn.Name))
			return
		}
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.sandbox(sb, sn.Name))
}

// internetAccess is E2B's allowInternetAccess of an airlock network: the
// default (public) mode without allow rules.
func internetAccess(mode string, allowRules int) bool {
	return mode != "deny" && mode != "none" && allowRules == 0
}

// networkUpdate is E2B's SandboxNetworkUpdateConfig.
type networkUpdate struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	Rules               json.RawMessage `json:"rules"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

// updateNetwork serves PUT /sandboxes/{id}/network (sbx.updateNetwork):
// the body replaces the sandbox's whole egress policy, mapped as a
// create's is (denying all traffic, by allow_internet_access false or
// denyOut 0.0.0.0/0, is mode deny with allowOut as its rules; anything
// else is mode public), through the manager's SetNetwork: the same
// validation, platform floor and audit as /v1's PUT .../network. 204;
// 404 for a sandbox the caller cannot see; what airlock does not do
// (other denyOut entries, rules, egressProxy) is 400.
func (h *handler) updateNetwork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if _, ok := h.visible(w, r, c, r.PathValue("id")); !ok {
		return
	}
	var req networkUpdate
	if !decode(w, r, &req) {
		return
	}
	switch {
	case set(req.Rules):
		writeError(w, http.StatusBadRequest, "rules (request transforms) are not supported by airlock's E2B surface; airlock's /v1 API injects secrets into requests to named hosts")
		return
	case set(req.EgressProxy):
		writeError(w, http.StatusBadRequest, "egressProxy is not supported by airlock")
		return
	}
	for _, d := range req.DenyOut {
		if d != allTraffic {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("denyOut %q: airlock denies all traffic (%s) with allowOut exceptions, or nothing; it has no deny list", d, allTraffic))
			return
		}
	}
	p := sandbox.EgressPolicy{Mode: "public"}
	if (req.AllowInternetAccess != nil && !*req.AllowInternetAccess) || slices.Contains(req.DenyOut, allTraffic) {
		p = sandbox.EgressPolicy{Mode: "deny", Allow: slices.Clone(req.AllowOut)}
	}
	if _, err := h.cfg.Sandboxes.SetNetwork(r.Context(), c, r.PathValue("id"), p); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// metrics serves GET /sandboxes/{id}/metrics: one sample taken now from
// the guest's own account (its agent reads /proc/stat, /proc/meminfo and
// statfs of its root), CPU use measured over metricsWindow; none for a
// paused sandbox or when now is outside [start, end]. 404 for a sandbox
// the caller cannot see.
func (h *handler) metrics(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	sb, ok := h.visible(w, r, c, r.PathValue("id"))
	if !ok {
		return
	}
	now := time.Now()
	q := r.URL.Query()
	for _, b := range []struct {
		name  string
		after bool
	}{{"start", true}, {"end", false}} {
		v := q.Get(b.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, b.name+" must be unix seconds")
			return
		}
		if t := time.Unix(n, 0); (b.after && now.Before(t)) || (!b.after && now.After(t.Add(time.Second))) {
			writeJSON(w, http.StatusOK, []sandboxMetric{})
			return
		}
	}
	if sb.State != store.StateRunning {
		writeJSON(w, http.StatusOK, []sandboxMetric{})
		return
	}
	u0, err := h.cfg.Sandboxes.Usage(r.Context(), c, sb.ID)
	if err == nil {
		t := time.NewTimer(metricsWindow)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	var u1 guest.Usage
	if err == nil {
		u1, err = h.cfg.Sandboxes.Usage(r.Context(), c, sb.ID)
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	pct := 0.0
	if dt := u1.CPUTotal - u0.CPUTotal; dt > 0 {
		pct = 100 * float64(u1.CPUBusy-u0.CPUBusy) / float64(dt)
	}
	writeJSON(w, http.StatusOK, []sandboxMetric{{
		Timestamp: now.UTC(), CPUUsedPct: math.Round(pct*100) / 100, CPUCount: u1.CPUs,
		MemUsed: u1.MemTotal - min(u1.MemAvailable, u1.MemTotal), MemTotal: u1.MemTotal, MemCache: u1.MemCached,
		DiskUsed: u1.DiskUsed, DiskTotal: u1.DiskTotal,
	}})
}

// metricsWindow is how long a metrics sample measures CPU use over.
const metricsWindow = 250 * time.Millisecond

// sandboxMetric is E2B's SandboxMetric (bytes and percent).
type sandboxMetric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	CPUCount   int       `json:"cpuCount"`
	MemUsed    uint64    `json:"memUsed"`
	MemTotal   uint64    `json:"memTotal"`
	MemCache   uint64    `json:"memCache"`
	DiskUsed   uint64    `json:"diskUsed"`
	DiskTotal  uint64    `json:"diskTotal"`
}
