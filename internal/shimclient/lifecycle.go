package shimclient

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
)

// lifecycle returns a LifecycleService client on c's connection.
func (c *Client) lifecycle() shimv2connect.LifecycleServiceClient {
	return shimv2connect.NewLifecycleServiceClient(c.hc, baseURL, clientOptions()...)
}

// Pause saves the sandbox and ends its VMM and shim; it returns once the
// state is saved, before the shim is gone. Errors: ErrFailedPrecondition
// (work in flight without force, secrets, not running), ErrUnsupported
// (the runtime cannot pause), ErrUnavailable.
func (c *Client) Pause(ctx context.Context, force bool) (guest.PauseResult, error) {
	resp, err := c.lifecycle().Pause(ctx, connect.NewRequest(&shimv2.PauseRequest{Force: force}))
	if err != nil {
		return guest.PauseResult{}, wireErr(ctx, "pause", err)
	}
	return guest.PauseResult{StateBytes: resp.Msg.GetStateBytes(), Save: time.Duration(resp.Msg.GetSaveMs()) * time.Millisecond}, nil
}

// Snapshot saves the running sandbox into dir while it keeps running (a
// live snapshot; see LifecycleService.Snapshot); Save in the result is how
// long until the guest answered again. Errors: ErrFailedPrecondition (work
// in flight without force), ErrUnsupported (the runtime, or a shim from
// before live snapshots, cannot), ErrInvalid (dir), ErrUnavailable.
func (c *Client) Snapshot(ctx context.Context, dir string, force bool) (guest.PauseResult, error) {
	resp, err := c.lifecycle().Snapshot(ctx, connect.NewRequest(&shimv2.SnapshotRequest{Dir: dir, Force: force}))
	if err != nil {
		return guest.PauseResult{}, wireErr(ctx, "snapshot", err)
	}
	return guest.PauseResult{StateBytes: resp.Msg.GetStateBytes(), Save: time.Duration(resp.Msg.GetTotalMs()) * time.Millisecond}, nil
}

// Shutdown asks the shim to delete the sandbox (stop the guest, free its
// resources, exit). It returns before the shim is gone.
func (c *Client) Shutdown(ctx context.Context) error {
	if _, err := c.lifecycle().Shutdown(ctx, connect.NewRequest(&shimv2.ShutdownRequest{})); err != nil {
		return wireErr(ctx, "shutdown", err)
	}
	return nil
}

// Touch counts as activity for the sandbox's idle-pause timer; the guest
// is not involved.
func (c *Client) Touch(ctx context.Context) error {
	if _, err := c.lifecycle().Touch(ctx, connect.NewRequest(&shimv2.TouchRequest{})); err != nil {
		return wireErr(ctx, "touch", err)
	}
	return nil
}

// Refresh asks the shim to re-read its sandbox's row in the catalog (after
// a change of its lifetime). It is not activity.
func (c *Client) Refresh(ctx context.Context) error {
	if _, err := c.lifecycle().Refresh(ctx, connect.NewRequest(&shimv2.RefreshRequest{})); err != nil {
		return wireErr(ctx, "refresh", err)
	}
	return nil
}

// Stats returns what the shim knows of the sandbox without the guest. It
// is not activity: polling it does not keep the sandbox from idling.
func (c *Client) Stats(ctx context.Context) (guest.Stats, error) {
	resp, err := c.lifecycle().Stats(ctx, connect.NewRequest(&shimv2.StatsRequest{}))
	if err != nil {
		return guest.Stats{}, wireErr(ctx, "stats", err)
	}
	m := resp.Msg
	return guest.Stats{
		Runtime: m.GetRuntime(), Accel: m.GetAccel(), RunningSince: time.Unix(0, m.GetRunningSinceUnixNano()),
		RunningExecs: int(m.GetRunningExecs()), RequestsInFlight: int(m.GetRequestsInFlight()),
		InboundConnections: int(m.GetInboundConnections()), LastActivity: time.Unix(0, m.GetLastActivityUnixNano()),
	}, nil
}

// Usage asks the guest for its resource use (ErrFailedPrecondition if its
// agent predates it), with the shim's network counters (Network nil when
// the sandbox has no network).
func (c *Client) Usage(ctx context.Context) (guest.Usage, error) {
	resp, err := c.lifecycle().Usage(ctx, connect.NewRequest(&shimv2.UsageRequest{}))
	if err != nil {
		return guest.Usage{}, wireErr(ctx, "usage", err)
	}
	m := resp.Msg
	return guest.Usage{
		CPUBusy: time.Duration(m.GetCpuBusyNs()), CPUTotal: time.Duration(m.GetCpuTotalNs()), CPUs: int(m.GetCpus()),
		MemTotal: m.GetMemTotalBytes(), MemAvailable: m.GetMemAvailableBytes(), MemCached: m.GetMemCachedBytes(),
		DiskTotal: m.GetDiskTotalBytes(), DiskUsed: m.GetDiskUsedBytes(),
		Network: networkUsage(m.GetNetwork()),
	}, nil
}

// networkUsage maps the shim's network counters (nil: no network).
func networkUsage(n *shimv2.NetworkUsage) *guest.NetworkUsage {
	if n == nil {
		return nil
	}
	return &guest.NetworkUsage{
		ReceiveBytes: n.GetReceiveBytes(), TransmitBytes: n.GetTransmitBytes(),
		ReceiveFrames: n.GetReceiveFrames(), TransmitFrames: n.GetTransmitFrames(),
		Connections:  int(n.GetConnections()),
		DialsAllowed: n.GetDialsAllowed(), DialsDenied: n.GetDialsDenied(), DialsBusy: n.GetDialsBusy(),
		EgressBytes: n.GetEgressBytes(), FlowsLimited: n.GetFlowsLimited(), DatagramsLimited: n.GetDatagramsLimited(),
	}
}
