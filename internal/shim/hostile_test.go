package shim

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// hostileAgent ignores exec timeouts and floods output.
type hostileAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	agentv1connect.UnimplementedExecServiceHandler
	agentv1connect.UnimplementedFileServiceHandler
}

func (hostileAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{ProtocolVersion: agentapi.ProtocolVersion}), nil
}

func (hostileAgent) Exec(ctx context.Context, st *connect.BidiStream[agentv1.ExecRequest, agentv1.ExecResponse]) error {
	first, err := st.Receive()
	if err != nil {
		return err
	}
	chunk := make([]byte, 32<<10)
	for {
		if first.GetStart().GetArgv()[0] == "flood" {
			if err := st.Send(&agentv1.ExecResponse{Event: &agentv1.ExecResponse_Stdout{Stdout: chunk}}); err != nil {
				return err
			}
			continue
		}
		select { // "hang": never report the timeout
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Hour):
		}
	}
}

// relayOverHostileAgent serves the relay on a unix socket, forwarding to a
// hostile agent over net.Pipe, and returns a client for it.
func relayOverHostileAgent(t *testing.T) *agentapi.Client {
	t.Helper()
	host, guest := net.Pipe()
	h := hostileAgent{}
	go func() { _ = agentapi.Serve(context.Background(), guest, agentapi.NewHandler(h, h, h)) }()
	ac, err := agentapi.Dial(t.Context(), host, agentapi.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{agent: ac}
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewExecServiceHandler(r))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &p}
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	c, closeFn := sandbox.ShimClient(sock)
	t.Cleanup(func() { closeFn(); srv.Close(); ac.Close(); guest.Close() })
	return c
}

func TestRelayEnforcesTimeoutAgainstHostileAgent(t *testing.T) {
	old := timeoutGrace
	timeoutGrace = 200 * time.Millisecond
	t.Cleanup(func() { timeoutGrace = old })
	c := relayOverHostileAgent(t)
	start := time.Now()
	ex, err := sandbox.Exec(t.Context(), c, &agentv1.ExecStart{Argv: []string{"hang"}, TimeoutMs: 100}, sandbox.ExecIO{})
	if err != nil {
		t.Fatal(err)
	}
	if !ex.GetTimedOut() {
		t.Fatalf("exit %v: want timed_out from the host", ex)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("host-side timeout took %s", el)
	}
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

func TestRelayCapsOutputOfHostileAgent(t *testing.T) {
	old := timeoutGrace
	timeoutGrace = 0
	t.Cleanup(func() { timeoutGrace = old })
	c := relayOverHostileAgent(t)
	var w countWriter
	ex, err := sandbox.Exec(t.Context(), c, &agentv1.ExecStart{Argv: []string{"flood"}, TimeoutMs: 3000, MaxOutputBytes: 1 << 20}, sandbox.ExecIO{Stdout: &w})
	if err != nil {
		t.Fatal(err)
	}
	if w.n != 1<<20 || !ex.GetOutputTruncated() {
		t.Fatalf("got %d bytes, truncated=%v; want exactly 1 MiB and truncated", w.n, ex.GetOutputTruncated())
	}
}
