package sandbox

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// TestOverview: a tenant's overview holds its own sandboxes, usage and
// activity only, and no host figure or runtime reason; an admin's holds
// every tenant's, the host's disk and memory, and the runtime's reason.
func TestOverview(t *testing.T) {
	m := newTestManager(t)
	ctx := t.Context()
	addPaused(t, m, "cccccccccccc", "alice")
	now := time.Date(2026, 11, 26, 12, 30, 0, 0, time.UTC)
	m.clock = func() time.Time { return now }
	m.statfs = func(string) (int64, int64, error) { return 100 << 30, 40 << 30, nil }
	m.meminfo = func() ([]byte, error) {
		return []byte("MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    8192 kB\n"), nil
	}
	m.Runtime = func(context.Context) (string, error) { return "gvisor", nil }
	m.RuntimeWhy = func(context.Context) string { return "auto: no usable KVM (/dev/kvm missing)" }
	if err := m.Store.PutSnapshot(ctx, store.Snapshot{Tenant: "bob", Name: "s1", ID: "snapbbbbbbbb", SandboxID: "bbbbbbbbbbbb",
		Image: "base", CPUs: 1, MemoryMiB: 512, DiskMiB: 2048, Size: 3 << 20, Created: now}); err != nil {
		t.Fatal(err)
	}
	if err := m.Store.CreateVolume(ctx, store.Volume{ID: "vol-bbbbbbbbbbbbbbbb", Tenant: "bob", Name: "v1", SizeMiB: 100, Created: now}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []store.Event{
		{Time: now.Add(-2 * time.Hour), Tenant: "alice", Action: "sandbox.create"},
		{Time: now.Add(-time.Minute), Tenant: "alice", Action: "sandbox.create"},
		{Time: now.Add(-time.Minute), Tenant: "bob", Action: "sandbox.create"},
		{Time: now.Add(-time.Minute), Tenant: "bob", Action: "sandbox.fail"},
		{Time: now.Add(-48 * time.Hour), Tenant: "bob", Action: "sandbox.create"}, // before the window
	} {
		if _, err := m.Store.AppendEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(v []int) (n int) {
		for _, x := range v {
			n += x
		}
		return n
	}

	o, err := m.Overview(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if o.States[store.StatePaused] != 2 || len(o.States) != 1 {
		t.Errorf("alice's states: %v", o.States)
	}
	if len(o.Tenants) != 1 || o.Tenants[0] != (TenantUsage{Tenant: "alice", Sandboxes: 2, VCPUs: 2, MemoryMiB: 1024, DiskMiB: 4096}) {
		t.Errorf("alice's usage: %+v", o.Tenants)
	}
	if len(o.Activity.Creates) != overviewBuckets || sum(o.Activity.Creates) != 2 || sum(o.Activity.Failures) != 0 ||
		o.Activity.Creates[overviewBuckets-1] != 1 || o.Activity.Creates[overviewBuckets-3] != 1 {
		t.Errorf("alice's activity: %+v", o.Activity)
	}
	if !o.Activity.Since.Equal(time.Date(2026, 11, 25, 13, 0, 0, 0, time.UTC)) || o.Activity.Step != time.Hour {
		t.Errorf("the window: from %s by %s", o.Activity.Since, o.Activity.Step)
	}
	if o.Host != nil || o.RuntimeWhy != "" || o.Runtime != "gvisor" {
		t.Errorf("a tenant sees host %+v, runtime %q (%q)", o.Host, o.Runtime, o.RuntimeWhy)
	}

	// A tenant with nothing gets its own row of zeros.
	o, err = m.Overview(ctx, Caller{Tenant: "carol"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.States) != 0 || len(o.Tenants) != 1 || o.Tenants[0] != (TenantUsage{Tenant: "carol"}) || sum(o.Activity.Creates) != 0 {
		t.Errorf("carol's overview: %+v", o)
	}

	o, err = m.Overview(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, u := range o.Tenants {
		names = append(names, u.Tenant)
	}
	if !slices.Equal(names, []string{"alice", "bob"}) || o.Tenants[1] != (TenantUsage{Tenant: "bob", Sandboxes: 1, VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048 + 3 + 100, Snapshots: 1, SnapshotMiB: 3, Volumes: 1, VolumeMiB: 100}) {
		t.Errorf("the admin's tenants: %+v", o.Tenants)
	}
	if o.States[store.StatePaused] != 3 || sum(o.Activity.Creates) != 3 || sum(o.Activity.Failures) != 1 {
		t.Errorf("the admin's states %v, activity %+v", o.States, o.Activity)
	}
	if o.Host == nil || o.Host.Disk.Free != 40<<30 || o.Host.MemTotal != 16<<20 || o.Host.MemAvailable != 8<<20 || o.RuntimeWhy != "auto: no usable KVM (/dev/kvm missing)" {
		t.Errorf("the admin's host %+v, runtime why %q", o.Host, o.RuntimeWhy)
	}
}

func TestParseMeminfo(t *testing.T) {
	t.Parallel()
	if _, _, err := parseMeminfo([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Error("no MemAvailable: no error")
	}
	if _, _, err := parseMeminfo([]byte("MemTotal: x kB\nMemAvailable: 1 kB\n")); err == nil {
		t.Error("a bad number: no error")
	}
	if total, avail, err := parseMeminfo([]byte("MemTotal: 2 kB\nMemAvailable: 1 kB\n")); err != nil || total != 2048 || avail != 1024 {
		t.Errorf("parse: %d %d %v", total, avail, err)
	}
}
