package agentapi

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/clock"
)

// slowSyncAgent records each Sync and moves the host's fake clock on by
// the next of its delays, as a guest that took that long to answer would.
type slowSyncAgent struct {
	agentv1connect.AgentServiceClient
	clk    *clock.Fake
	delays []time.Duration
	got    []*agentv1.SyncRequest
}

func (a *slowSyncAgent) Sync(_ context.Context, req *connect.Request[agentv1.SyncRequest]) (*connect.Response[agentv1.SyncResponse], error) {
	a.got = append(a.got, req.Msg)
	if n := len(a.got) - 1; n < len(a.delays) {
		a.clk.Advance(a.delays[n])
	}
	return connect.NewResponse(&agentv1.SyncResponse{RootSizeBytes: uint64(len(a.got))}), nil
}

// TestSyncSetsTheClockAgainAfterASlowSync: a Sync that took longer than
// ClockSlack left the guest's clock behind by that much; SyncWith sets it
// again with clock-only Syncs (time and entropy, nothing else) until one
// is fast, at most maxClockResyncs of them, and returns the first answer.
func TestSyncSetsTheClockAgainAfterASlowSync(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delays []time.Duration
		want   int
	}{
		{"fast", []time.Duration{ClockSlack / 2}, 1},
		{"slow once", []time.Duration{time.Second, time.Millisecond}, 2},
		{"slow twice", []time.Duration{time.Second, 2 * ClockSlack, 0}, 3},
		{"always slow", []time.Duration{time.Second, time.Second, time.Second, time.Second, time.Second}, 1 + maxClockResyncs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewFake(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
			a := &slowSyncAgent{clk: clk, delays: tc.delays}
			c := &Client{Agent: a, now: clk.Now}
			resp, err := c.SyncWith(context.Background(), SyncOptions{Hostname: "h", DiskBytes: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			if len(a.got) != tc.want {
				t.Fatalf("%d Syncs, want %d", len(a.got), tc.want)
			}
			if resp.GetRootSizeBytes() != 1 {
				t.Errorf("SyncWith returned answer %d, want the first", resp.GetRootSizeBytes())
			}
			for i, m := range a.got[1:] {
				if m.GetHostname() != "" || m.GetGrowRoot() || m.GetNetwork() != nil || len(m.GetVolumes()) != 0 || len(m.GetEntropy()) == 0 {
					t.Errorf("resync %d is not clock-only: %v", i+1, m)
				}
				// Each resync carries the host's time when it was sent:
				// after the slow answers before it.
				if prev := a.got[i]; m.GetUnixNano() <= prev.GetUnixNano() {
					t.Errorf("resync %d carries %d, not later than %d", i+1, m.GetUnixNano(), prev.GetUnixNano())
				}
			}
		})
	}
}
