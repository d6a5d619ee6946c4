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
	"github.com/airlock-sandbox/airlock/internal/runtime/fake"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// codeRun is what a RunCode delivered.
type codeRun struct {
	stdout, stderr bytes.Buffer
	results        []*agentv1.CodeResult
	errs           []*agentv1.CodeError
	end            *agentv1.CodeEnd
}

func runCode(t *testing.T, m *sandbox.Manager, id string, req *agentv1.RunCodeRequest) (*codeRun, error) {
	t.Helper()
	var r codeRun
	err := m.RunCode(t.Context(), id, req, func(ev *agentv1.RunCodeEvent) error {
		if r.end != nil {
			return errors.New("event after end")
		}
		switch e := ev.GetEvent().(type) {
		case *agentv1.RunCodeEvent_Stdout:
			r.stdout.Write(e.Stdout)
		case *agentv1.RunCodeEvent_Stderr:
			r.stderr.Write(e.Stderr)
		case *agentv1.RunCodeEvent_Result:
			r.results = append(r.results, e.Result)
		case *agentv1.RunCodeEvent_Error:
			r.errs = append(r.errs, e.Error)
		case *agentv1.RunCodeEvent_End:
			r.end = e.End
		}
		return nil
	})
	if err == nil && r.end == nil {
		t.Fatal("RunCode returned nil without an end event")
	}
	return &r, err
}

func TestContextsThroughShimAndManager(t *testing.T) {
	h := newHarness(t, time.Hour)
	m := h.manager()
	ctx := t.Context()

	r, err := runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "x = 21"})
	if err != nil || len(r.results) != 0 || r.end.GetContextId() == "" {
		t.Fatalf("x = 21: %+v %v", r, err)
	}
	def := r.end.GetContextId()
	r, err = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "x * 2"})
	if err != nil || len(r.results) != 1 || string(r.results[0].GetData()["text/plain"]) != "42" || !r.results[0].GetIsMainResult() {
		t.Fatalf("x * 2: %+v %v", r, err)
	}
	if r.end.GetExecutionCount() != 2 || r.end.GetContextId() != def {
		t.Fatalf("end: %v", r.end)
	}
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "print(x)\nplot()"})
	if r.stdout.String() != "21\n" || len(r.results) != 1 || !bytes.Equal(r.results[0].GetData()["image/png"], fake.FakePNG) {
		t.Fatalf("print+plot: %q %v", r.stdout.String(), r.results)
	}
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "1/0"})
	if len(r.errs) != 1 || r.errs[0].GetName() != "ZeroDivisionError" || len(r.errs[0].GetTraceback()) == 0 {
		t.Fatalf("1/0: %v", r.errs)
	}
	start := time.Now()
	r, err = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "while True: pass", TimeoutMs: 200})
	if err != nil || !r.end.GetTimedOut() || time.Since(start) > 5*time.Second {
		t.Fatalf("timeout: %v %v", r.end, err)
	}
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "x", ContextId: def})
	if len(r.results) != 1 || string(r.results[0].GetData()["text/plain"]) != "21" {
		t.Fatalf("state after timeout: %v", r.results)
	}
	// Output cap.
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "flood(300000)", MaxOutputBytes: 100000})
	if r.stdout.Len() != 100000 || !r.end.GetTruncated() {
		t.Fatalf("cap: %d %v", r.stdout.Len(), r.end)
	}

	// Named contexts: separate state, other languages.
	js, err := m.CreateContext(ctx, h.id, &agentv1.CreateContextRequest{Language: "javascript", Id: "js1"})
	if err != nil || js.GetId() != "js1" || js.GetLanguage() != "javascript" {
		t.Fatalf("create js: %v %v", js, err)
	}
	if _, err := m.CreateContext(ctx, h.id, &agentv1.CreateContextRequest{Id: "js1"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate id: %v", err)
	}
	if _, err := runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "let y = 5", ContextId: "js1"}); err != nil {
		t.Fatal(err)
	}
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "y * 3", ContextId: "js1"})
	if len(r.results) != 1 || string(r.results[0].GetData()["text/plain"]) != "15" {
		t.Fatalf("js state: %v", r.results)
	}
	if _, err := runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "n=4", Language: "bash"}); err != nil {
		t.Fatal(err)
	}
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "echo $n", Language: "bash"})
	if r.stdout.String() != "4\n" {
		t.Fatalf("bash state: %q", r.stdout.String())
	}
	list, err := m.ListContexts(ctx, h.id)
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := m.RestartContext(ctx, h.id, "js1"); err != nil {
		t.Fatal(err)
	}
	r, _ = runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "y", ContextId: "js1"})
	if len(r.errs) != 1 || r.errs[0].GetName() != "ReferenceError" {
		t.Fatalf("after restart: %v", r.errs)
	}
	// Interrupt a long run.
	done := make(chan *codeRun, 1)
	go func() {
		r, _ := runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "sleep(30)", ContextId: "js1"})
		done <- r
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		list, _ := m.ListContexts(ctx, h.id)
		busy := false
		for _, c := range list {
			busy = busy || (c.GetId() == "js1" && c.GetState() == "busy")
		}
		if busy || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := m.InterruptContext(ctx, h.id, "js1"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if len(r.errs) != 1 || r.errs[0].GetName() != "KeyboardInterrupt" {
			t.Fatalf("interrupt: %v", r.errs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not end the run")
	}
	if err := m.DeleteContext(ctx, h.id, "js1"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteContext(ctx, h.id, "js1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := runCode(t, m, h.id, &agentv1.RunCodeRequest{Code: "1", ContextId: "js1"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("run in deleted: %v", err)
	}

	// Host-side validation: never reaches the guest.
	for _, req := range []*agentv1.RunCodeRequest{{Language: "cobol"}, {ContextId: "../x"}, {Code: strings.Repeat("x", sandbox.MaxCodeBytes+1)}} {
		if _, err := runCode(t, m, h.id, req); !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("%v: %v", req.GetLanguage(), err)
		}
	}
	if err := m.DeleteContext(ctx, h.id, "Bad ID"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bad id: %v", err)
	}
	// The shim itself refuses bad ids from a direct client too.
	c, closeFn := sandbox.ShimClient(h.l.Socket(h.id))
	_, err = c.Contexts.Delete(ctx, connect.NewRequest(&agentv1.DeleteContextRequest{Id: "../etc"}))
	closeFn()
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("shim bad id: %v", err)
	}
	h.stop(t)
	if _, err := m.ListContexts(ctx, h.id); err == nil {
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
		for i := range sandbox.MaxResultEntries + 1 {
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
// version v) and returns a manager-like client of it.
func relayContexts(t *testing.T, h agentv1connect.ContextServiceHandler, v uint32) agentv1connect.ContextServiceClient {
	t.Helper()
	host, guest := net.Pipe()
	ha := versionAgent{v: v}
	mux := agentapi.NewHandler(ha, hostileAgent{}, hostileAgent{})
	mux.Handle(agentv1connect.NewContextServiceHandler(h))
	go func() { _ = agentapi.Serve(context.Background(), guest, mux) }()
	ac, err := agentapi.Dial(t.Context(), host, agentapi.Options{MaxMessageBytes: sandbox.MaxCodeMessageBytes})
	if err != nil {
		t.Fatal(err)
	}
	smux := http.NewServeMux()
	smux.Handle(agentv1connect.NewContextServiceHandler(&contextRelay{agent: ac}))
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: smux, Protocols: &p}
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	c, closeFn := sandbox.ShimClient(sock)
	t.Cleanup(func() { closeFn(); srv.Close(); ac.Close(); guest.Close() })
	return c.Contexts
}

type versionAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	v uint32
}

func (a versionAgent) Info(context.Context, *connect.Request[agentv1.InfoRequest]) (*connect.Response[agentv1.InfoResponse], error) {
	return connect.NewResponse(&agentv1.InfoResponse{ProtocolVersion: a.v}), nil
}

func collect(t *testing.T, c agentv1connect.ContextServiceClient, req *agentv1.RunCodeRequest) (*codeRun, error) {
	t.Helper()
	st, err := c.Run(t.Context(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var r codeRun
	for st.Receive() {
		switch e := st.Msg().GetEvent().(type) {
		case *agentv1.RunCodeEvent_Stdout:
			r.stdout.Write(e.Stdout)
		case *agentv1.RunCodeEvent_Result:
			r.results = append(r.results, e.Result)
		case *agentv1.RunCodeEvent_Error:
			r.errs = append(r.errs, e.Error)
		case *agentv1.RunCodeEvent_End:
			if r.end != nil {
				t.Fatal("second end")
			}
			r.end = e.End
		default:
			t.Fatalf("relay forwarded %T", e)
		}
	}
	return &r, st.Err()
}

func TestContextRelayAgainstHostileAgent(t *testing.T) {
	old := timeoutGrace
	timeoutGrace = 100 * time.Millisecond
	t.Cleanup(func() { timeoutGrace = old })
	c := relayContexts(t, hostileContexts{}, agentapi.ProtocolVersion)

	start := time.Now()
	r, err := collect(t, c, &agentv1.RunCodeRequest{Code: "hang", TimeoutMs: 100, ContextId: "c1"})
	if err != nil || r.end == nil || !r.end.GetTimedOut() || r.end.GetContextId() != "c1" {
		t.Fatalf("hang: %+v %v", r, err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("host deadline took %s", el)
	}

	r, err = collect(t, c, &agentv1.RunCodeRequest{Code: "flood", TimeoutMs: 2000, MaxOutputBytes: 1 << 20})
	if err != nil || r.stdout.Len() != 1<<20 || !r.end.GetTruncated() {
		t.Fatalf("flood: %d %v %v", r.stdout.Len(), r.end, err)
	}

	r, err = collect(t, c, &agentv1.RunCodeRequest{Code: "results", MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.results) != 1 || string(r.results[0].GetData()["text/plain"]) != "ok" {
		t.Fatalf("results: %v", r.results)
	}
	if !r.end.GetTruncated() || r.end.GetContextId() != "" {
		t.Fatalf("end: %v", r.end)
	}
	if len(r.errs) != 1 || len(r.errs[0].GetName()) > maxErrorName || len(r.errs[0].GetTraceback()) > maxTracebackLines+1 {
		t.Fatalf("error not bounded: %d %d", len(r.errs[0].GetName()), len(r.errs[0].GetTraceback()))
	}

	if _, err := c.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("bad info from guest: %v", err)
	}
	if _, err := c.Create(t.Context(), connect.NewRequest(&agentv1.CreateContextRequest{Language: "cobol"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("bad language: %v", err)
	}
}

func TestContextRelayRefusesOldAgent(t *testing.T) {
	c := relayContexts(t, hostileContexts{}, agentapi.VersionContexts-1)
	_, err := c.List(t.Context(), connect.NewRequest(&agentv1.ListContextsRequest{}))
	if connect.CodeOf(err) != connect.CodeUnimplemented || !strings.Contains(err.Error(), "too old") {
		t.Fatalf("old agent: %v", err)
	}
}
