package agentapi

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"

	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

// ErrUnsupported means the agent's protocol version lacks the RPC asked for.
var ErrUnsupported = errors.New("the guest agent is too old for this operation")

// Limits on what the host accepts from a guest.
const (
	// DefaultMaxMessageBytes caps one protobuf message from the guest.
	DefaultMaxMessageBytes = 4 << 20
	// MaxHeaderBytes caps the HTTP/2 header block of one response.
	MaxHeaderBytes = 64 << 10
	// ChunkSize is the size of data chunks the host sends (stdin, files).
	ChunkSize = 256 << 10
)

// Options configures a host-side Client.
type Options struct {
	// MaxMessageBytes caps each message from the guest (default 4 MiB).
	MaxMessageBytes int
}

// Client is the host side of one agent session. Safe for concurrent use.
type Client struct {
	// Info is the agent's answer to Info at connection time. Guest data:
	// informational, never trusted for decisions beyond version gating.
	Info *agentv1.InfoResponse

	Agent    agentv1connect.AgentServiceClient
	Exec     agentv1connect.ExecServiceClient
	Files    agentv1connect.FileServiceClient
	Contexts agentv1connect.ContextServiceClient // needs VersionContexts

	// The session's connection: replaced by Redial, so guarded by mu.
	// rt routes every request to the current cc.
	mu   sync.Mutex
	conn net.Conn
	cc   *http2.ClientConn
	rt   *sessionTransport
	opts Options

	// now is the host's clock for SyncWith (time.Now unless a test sets
	// it; internal/clock stays out of the agent's dependencies).
	now func() time.Time
}

// ClockSlack is how long a Sync may take before SyncWith sets the guest's
// clock again: the guest sets the time the request carried, so a request
// that took long to be served (a cold path in a restored TCG guest, a
// loaded host) leaves the guest that far behind.
const ClockSlack = 250 * time.Millisecond

// maxClockResyncs bounds the clock-only Syncs after a slow one.
const maxClockResyncs = 3

// Dial performs the host side of the handshake on conn: it waits for the
// banner, starts HTTP/2, and calls Info. On success the Client owns conn;
// on failure conn is left open for the caller to close.
func Dial(ctx context.Context, conn net.Conn, opts Options) (*Client, error) {
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	cc, info, err := handshake(ctx, conn, opts)
	if err != nil {
		return nil, err
	}
	rt := &sessionTransport{cc: cc}
	c := NewClient(&http.Client{Transport: rt}, "http://agent", opts)
	c.conn, c.cc, c.rt, c.opts, c.Info = conn, cc, rt, opts, info
	return c, nil
}

// handshake waits for the banner on conn, starts HTTP/2 and calls Info.
// On failure conn is left open.
func handshake(ctx context.Context, conn net.Conn, opts Options) (*http2.ClientConn, *agentv1.InfoResponse, error) {
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	bc, err := waitBanner(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	tr := &http2.Transport{
		AllowHTTP:         true,
		MaxHeaderListSize: MaxHeaderBytes,
		MaxReadFrameSize:  1 << 20,
		// The guest never gets to pick compression.
		DisableCompression: true,
	}
	cc, err := tr.NewClientConn(bc)
	if err != nil {
		return nil, nil, fmt.Errorf("start http2: %w", err)
	}
	agent := NewClient(&http.Client{Transport: cc}, "http://agent", opts).Agent
	info, err := agent.Info(ctx, connect.NewRequest(&agentv1.InfoRequest{}))
	if err != nil {
		_ = cc.Close()
		return nil, nil, fmt.Errorf("agent info: %w", err)
	}
	if info.Msg.GetProtocolVersion() < 1 {
		_ = cc.Close()
		return nil, nil, fmt.Errorf("%w: protocol version %d", ErrUnsupported, info.Msg.GetProtocolVersion())
	}
	return cc, info.Msg, nil
}

// Redial makes conn, a new channel to the same guest agent (after a live
// snapshot closed the old one), this session's connection: requests made
// from now on, through any of the Client's services, go over it. The
// session it replaces is closed (its streams end). The agent must speak
// at least the protocol it spoke before (Info stays what it was). Only
// for Clients made by Dial. On failure conn is left open and the Client
// keeps its old (closed or failing) connection.
func (c *Client) Redial(ctx context.Context, conn net.Conn) error {
	if c.rt == nil {
		return errors.New("redial: not a direct agent session")
	}
	cc, info, err := handshake(ctx, conn, c.opts)
	if err != nil {
		return err
	}
	if c.Info != nil && info.GetProtocolVersion() < c.Info.GetProtocolVersion() {
		_ = cc.Close()
		return fmt.Errorf("%w: the agent now speaks protocol %d, %d before", ErrUnsupported, info.GetProtocolVersion(), c.Info.GetProtocolVersion())
	}
	c.mu.Lock()
	oldConn, oldCC := c.conn, c.cc
	c.conn, c.cc = conn, cc
	c.mu.Unlock()
	c.rt.set(cc)
	_ = oldCC.Close()
	_ = oldConn.Close()
	return nil
}

// sessionTransport sends each request over the session's current HTTP/2
// connection.
type sessionTransport struct {
	mu sync.Mutex
	cc *http2.ClientConn
}

func (t *sessionTransport) set(cc *http2.ClientConn) {
	t.mu.Lock()
	t.cc = cc
	t.mu.Unlock()
}

func (t *sessionTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.mu.Lock()
	cc := t.cc
	t.mu.Unlock()
	return cc.RoundTrip(r)
}

// NewClient builds a Client over an existing HTTP client (used by the CLI
// to talk to a shim, which relays the same services). Info is nil.
func NewClient(hc connect.HTTPClient, baseURL string, opts Options) *Client {
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	o := []connect.ClientOption{
		connect.WithReadMaxBytes(opts.MaxMessageBytes),
		// Never offer compression: the guest must not send decompression
		// bombs, and gzip made TCG guests CPU-bound.
		connect.WithAcceptCompression("gzip", nil, nil),
	}
	return &Client{
		Agent:    agentv1connect.NewAgentServiceClient(hc, baseURL, o...),
		Exec:     agentv1connect.NewExecServiceClient(hc, baseURL, o...),
		Files:    agentv1connect.NewFileServiceClient(hc, baseURL, o...),
		Contexts: agentv1connect.NewContextServiceClient(hc, baseURL, o...),
	}
}

// Require returns ErrUnsupported if the agent's protocol version is below v.
func (c *Client) Require(v uint32, what string) error {
	if c.Info != nil && c.Info.GetProtocolVersion() < v {
		return fmt.Errorf("%w: %s needs protocol %d, agent has %d", ErrUnsupported, what, v, c.Info.GetProtocolVersion())
	}
	return nil
}

// Sync sets the guest clock from the host and reseeds its RNG with fresh
// host entropy. Call it after every boot and restore.
// diskBytes, if non-zero, is the root disk size the host just set; the agent
// waits for the guest kernel to see it and grows the root filesystem.
func (c *Client) Sync(ctx context.Context, hostname string, diskBytes uint64) (*agentv1.SyncResponse, error) {
	return c.SyncWith(ctx, SyncOptions{Hostname: hostname, DiskBytes: diskBytes})
}

// SyncOptions is what SyncWith asks of the guest beyond clock and entropy.
type SyncOptions struct {
	// Hostname, if set, becomes the guest's hostname.
	Hostname string
	// DiskBytes, if non-zero, is the root disk size the host just set; the
	// agent grows the root filesystem to it.
	DiskBytes uint64
	// Network, if set, configures the guest NIC (Enabled false takes it
	// down). It needs VersionNetwork: an older agent would ignore it, so
	// SyncWith fails with ErrUnsupported instead. Nil leaves networking as
	// it is.
	Network *agentv1.NetworkConfig
	// Volumes are mounted by the guest (after a cold boot only). They
	// need VersionVolumes.
	Volumes []*agentv1.VolumeMount
}

// SyncWith is Sync with every option. Call it after every boot and restore.
func (c *Client) SyncWith(ctx context.Context, o SyncOptions) (*agentv1.SyncResponse, error) {
	if o.Network != nil {
		if err := c.Require(VersionNetwork, "network config"); err != nil {
			return nil, err
		}
	}
	if len(o.Volumes) > 0 {
		if err := c.Require(VersionVolumes, "volumes"); err != nil {
			return nil, err
		}
	}
	diskBytes := o.DiskBytes
	seed := make([]byte, 64)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("host entropy: %w", err)
	}
	now := c.now
	if now == nil {
		now = time.Now
	}
	sent := now()
	resp, err := c.Agent.Sync(ctx, connect.NewRequest(&agentv1.SyncRequest{
		UnixNano:      sent.UnixNano(),
		Entropy:       seed,
		Hostname:      o.Hostname,
		GrowRoot:      diskBytes > 0,
		RootDiskBytes: diskBytes,
		Network:       o.Network,
		Volumes:       o.Volumes,
	}))
	if err != nil {
		return nil, fmt.Errorf("agent sync: %w", err)
	}
	// A slow Sync left the guest's clock behind by about its duration:
	// set it again with a clock-only Sync (the path is warm now), a few
	// times at most.
	for range maxClockResyncs {
		if now().Sub(sent) <= ClockSlack {
			break
		}
		if _, err := rand.Read(seed); err != nil {
			return nil, fmt.Errorf("host entropy: %w", err)
		}
		sent = now()
		if _, err := c.Agent.Sync(ctx, connect.NewRequest(&agentv1.SyncRequest{UnixNano: sent.UnixNano(), Entropy: seed})); err != nil {
			return nil, fmt.Errorf("agent sync (clock): %w", err)
		}
	}
	return resp.Msg, nil
}

// MaxParked caps the execs an agent keeps parked (and the host accepts in
// a ListParked answer).
const MaxParked = 64

// ListParked returns the execs the agent keeps parked (see ExecService.Exec
// in the proto). It needs VersionPark; so do the park request and the
// adopt start, which an older agent ignores: Require(VersionPark) before
// sending them. The answer is guest data: at most MaxParked entries.
func (c *Client) ListParked(ctx context.Context) ([]*agentv1.ParkedExec, error) {
	if err := c.Require(VersionPark, "parked execs"); err != nil {
		return nil, err
	}
	resp, err := c.Exec.ListParked(ctx, connect.NewRequest(&agentv1.ListParkedRequest{}))
	if err != nil {
		return nil, fmt.Errorf("list parked execs: %w", err)
	}
	if n := len(resp.Msg.GetExecs()); n > MaxParked {
		return nil, fmt.Errorf("list parked execs: the agent answered %d, more than %d", n, MaxParked)
	}
	return resp.Msg.GetExecs(), nil
}

// MaxProcEvents caps the events the host takes from one ProcEvents
// message; the rest are counted as dropped.
const MaxProcEvents = 512

// ProcEvents opens the guest's stream of execs and exits (see
// AgentService.ProcEvents in the proto). It needs VersionProcAudit. The
// messages are guest data: the caller bounds what it keeps of them
// (MaxProcEvents per message, sizes, rates). Cancel ctx to end it.
func (c *Client) ProcEvents(ctx context.Context) (*connect.ServerStreamForClient[agentv1.ProcEventsResponse], error) {
	if err := c.Require(VersionProcAudit, "process audit"); err != nil {
		return nil, err
	}
	st, err := c.Agent.ProcEvents(ctx, connect.NewRequest(&agentv1.ProcEventsRequest{}))
	if err != nil {
		return nil, fmt.Errorf("process events: %w", err)
	}
	return st, nil
}

// Done is closed when the HTTP/2 session is unusable (guest gone).
func (c *Client) Alive() bool {
	c.mu.Lock()
	cc := c.cc
	c.mu.Unlock()
	return cc != nil && cc.CanTakeNewRequest()
}

// Close ends the session and closes the underlying conn.
func (c *Client) Close() error {
	c.mu.Lock()
	cc, conn := c.cc, c.conn
	c.mu.Unlock()
	var errs []error
	if cc != nil {
		errs = append(errs, cc.Close())
	}
	if conn != nil {
		if err := conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
