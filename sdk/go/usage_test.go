package airlock_test

import (
	"errors"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func TestUsage(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{CPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	u, err := c.Usage(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.lastRequest(); r.Method != "GET" || r.URL.Path != "/v1/sandboxes/"+sb.ID+"/usage" {
		t.Errorf("Usage sent %s %s", r.Method, r.URL.Path)
	}
	want := airlock.Usage{SandboxID: sb.ID, SampledAt: time.Date(2026, 11, 26, 5, 30, 0, 250e6, time.UTC), CPUs: 2, CPUSeconds: 1.5,
		MemoryBytes: 384 << 20, MemoryLimitBytes: 512 << 20, DiskBytes: 256 << 20, DiskLimitBytes: 2 << 30}
	if u.Network == nil || *u.Network != (airlock.NetworkUsage{ReceiveBytes: 3 << 20, TransmitBytes: 1 << 20, Connections: 2}) {
		t.Fatalf("Network = %+v", u.Network)
	}
	got := *u
	got.Network = nil
	if !got.SampledAt.Equal(want.SampledAt) {
		t.Fatalf("SampledAt = %s, want %s", got.SampledAt, want.SampledAt)
	}
	got.SampledAt = want.SampledAt
	if got != want {
		t.Fatalf("Usage = %+v, want %+v", got, want)
	}

	offline, err := c.Create(ctx, airlock.CreateOptions{Network: &airlock.Network{Mode: airlock.NetworkNone}})
	if err != nil {
		t.Fatal(err)
	}
	if u, err := c.Usage(ctx, offline.ID); err != nil || u.Network != nil {
		t.Fatalf("Usage(no network) = %+v, %v", u, err)
	}

	if _, err := c.Pause(ctx, sb.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Usage(ctx, sb.ID); !errors.Is(err, airlock.ErrFailedPrecondition) {
		t.Fatalf("Usage(paused): %v, want ErrFailedPrecondition", err)
	}
	if _, err := c.Usage(ctx, "sbmissing000"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Usage(missing): %v, want ErrNotFound", err)
	}
}
