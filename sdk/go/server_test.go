package airlock_test

import (
	"slices"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func TestServer(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	if _, err := c.Create(ctx, airlock.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o, err := c.Server(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.lastRequest(); r.Method != "GET" || r.URL.Path != "/v1/server" {
		t.Errorf("Server sent %s %s", r.Method, r.URL.Path)
	}
	if o.Admin || o.Host != nil || o.Sandboxes["running"] != 1 || o.Runtime.Name != "qemu" {
		t.Errorf("overview %+v", o)
	}
	if a := o.Activity; !a.Since.Equal(time.Date(2026, 11, 25, 13, 0, 0, 0, time.UTC)) || a.BucketS != 3600 ||
		!slices.Equal(a.Creates, []int{1, 0, 2}) || !slices.Equal(a.Failures, []int{0, 0, 1}) {
		t.Errorf("activity %+v", a)
	}
	if len(o.Tenants) != 1 || o.Tenants[0].Tenant != "t1" || o.Tenants[0].Quota == nil || o.Tenants[0].Quota.MaxVCPUs != 32 {
		t.Errorf("tenants %+v", o.Tenants)
	}
}

func TestLogs(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs, err := c.Logs(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.lastRequest(); r.URL.Path != "/v1/sandboxes/"+sb.ID+"/logs" || r.URL.RawQuery != "" {
		t.Errorf("Logs sent %s?%s", r.URL.Path, r.URL.RawQuery)
	}
	if len(logs) != 1 || logs[0] != (airlock.SandboxLog{Source: "console", Exists: true, Size: 11, Text: "boot\nready\n"}) {
		t.Errorf("logs %+v", logs)
	}
	logs, err = c.Logs(ctx, sb.ID, 6)
	if err != nil || len(logs) != 1 || logs[0].Text != "ready\n" || !logs[0].Truncated {
		t.Errorf("the last 6 bytes: %+v %v", logs, err)
	}
	if q := f.lastRequest().URL.Query().Get("tail_bytes"); q != "6" {
		t.Errorf("tail_bytes %q", q)
	}
}
