package shim

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/agentapi"
	agentv1 "github.com/airlock-sandbox/airlock/internal/agentapi/agentv1"
	"github.com/airlock-sandbox/airlock/internal/agentapi/agentv1/agentv1connect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2"
	"github.com/airlock-sandbox/airlock/internal/shimapi/shimv2/shimv2connect"
	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// codeRun is what a RunCode delivered.
type codeRun struct {
	stdout, stderr bytes.Buffer
	results        []*guest.CodeResult
	errs           []*guest.CodeError
	end            *guest.CodeEnd
}

func runCode(t *testing.T, m *sandbox.Manager, id string, req guest.CodeRequest) (*codeRun, error) {
	t.Helper()
	var r codeRun
	err := m.RunCode(t.Context(), sandbox.Local(), id, req, func(ev guest.CodeEvent) error {
		if r.end != nil {
			return errors.New("event after end")
		}
		switch ev.Kind {
		case guest.EventStdout:
			r.stdout.Write(ev.Data)
		case guest.EventStderr:
			r.stderr.Write(ev.Data)
		case guest.EventResult:
			r.results = append(r.results, ev.Result)
		case guest.EventError:
			r.errs = append(r.errs, ev.Error)
		case guest.EventEnd:
			r.end = ev.End
		}
		return nil
	})
	if err == nil && r.end == nil {
		t.Fatal("RunCode returned nil without an end event")
	}
	return &r, err
}

func TestContextsThroughShimAndManager(t *testing.T) {
	t.Parallel()
	h := newHarness(t, time.Hour)
	m := h.manager()
	ctx := t.Context()

	r, err := runCode(t, m, h.id, guest.CodeRequest{Code: "x = 21"})
	if err != nil || len(r.results) != 0 || r.end.ContextID == "" {
		t.Fatalf("x = 21: %+v %v", r, err)
	}
	def := r.end.ContextID
	r, err = runCode(t, m, h.id, guest.CodeRequest{Code: "x * 2"})
	if err != nil || len(r.results) != 1 || string(r.results[0].Data["text/plain"]) != "42" || !r.results[0].Main {
		t.Fatalf("x * 2: %+v %v", r, err)
	}
	if r.end.ExecutionCount != 2 || r.end.ContextID != def {
		t.Fatalf("end: %v", r.end)
	}
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "print(x)\nplot()"})
	if r.stdout.String() != "21\n" || len(r.results) != 1 || !bytes.Equal(r.results[0].Data["image/png"], fake.FakePNG) {
		t.Fatalf("print+plot: %q %v", r.stdout.String(), r.results)
	}
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "1/0"})
	if len(r.errs) != 1 || r.errs[0].Name != "ZeroDivisionError" || len(r.errs[0].Traceback) == 0 {
		t.Fatalf("1/0: %v", r.errs)
	}
	start := time.Now()
	r, err = runCode(t, m, h.id, guest.CodeRequest{Code: "while True: pass", Timeout: 200 * time.Millisecond})
	if err != nil || !r.end.TimedOut || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %v %v", r.end, err)
	}
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "x", ContextID: def})
	if len(r.results) != 1 || string(r.results[0].Data["text/plain"]) != "21" {
		t.Fatalf("state after timeout: %v", r.results)
	}
	// Output cap.
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "flood(300000)", MaxOutputBytes: 100000})
	if r.stdout.Len() != 100000 || !r.end.Truncated {
		t.Fatalf("cap: %d %v", r.stdout.Len(), r.end)
	}

	// Named contexts: separate state, other languages.
	js, err := m.CreateContext(ctx, sandbox.Local(), h.id, guest.ContextSpec{Language: "javascript", ID: "js1"})
	if err != nil || js.ID != "js1" || js.Language != "javascript" {
		t.Fatalf("create js: %v %v", js, err)
	}
	if _, err := m.CreateContext(ctx, sandbox.Local(), h.id, guest.ContextSpec{ID: "js1"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate id: %v", err)
	}
	if _, err := runCode(t, m, h.id, guest.CodeRequest{Code: "let y = 5", ContextID: "js1"}); err != nil {
		t.Fatal(err)
	}
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "y * 3", ContextID: "js1"})
	if len(r.results) != 1 || string(r.results[0].Data["text/plain"]) != "15" {
		t.Fatalf("js state: %v", r.results)
	}
	if _, err := runCode(t, m, h.id, guest.CodeRequest{Code: "n=4", Language: "bash"}); err != nil {
		t.Fatal(err)
	}
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "echo $n", Language: "bash"})
	if r.stdout.String() != "4\n" {
		t.Fatalf("bash state: %q", r.stdout.String())
	}
	list, err := m.ListContexts(ctx, sandbox.Local(), h.id)
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := m.RestartContext(ctx, sandbox.Local(), h.id, "js1"); err != nil {
		t.Fatal(err)
	}
	r, _ = runCode(t, m, h.id, guest.CodeRequest{Code: "y", ContextID: "js1"})
	if len(r.errs) != 1 || r.errs[0].Name != "ReferenceError" {
		t.Fatalf("after restart: %v", r.errs)
	}
	// Interrupt a long run.
	done := make(chan *codeRun, 1)
	go func() {
		r, _ := runCode(t, m, h.id, guest.CodeRequest{Code: "sleep(30)", ContextID: "js1"})
		done <- r
	}()
	if !testutil.WaitFor(t, 5*time.Second, func() bool {
		list, _ := m.ListContexts(ctx, sandbox.Local(), h.id)
		for _, c := range list {
			if c.ID == "js1" && c.State == "busy" {
				return true
			}
		}
		return false
	}) {
		t.Fatal("context js1 never became busy")
	}
	if err := m.InterruptContext(ctx, sandbox.Local(), h.id, "js1"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if len(r.errs) != 1 || r.errs[0].Name != "KeyboardInterrupt" {
			t.Fatalf("interrupt: %v", r.errs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not end the run")
	}
	if err := m.DeleteContext(ctx, sandbox.Local(), h.id, "js1"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteContext(ctx, sandbox.Local(), h.id, "js1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := runCode(t, m, h.id, guest.CodeRequest{Code: "1", ContextID: "js1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("run in deleted: %v", err)
	}

	// Host-side validation: never reaches the guest.
	for _, req := range []guest.CodeRequest{{Language: "cobol"}, {ContextID: "../x"}, {Code: strings.Repeat("x", guest.MaxCodeBytes+1)}} {
		if _, err := runCode(t, m, h.id, req); !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("%v: %v", req.Language, err)
		}
	}
	if err := m.DeleteContext(ctx, sandbox.Local(), h.id, "Bad ID"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bad id: %v", err)
	}
	// The shim itself refuses bad ids from a direct client too.
	c := shimv2connect.NewContextServiceClient(h2c(t, h.l.Socket(h.id)), "http://shim")
	_, err = c.Delete(ctx, connect.NewRequest(&shimv2.DeleteContextRequest{Id: "../etc"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("shim bad id: %v", err)
	}
	h.stop(t)
	if _, err := m.ListContexts(ctx, sandbox.Local(), h.id); err == nil {
		t.Fatal("list after stop")
	}
}

// hostileContexts floods, hangs, sends oversized results and unknown
// events, and never ends on its own.
type hostileContexts struct {
	agentv1connect.UnimplementedContextServiceHandler
}

func (hostileContexts) Run(ctx context.Context, req *connect.Request[agentv1.RunCodeRequest], st *connect.ServerStream[agentv1.RunCodeEvent]) error {
	send := func(ev *agentv1.RunCodeEvent) error { return st.Send(ev) }
	switch req.Msg.GetCode() {
	case "flood":
		chunk := make([]byte, 32<<10)
		for {
			if err := send(&agentv1.RunCodeEvent{Event: &agentv1.RunCodeEvent_Stdout{Stdout: chunk}}); err != nil {
				return err
			}
		}
	case "results":
		many := map[string][]byte{}
		for i := range guest.MaxResultEntries + 1 {
			many["text/x"+string(rune('a'+i))] = []byte("v")
		}
		for _, ev := range []*agentv1.RunCodeEvent{
			{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{Data: many}}},
			{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{Data: map[string][]byte{"not a mime": []byte("v")}}}},
			{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{Data: map[string][]byte{"image/png": make([]byte, 2<<20)}}}},
			{}, // unknown (empty) event
			{Event: &agentv1.RunCodeEvent_Error{Error: &agentv1.CodeError{Name: strings.Repeat("E", 10000), Traceback: make([]string, 10000)}}},
			{Event: &agentv1.RunCodeEvent_Result{Result: &agentv1.CodeResult{Data: map[string][]byte{"text/plain": []byte("ok")}, IsMainResult: true}}},
			{Event: &agentv1.RunCodeEvent_End{End: &agentv1.CodeEnd{ContextId: "../../etc"}}},
		} {
			if err := send(ev); err != nil {
				return err
			}
		}
		return nil
	}
	<-ctx.Done() // "hang": ignore the timeout
	return ctx.Err()
}

func (hostileContexts) Create(context.Context, *connect.Request[agentv1.CreateContextRequest]) (*connect.Response[agentv1.ContextInfo], error) {
	return connect.NewResponse(&agentv1.ContextInfo{Id: "../evil", Language: "python"}), nil
}

// relayContexts serves the context relay over agent h (reporting protocol
// version v) and returns a client of the shim's ContextService.
func relayContexts(t *testing.T, h agentv1connect.ContextServiceHandler, v uint32) shimv2connect.ContextServiceClient {
	t.Helper()
	return relayContextsGrace(t, h, v, timeoutGrace)
}

// relayContextsGrace is relayContexts with the host's deadline grace past a
// run's timeout.
func relayContextsGrace(t *testing.T, h agentv1connect.ContextServiceHandler, v uint32, grace time.Duration) shimv2connect.ContextServiceClient {
	t.Helper()
	host, guestEnd := net.Pipe()
	ha := versionAgent{v: v}
	mux := agentapi.NewHandler(ha, hostileAgent{}, hostileAgent{})
	mux.Handle(agentv1connect.NewContextServiceHandler(h))
	go func() { _ = agentapi.Serve(context.Background(), guestEnd, mux) }()
	ac, err := agentapi.Dial(t.Context(), host, agentapi.Options{MaxMessageBytes: guest.MaxCodeMessageBytes})
	if err != nil {
		t.Fatal(err)
	}
	smux := http.NewServeMux()
	smux.Handle(shimv2connect.NewContextServiceHandler(&contextRelay{agent: ac, grace: grace}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: smux, Protocols: &p}
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); ac.Close(); guestEnd.Close() })
	return shimv2connect.NewContextServiceClient(h2c(t, sock), "http://shim", connect.WithReadMaxBytes(guest.MaxCodeMessageBytes))
}

type versionAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	v uint32
}

func (a versionAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{ProtocolVersion: a.v}), nil
}

func collect(t *testing.T, c shimv2connect.ContextServiceClient, req *shimv2.RunCodeRequest) (*codeRun, error) {
	t.Helper()
	st, err := c.Run(t.Context(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var r codeRun
	for st.Receive() {
		switch e := st.Msg().GetEvent().(type) {
		case *shimv2.CodeEvent_Stdout:
			r.stdout.Write(e.Stdout)
		case *shimv2.CodeEvent_Result:
			r.results = append(r.results, &guest.CodeResult{Data: e.Result.GetData(), Main: e.Result.GetMain()})
		case *shimv2.CodeEvent_Error:
			r.errs = append(r.errs, &guest.CodeError{Name: e.Error.GetName(), Value: e.Error.GetValue(), Traceback: e.Error.GetTraceback()})
		case *shimv2.CodeEvent_End:
			if r.end != nil {
				t.Fatal("second end")
			}
			r.end = &guest.CodeEnd{TimedOut: e.End.GetTimedOut(), Truncated: e.End.GetTruncated(), ContextID: e.End.GetContextId()}
		default:
			t.Fatalf("relay forwarded %T", e)
		}
	}
	return &r, st.Err()
}

func TestContextRelayAgainstHostileAgent(t *testing.T) {
	t.Parallel()
	c := relayContextsGrace(t, hostileContexts{}, agentapi.ProtocolVersion, 100*time.Millisecond)

	start := time.Now()
	r, err := collect(t, c, &shimv2.RunCodeRequest{Code: "hang", TimeoutMs: 100, ContextId: "c1"})
	if err != nil || r.end == nil || !r.end.TimedOut || r.end.ContextID != "c1" {
		t.Fatalf("hang: %+v %v", r, err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("host deadline took %s", el)
	}

	r, err = collect(t, c, &shimv2.RunCodeRequest{Code: "flood", TimeoutMs: 2000, MaxOutputBytes: 1 << 20})
	if err != nil || r.stdout.Len() != 1<<20 || !r.end.Truncated {
		t.Fatalf("flood: %d %v %v", r.stdout.Len(), r.end, err)
	}

	r, err = collect(t, c, &shimv2.RunCodeRequest{Code: "results", MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.results) != 1 || string(r.results[0].Data["text/plain"]) != "ok" {
		t.Fatalf("results: %v", r.results)
	}
	if !r.end.Truncated || r.end.ContextID != "" {
		t.Fatalf("end: %v", r.end)
	}
	if len(r.errs) != 1 || len(r.errs[0].Name) > maxErrorName || len(r.errs[0].Traceback) > maxTracebackLines+1 {
		t.Fatalf("error not bounded: %d %d", len(r.errs[0].Name), len(r.errs[0].Traceback))
	}

	if _, err := c.Create(t.Context(), connect.NewRequest(&shimv2.CreateContextRequest{})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("bad info from guest: %v", err)
	}
	if _, err := c.Create(t.Context(), connect.NewRequest(&shimv2.CreateContextRequest{Language: "cobol"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad language: %v", err)
	}
}

func TestContextRelayRefusesOldAgent(t *testing.T) {
	t.Parallel()
	c := relayContexts(t, hostileContexts{}, agentapi.VersionContexts-1)
	_, err := c.List(t.Context(), connect.NewRequest(&shimv2.ListContextsRequest{}))
	if connect.CodeOf(err) != connect.CodeUnimplemented || !strings.Contains(err.Error(), "too old") {
		t.Fatalf("old agent: %v", err)
	}
}
