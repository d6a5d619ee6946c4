// Package agentapi is the host<->guest protocol: generated Connect code for
// proto/airlock/agent/v1 (in agentv1/), the guest-side Serve and the host-side
// Client that treats every byte from the guest as hostile.
//
// Wire: on each host connection the guest writes Banner, then serves HTTP/2
// without TLS on the rest of the byte stream. The host reads the banner
// (skipping at most MaxPreBanner bytes of leftovers from an earlier session),
// then is the HTTP/2 client. Only the host opens streams.
package agentapi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/http2"

	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
)

// Banner is the first thing the guest writes on every new host connection.
const Banner = "\nAIRLOCK-AGENT/1 READY\n"

// ProtocolVersion is the version this build speaks. Bump it when an RPC or
// a request field that an older agent would ignore is added, and record
// below which version introduced it.
const ProtocolVersion = VersionWarm

// SessionClosed is the byte a gVisor sandbox's agent writes on its control
// channel (stdin) once it has closed a session's socket (internal/agent's
// ContainerArg describes that channel).
const SessionClosed = 'C'

// MaxPreBanner caps the bytes the host discards while looking for the
// banner (bytes a previous session left in the channel).
const MaxPreBanner = 64 << 10

// ErrNoBanner means the guest did not send the banner: not an airlock
// agent, a protocol mismatch, or a hostile guest.
var ErrNoBanner = errors.New("agent did not announce itself")

// NewHandler returns the guest's HTTP handler serving the three services.
// Extra handlers (e.g. ContextService) are added with Handle on the result.
func NewHandler(agent agentv1connect.AgentServiceHandler, exec agentv1connect.ExecServiceHandler, files agentv1connect.FileServiceHandler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(agent))
	mux.Handle(agentv1connect.NewExecServiceHandler(exec))
	mux.Handle(agentv1connect.NewFileServiceHandler(files))
	return mux
}

// Serve is the guest side of one host connection: it writes the banner, then
// serves h as HTTP/2 on conn until the connection ends or ctx is done. It
// returns when the session is over; the caller closes conn.
func Serve(ctx context.Context, conn net.Conn, h http.Handler) error {
	if _, err := io.WriteString(conn, Banner); err != nil {
		return fmt.Errorf("write banner: %w", err)
	}
	srv := &http2.Server{
		MaxConcurrentStreams: 256,
		MaxReadFrameSize:     1 << 20,
		// If the host vanished without the guest seeing EOF (a close and a
		// reconnect too close together for virtio_console to report), the
		// dead session is detected by a missed PING and the agent goes back
		// to announcing itself. Generous, so a starved guest (fork bomb
		// under TCG) does not drop a live host.
		ReadIdleTimeout: 15 * time.Second,
		PingTimeout:     15 * time.Second,
	}
	srv.ServeConn(conn, &http2.ServeConnOpts{Context: ctx, Handler: h})
	return nil
}

// readBanner consumes bytes from r up to and including the banner.
func readBanner(r *bufio.Reader) error {
	want := []byte(Banner)
	var window []byte
	for n := 0; n < MaxPreBanner+len(want); n++ {
		b, err := r.ReadByte()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrNoBanner, err)
		}
		window = append(window, b)
		if len(window) > len(want) {
			window = window[1:]
		}
		if bytes.Equal(window, want) {
			return nil
		}
	}
	return fmt.Errorf("%w: no banner in the first %d bytes", ErrNoBanner, MaxPreBanner)
}

// bufferedConn is a net.Conn whose reads go through a bufio.Reader that may
// hold bytes read past the banner.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// waitBanner reads the banner from conn, honouring ctx, and returns a conn
// that yields the bytes after it.
func waitBanner(ctx context.Context, conn net.Conn) (net.Conn, error) {
	br := bufio.NewReaderSize(conn, 4096)
	done := make(chan error, 1)
	go func() { done <- readBanner(br) }()
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		// Unblock the reader, then wait for it so no goroutine outlives us.
		_ = conn.SetReadDeadline(time.Unix(1, 0))
		<-done //nolint:errcheck // the reader's error is the deadline just set; staticcheck S1005 refuses "_ ="
		_ = conn.SetReadDeadline(time.Time{})
		return nil, fmt.Errorf("wait for agent: %w", context.Cause(ctx))
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

// Protocol versions that introduced RPCs (for Client.Require).
const (
	// VersionContexts added ContextService.
	VersionContexts = 2
	// VersionNetwork added SyncRequest.network (guest network config).
	// An older agent ignores the field: check before relying on it.
	VersionNetwork = 3
	// VersionTerminal: ExecStart.tty and ExecRequest.resize (execs on a
	// pseudo-terminal).
	VersionTerminal = 4
	// VersionWatch added FileService.Rename, FileService.Watch and
	// AgentService.Usage.
	VersionWatch = 5
	// VersionArchive added FileService.WriteTar and FileService.ReadTar
	// (directories as tar streams); ContextInfo.exit (how a dead
	// context's interpreter ended) and Create of default-<language>
	// arrived with it (an older agent leaves exit unset).
	VersionArchive = 6
	// VersionVolumes added SyncRequest.volumes (ext4 volumes on virtio-blk
	// devices). An older agent ignores the field: check before relying
	// on it.
	VersionVolumes = 7
	// VersionPark added ExecRequest.park, ExecStart.adopt,
	// ExecResponse.parked and ExecService.ListParked (execs kept across a
	// pause). An older agent ignores park and adopt: check before sending
	// them.
	VersionPark = 8
	// VersionProcAudit added AgentService.ProcEvents (the guest's execs
	// and exits, for the audit trail).
	VersionProcAudit = 9
	// VersionWarm added CreateContextRequest.warm (a template's warm
	// default Python context). An older agent would start a listed
	// default context instead: check before sending it.
	VersionWarm = 10
)
