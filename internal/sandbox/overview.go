package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/statedir"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// The server page's figures (issue #15): what a caller may know of the
// server. A tenant's overview holds only its own sandboxes, usage and
// activity, and no host figure (they sum every tenant's use); an admin's
// holds every tenant's, the host's free disk and memory, and why the
// runtime was chosen (text that may name host paths).

// Overview is what the server page shows a caller.
type Overview struct {
	// States counts the sandboxes the caller sees by state.
	States map[store.State]int
	// Tenants are the usage of the caller's tenant (an admin: of every
	// tenant with a sandbox or a snapshot), by name.
	Tenants []TenantUsage
	// Activity counts sandbox.create and sandbox.fail events (a failed
	// boot, a crash, an out-of-memory kill) from the audit trail, so it
	// survives a restart of the server.
	Activity Activity
	// Host is nil unless the caller is an admin.
	Host *HostFigures
	// Runtime is the runtime new sandboxes get; RuntimeWhy why ("" unless
	// the caller is an admin, or if unknown).
	Runtime, RuntimeWhy string
}

// TenantUsage is what a tenant's sandboxes and snapshots use, counted as
// its quotas count them (Reserve): sandboxes that are not failed.
type TenantUsage struct {
	Tenant      string
	Sandboxes   int
	VCPUs       int
	MemoryMiB   int
	DiskMiB     int // sandboxes' disk sizes plus snapshots' bytes and volumes' sizes
	Snapshots   int // named ones (fork bases are not counted)
	SnapshotMiB int
	Volumes     int
	VolumeMiB   int
}

// Activity is counts per bucket of Step from Since, oldest first.
type Activity struct {
	Since    time.Time
	Step     time.Duration
	Creates  []int
	Failures []int
}

// HostFigures are the host's free disk (the state dir's filesystem) and
// memory.
type HostFigures struct {
	Disk         statedir.DiskFigures
	MemTotal     int64 // bytes
	MemAvailable int64 // bytes (MemAvailable of /proc/meminfo)
}

// Overview windows: the last 24 hours by hour.
const (
	overviewStep    = time.Hour
	overviewBuckets = 24
)

// Overview returns what c may know of the server (see Overview).
func (m *Manager) Overview(ctx context.Context, c Caller) (Overview, error) {
	sbs, err := m.list(ctx)
	if err != nil {
		return Overview{}, err
	}
	o := Overview{States: map[store.State]int{}}
	use := map[string]*TenantUsage{}
	tenant := func(name string) *TenantUsage {
		u, ok := use[name]
		if !ok {
			u = &TenantUsage{Tenant: name}
			use[name] = u
		}
		return u
	}
	if !c.Admin {
		tenant(c.Tenant)
	}
	for _, sb := range sbs {
		if !c.Sees(sb) {
			continue
		}
		o.States[sb.State]++
		u := tenant(sb.Tenant)
		if sb.State == store.StateFailed {
			continue
		}
		u.Sandboxes++
		u.VCPUs += sb.CPUs
		u.MemoryMiB += sb.MemoryMiB
		u.DiskMiB += sb.DiskMiB
	}
	snaps, err := m.Store.ListSnapshots(ctx, c.Tenant, c.Admin)
	if err != nil {
		return Overview{}, err
	}
	bytesOf := map[string]int64{}
	for _, sn := range snaps {
		u := tenant(sn.Tenant)
		bytesOf[sn.Tenant] += sn.Size
		if sn.Name != "" {
			u.Snapshots++
		}
	}
	for name, b := range bytesOf {
		u := use[name]
		u.SnapshotMiB = int((b + 1<<20 - 1) >> 20)
		u.DiskMiB += u.SnapshotMiB
	}
	vols, err := m.Store.ListVolumes(ctx)
	if err != nil {
		return Overview{}, err
	}
	for _, v := range vols {
		if !c.Admin && v.Tenant != c.Tenant {
			continue
		}
		u := tenant(v.Tenant)
		u.Volumes++
		u.VolumeMiB += v.SizeMiB
		u.DiskMiB += v.SizeMiB
	}
	for _, u := range use {
		o.Tenants = append(o.Tenants, *u)
	}
	slices.SortFunc(o.Tenants, func(a, b TenantUsage) int { return strings.Compare(a.Tenant, b.Tenant) })

	now := m.now()
	since := now.Truncate(overviewStep).Add(-(overviewBuckets - 1) * overviewStep)
	f := store.ActivityFilter{Actions: []string{"sandbox.create", "sandbox.fail"}, Since: since, Step: overviewStep, Buckets: overviewBuckets}
	if !c.Admin {
		f.Tenant = c.Tenant
		if f.Tenant == "" { // not an admin and no tenant: sees nothing
			f.Tenant = "\x00"
		}
	}
	act, err := m.Store.Activity(ctx, f)
	if err != nil {
		return Overview{}, err
	}
	o.Activity = Activity{Since: since, Step: overviewStep, Creates: act["sandbox.create"], Failures: act["sandbox.fail"]}

	o.Runtime = "qemu"
	var rtErr error
	if m.Runtime != nil {
		if o.Runtime, rtErr = m.Runtime(ctx); rtErr != nil {
			o.Runtime = ""
		}
	}
	if !c.Admin {
		return o, nil
	}
	switch {
	case rtErr != nil:
		o.RuntimeWhy = "no runtime: " + rtErr.Error()
	case m.RuntimeWhy != nil:
		o.RuntimeWhy = m.RuntimeWhy(ctx)
	case m.Runtime == nil:
		o.RuntimeWhy = "the default"
	}
	d, err := m.Disk()
	if err != nil {
		return Overview{}, err
	}
	h := &HostFigures{Disk: d}
	read := m.meminfo
	if read == nil {
		read = func() ([]byte, error) { return os.ReadFile("/proc/meminfo") }
	}
	b, err := read()
	if err == nil {
		h.MemTotal, h.MemAvailable, err = parseMeminfo(b)
	}
	if err != nil {
		return Overview{}, fmt.Errorf("host memory: %w", err)
	}
	o.Host = h
	return o, nil
}

// now is the manager's clock for the overview (tests set clock).
func (m *Manager) now() time.Time {
	if m.clock != nil {
		return m.clock()
	}
	return time.Now()
}

// parseMeminfo reads MemTotal and MemAvailable (kB) from /proc/meminfo's
// text, in bytes.
func parseMeminfo(b []byte) (total, avail int64, err error) {
	var haveT, haveA bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		var dst *int64
		switch string(f[0]) {
		case "MemTotal:":
			dst, haveT = &total, true
		case "MemAvailable:":
			dst, haveA = &avail, true
		default:
			continue
		}
		n, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("meminfo: %s %q", f[0], f[1])
		}
		*dst = n << 10
	}
	if !haveT || !haveA {
		return 0, 0, errors.New("meminfo: no MemTotal or MemAvailable")
	}
	return total, avail, sc.Err()
}
