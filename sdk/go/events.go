package airlock

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Event is one audit record.
type Event struct {
	Seq       int64          `json:"seq"`
	Time      time.Time      `json:"time"`
	Tenant    string         `json:"tenant"`
	KeyID     string         `json:"key_id"`
	SandboxID string         `json:"sandbox_id"`
	Action    string         `json:"action"` // sandbox.create, exec.exit, file.write, auth.denied, net.deny, ...
	Detail    map[string]any `json:"detail"`
}

// EventsOptions select events. Zero fields do not filter.
type EventsOptions struct {
	Sandbox string // only this sandbox's events
	// Type selects actions equal to Type or starting with Type + "."
	// ("net": every network event, net.allow, net.deny, net.secret.inject...).
	Type  string
	Since int64 // only events with a sequence number above this
	Limit int   // at most this many (0 = the server's default)
}

// Events returns the events visible to this key after opts.Since, and the
// cursor to pass as Since next time (the last seq returned, or Since).
func (c *Client) Events(ctx context.Context, opts EventsOptions) ([]Event, int64, error) {
	q := url.Values{}
	if opts.Sandbox != "" {
		q.Set("sandbox", opts.Sandbox)
	}
	if opts.Type != "" {
		q.Set("type", opts.Type)
	}
	if opts.Since > 0 {
		q.Set("since", strconv.FormatInt(opts.Since, 10))
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	var out struct {
		Events []Event `json:"events"`
		Next   int64   `json:"next"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/events", q, nil, &out, http.StatusOK); err != nil {
		return nil, 0, err
	}
	return out.Events, out.Next, nil
}
