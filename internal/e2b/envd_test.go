package e2b

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/process"
	"github.com/airlock-sandbox/airlock/internal/e2b/envdpb/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/errdefs"
	"github.com/airlock-sandbox/airlock/internal/guest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// fakeExecs runs nothing: an exec prints its argv on stdout and "e" on
// stderr, then exits with the number its last argument names (or is
// killed by the signal of "sig<N>").
type fakeExecs struct {
	mu      sync.Mutex
	specs   []guest.ExecSpec
	callers []sandbox.Caller
	running []guest.ExecInfo
	signals []int
}

type fakeStream struct {
	info guest.ExecInfo
	evs  []guest.ExecEvent
	f    *fakeExecs
}

func (s *fakeStream) Info() guest.ExecInfo { return s.info }
func (s *fakeStream) Recv() (guest.ExecEvent, error) {
	if len(s.evs) == 0 {
		return guest.ExecEvent{}, io.EOF
	}
	ev := s.evs[0]
	s.evs = s.evs[1:]
	return ev, nil
}
func (s *fakeStream) Stdin([]byte) error          { return nil }
func (s *fakeStream) CloseStdin() error           { return nil }
func (s *fakeStream) Resize(guest.TermSize) error { return nil }
func (s *fakeStream) Signal(sig int) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.signals = append(s.f.signals, sig)
	return nil
}
func (s *fakeStream) Finish() error { return nil }
func (s *fakeStream) Close()        {}

func (f *fakeExecs) Exec(_ context.Context, c sandbox.Caller, _ string, spec guest.ExecSpec, _ bool) (guest.ExecStream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.specs = append(f.specs, spec)
	f.callers = append(f.callers, c)
	if spec.Argv[0] == "missing" {
		return nil, &guest.StartError{Reason: "no such program", NotFound: true}
	}
	exit := &guest.ExitStatus{}
	last := spec.Argv[len(spec.Argv)-1]
	if n, ok := strings.CutPrefix(last, "sig"); ok {
		exit.Code, exit.Signal = -1, atoi(n)
	} else {
		exit.Code = atoi(last)
	}
	return &fakeStream{f: f, info: guest.ExecInfo{ID: "x", PID: 41 + len(f.specs)}, evs: []guest.ExecEvent{
		{Kind: guest.ExecStdout, Data: []byte(strings.Join(spec.Argv, " "))},
		{Kind: guest.ExecStderr, Data: []byte("e")},
		{Kind: guest.ExecExited, Exit: exit},
	}}, nil
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }

func (f *fakeExecs) AttachExec(context.Context, sandbox.Caller, string, string, bool) (guest.ExecStream, error) {
	return nil, errors.New("not used")
}

func (f *fakeExecs) ExecControl(_ context.Context, _ sandbox.Caller, _, id string) (guest.ExecStream, error) {
	return &fakeStream{f: f, info: guest.ExecInfo{ID: id}}, nil
}

func (f *fakeExecs) ListExecs(context.Context, sandbox.Caller, string) ([]guest.ExecInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running, nil
}

func (f *fakeExecs) GetExec(context.Context, sandbox.Caller, string, string) (guest.ExecInfo, error) {
	return guest.ExecInfo{}, guest.ErrNoExec
}

// fakeFiles keeps files in memory.
type fakeFiles struct {
	mu       sync.Mutex
	files    map[string][]byte
	watchers []chan string
}

func (f *fakeFiles) WriteFile(_ context.Context, _ sandbox.Caller, _, p string, _ uint32, r io.Reader) (int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.files == nil {
		f.files = map[string][]byte{}
	}
	f.files[p] = b
	for _, w := range f.watchers {
		select {
		case w <- p:
		default:
		}
	}
	return int64(len(b)), nil
}

func (f *fakeFiles) get(p string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[p]
	return b, ok
}

func (f *fakeFiles) ReadFile(_ context.Context, _ sandbox.Caller, _, p string, w io.Writer, info func(guest.FileInfo)) (int64, error) {
	b, ok := f.get(p)
	if !ok {
		return 0, fmt.Errorf("%w: no such file", errdefs.ErrNotFound)
	}
	info(guest.FileInfo{Path: p, Type: guest.FileRegular, Size: uint64(len(b))})
	n, err := w.Write(b)
	return int64(n), err
}

func (f *fakeFiles) StatFile(_ context.Context, _ sandbox.Caller, _, p string) (guest.FileInfo, error) {
	if p == "/dir" || p == "/elsewhere" {
		return guest.FileInfo{Path: p, Name: "dir", Type: guest.FileDirectory, Mode: 0o755}, nil
	}
	b, ok := f.get(p)
	if !ok {
		return guest.FileInfo{}, fmt.Errorf("%w: no such file", errdefs.ErrNotFound)
	}
	return guest.FileInfo{Path: p, Name: p[strings.LastIndex(p, "/")+1:], Type: guest.FileRegular, Size: uint64(len(b)), Mode: 0o644, UID: 1000, Mtime: time.Unix(1e9, 0)}, nil
}

func (f *fakeFiles) ListFiles(context.Context, sandbox.Caller, string, string, uint32) (guest.FileList, error) {
	return guest.FileList{}, nil
}
func (f *fakeFiles) Mkdir(context.Context, sandbox.Caller, string, string, bool) error { return nil }
func (f *fakeFiles) RemoveFile(context.Context, sandbox.Caller, string, string, bool) error {
	return fmt.Errorf("%w: no such file", errdefs.ErrNotFound)
}

func (f *fakeFiles) Rename(_ context.Context, _ sandbox.Caller, _, from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.files[from]
	if !ok {
		return fmt.Errorf("%w: no such file", errdefs.ErrNotFound)
	}
	delete(f.files, from)
	f.files[to] = b
	return nil
}

// WatchDir reports the writes WriteFile makes under p after it started.
func (f *fakeFiles) WatchDir(ctx context.Context, _ sandbox.Caller, _, p string, _ bool, started func(), fn func(guest.FileEvent) error) error {
	ch := make(chan string, 16)
	f.mu.Lock()
	f.watchers = append(f.watchers, ch)
	f.mu.Unlock()
	started()
	for {
		select {
		case <-ctx.Done():
			return nil
		case name := <-ch:
			if rel, ok := strings.CutPrefix(name, p+"/"); ok {
				if err := fn(guest.FileEvent{Name: rel, Op: guest.OpCreate}); err != nil {
					return err
				}
			}
		}
	}
}

// envdSandbox creates a sandbox of alice's through the E2B routes and
// returns it.
func (h *harness) envdSandbox() Sandbox {
	h.t.Helper()
	var sb Sandbox
	h.do(h.alice, "POST", "/v2/sandboxes", `{}`).json(h.t, &sb)
	if sb.EnvdAccessToken == nil || len(*sb.EnvdAccessToken) < 32 {
		h.t.Fatalf("create gave no envd access token: %+v", sb)
	}
	return sb
}

// envdClient is a Connect client that speaks to envd as E2B's SDK does:
// JSON codec, the sandbox's headers and, if tok is set, its token.
func (h *harness) envdHTTP(id, tok string) connect.HTTPClient {
	return headerClient{func(r *http.Request) {
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", envdPort)
		if tok != "" {
			r.Header.Set("X-Access-Token", tok)
		}
	}}
}

type headerClient struct{ set func(*http.Request) }

func (c headerClient) Do(r *http.Request) (*http.Response, error) {
	c.set(r)
	return http.DefaultTransport.RoundTrip(r)
}

func TestEnvdAuthAndRouting(t *testing.T) {
	h := newHarness(t)
	sb := h.envdSandbox()
	other := h.envdSandbox()
	ctx := t.Context()
	for name, tok := range map[string]string{"no token": "", "a wrong token": "x", "another sandbox's token": *other.EnvdAccessToken} {
		pc := processconnect.NewProcessClient(h.envdHTTP(sb.SandboxID, tok), h.url, connect.WithProtoJSON())
		if _, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("List with %s: %v, want unauthenticated", name, err)
		}
		st, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}))
		if err == nil {
			for st.Receive() {
				t.Errorf("Start with %s streamed %v", name, st.Msg())
			}
			err = st.Err()
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("Start with %s: %v, want unauthenticated", name, err)
		}
	}
	if len(h.execs.specs) != 0 {
		t.Fatalf("an exec ran without the token: %+v", h.execs.specs)
	}
	// /health needs no token; a missing or paused sandbox is E2B's 502.
	if r := h.do("", "GET", "/health", "", "E2b-Sandbox-Id", sb.SandboxID); r.code != http.StatusNoContent {
		t.Fatalf("health: %d %s", r.code, r.body)
	}
	r := h.do("", "GET", "/health", "", "E2b-Sandbox-Id", "nosuchsandbox")
	if r.code != http.StatusBadGateway || !strings.Contains(string(r.body), `"code":502`) {
		t.Fatalf("health of a missing sandbox: %d %s", r.code, r.body)
	}
	h.do(h.alice, "POST", "/sandboxes/"+other.SandboxID+"/pause", `{}`)
	if r := h.do("", "GET", "/health", "", "E2b-Sandbox-Id", other.SandboxID); r.code != http.StatusBadGateway {
		t.Fatalf("health of a paused sandbox: %d %s", r.code, r.body)
	}
	// The token acts as the sandbox's tenant, and nothing more.
	pc := processconnect.NewProcessClient(h.envdHTTP(sb.SandboxID, *sb.EnvdAccessToken), h.url, connect.WithProtoJSON())
	if _, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{})); err != nil {
		t.Fatal(err)
	}
	st, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true", Args: []string{"0"}}}))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	if c := h.execs.callers; len(c) != 1 || c[0].Tenant != "alice" || c[0].Admin || c[0].Via != "e2b" {
		t.Fatalf("exec callers: %+v", c)
	}
}

func TestEnvdProcess(t *testing.T) {
	h := newHarness(t)
	sb := h.envdSandbox()
	ctx := t.Context()
	pc := processconnect.NewProcessClient(h.envdHTTP(sb.SandboxID, *sb.EnvdAccessToken), h.url, connect.WithProtoJSON())
	run := func(req *process.StartRequest, hdr ...string) ([]*process.ProcessEvent, error) {
		r := connect.NewRequest(req)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header().Set(hdr[i], hdr[i+1])
		}
		// The SDK's Connect-Timeout-Ms, which envd makes the process's
		// lifetime.
		tctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := pc.Start(tctx, r)
		if err != nil {
			return nil, err
		}
		var evs []*process.ProcessEvent
		for st.Receive() {
			evs = append(evs, st.Msg().GetEvent())
		}
		return evs, st.Err()
	}
	stdin := false
	evs, err := run(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "3"}, Envs: map[string]string{"A": "1"}, Cwd: ptr("work")}, Stdin: &stdin},
		"Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 4 || evs[0].GetStart().GetPid() != 42 || string(evs[1].GetData().GetStdout()) != "/bin/bash -l -c 3" || string(evs[2].GetData().GetStderr()) != "e" {
		t.Fatalf("events: %v", evs)
	}
	end := evs[3].GetEnd()
	if end.GetExitCode() != 3 || !end.GetExited() || end.GetStatus() != "exit status 3" || end.GetError() != "exit status 3" {
		t.Fatalf("end: %v", end)
	}
	spec := h.execs.specs[0]
	if spec.User != "user" || spec.Cwd != "/home/user/work" || spec.Stdin || spec.Env["A"] != "1" || spec.Timeout <= 50*time.Second || spec.Timeout > time.Minute {
		t.Fatalf("spec: %+v", spec)
	}
	evs, err = run(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"sig9"}}})
	if err != nil {
		t.Fatal(err)
	}
	if end := evs[len(evs)-1].GetEnd(); end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: killed" || !h.execs.specs[1].Stdin {
		t.Fatalf("killed: %v, stdin %v", end, h.execs.specs[1].Stdin)
	}
	if cwd := h.execs.specs[1].Cwd; cwd != "/root" {
		t.Fatalf("a process with no cwd starts in %q, want root's home", cwd)
	}
	if _, err := run(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "missing"}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a program the guest cannot start: %v", err)
	}
	// A PTY: a terminal of the size asked, its output as pty data.
	evs, err = run(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}}, Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}}})
	if err != nil {
		t.Fatal(err)
	}
	if tty := h.execs.specs[len(h.execs.specs)-1].TTY; tty == nil || tty.Rows != 30 || tty.Cols != 100 || string(evs[1].GetData().GetPty()) != "/bin/bash -i -l" {
		t.Fatalf("pty: spec %+v, events %v", tty, evs)
	}
	if _, err := run(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sh", Cwd: ptr("/a/\x00")}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a NUL in cwd: %v", err)
	}
	// List shows running execs by pid; signals go to the one a pid names.
	h.execs.running = []guest.ExecInfo{{ID: "run1", PID: 7, Argv: []string{"sleep", "60"}, State: guest.ExecStateRunning}, {ID: "done", PID: 8, Argv: []string{"true"}, State: guest.ExecStateExited}}
	ls, err := pc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(ls.Msg.GetProcesses()) != 1 || ls.Msg.GetProcesses()[0].GetPid() != 7 || ls.Msg.GetProcesses()[0].GetConfig().GetCmd() != "sleep" {
		t.Fatalf("list: %v %v", ls, err)
	}
	sig := func(pid uint32, s process.Signal) error {
		_, err := pc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}, Signal: s}))
		return err
	}
	if err := sig(7, process.Signal_SIGNAL_SIGKILL); err != nil || len(h.execs.signals) != 1 || h.execs.signals[0] != 9 {
		t.Fatalf("kill: %v %v", err, h.execs.signals)
	}
	if err := sig(8, process.Signal_SIGNAL_SIGKILL); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("kill of an exited process: %v", err)
	}
	if err := sig(7, process.Signal_SIGNAL_UNSPECIFIED); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("no signal: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestEnvdFiles(t *testing.T) {
	h := newHarness(t)
	sb := h.envdSandbox()
	tok := *sb.EnvdAccessToken
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", envdPort}
	// Multipart, as the SDK's write([...]): each filename a full path.
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, f := range []struct{ path, data string }{{"/tmp/x/a.txt", "A"}, {"rel/b.bin", "B"}} {
		pw, _ := mw.CreateFormFile("file", f.path)
		pw.Write([]byte(f.data)) //nolint:errcheck // a bytes.Buffer
	}
	mw.Close()
	up := func(query, ct string, b []byte, extra ...string) resp {
		return h.do("", "POST", "/files"+query, string(b), append(append(clone(hdr), "Content-Type", ct), extra...)...)
	}
	r := up("", mw.FormDataContentType(), body.Bytes())
	if r.code != 401 {
		t.Fatalf("upload without a token: %d %s", r.code, r.body)
	}
	r = up("", mw.FormDataContentType(), body.Bytes(), "X-Access-Token", tok)
	if r.code != 200 || string(r.body) != `[{"path":"/tmp/x/a.txt","name":"a.txt","type":"file"},{"path":"/root/rel/b.bin","name":"b.bin","type":"file"}]`+"\n" {
		t.Fatalf("upload: %d %s", r.code, r.body)
	}
	if b, _ := h.files.get("/root/rel/b.bin"); string(b) != "B" {
		t.Fatalf("uploaded %q", b)
	}
	// Raw body to ?path=, as the SDK's octet-stream writes.
	if r := up("?path=/tmp/raw", "application/octet-stream", []byte("raw"), "X-Access-Token", tok); r.code != 200 {
		t.Fatalf("octet-stream upload: %d %s", r.code, r.body)
	}
	// Download with the token, with a signed URL, and the errors.
	r = h.do("", "GET", "/files?path=/tmp/x/a.txt", "", append(clone(hdr), "X-Access-Token", tok)...)
	if r.code != 200 || string(r.body) != "A" || r.hdr.Get("Content-Type") != "text/plain; charset=utf-8" || r.hdr.Get("Content-Length") != "1" {
		t.Fatalf("download: %d %v %s", r.code, r.hdr, r.body)
	}
	signed := func(p, op, exp string) string {
		s := p + ":" + op + "::" + tok
		if exp != "" {
			s += ":" + exp
		}
		sum := sha256.Sum256([]byte(s))
		q := "?path=" + p + "&signature=" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
		q = strings.ReplaceAll(strings.ReplaceAll(q, "+", "%2B"), "/", "%2F")
		q = strings.Replace(q, "signature=", "signature=v1_", 1)
		q = strings.Replace(q, "%2Ftmp%2Fraw", "/tmp/raw", 1)
		if exp != "" {
			q += "&signature_expiration=" + exp
		}
		return q
	}
	if r := h.do("", "GET", "/files"+signed("/tmp/raw", "read", ""), "", hdr...); r.code != 200 || string(r.body) != "raw" {
		t.Fatalf("signed download: %d %s", r.code, r.body)
	}
	future := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	past := strconv.FormatInt(time.Now().Add(-time.Minute).Unix(), 10)
	if r := h.do("", "GET", "/files"+signed("/tmp/raw", "read", future), "", hdr...); r.code != 200 {
		t.Fatalf("signed download before expiry: %d %s", r.code, r.body)
	}
	for name, q := range map[string]string{"expired": signed("/tmp/raw", "read", past), "signed for writes": signed("/tmp/raw", "write", ""), "unsigned": "?path=/tmp/raw"} {
		if r := h.do("", "GET", "/files"+q, "", hdr...); r.code != 401 {
			t.Errorf("%s download: %d %s", name, r.code, r.body)
		}
	}
	// A signed URL needs no sandbox header: the signature names the sandbox.
	if r := h.do("", "GET", "/files"+signed("/tmp/raw", "read", future), ""); r.code != 200 || string(r.body) != "raw" {
		t.Fatalf("signed download without the sandbox header: %d %s", r.code, r.body)
	}
	if r := h.do("", "GET", "/files?path=/tmp/raw", ""); r.code != 401 {
		t.Fatalf("unsigned download without the sandbox header: %d %s", r.code, r.body)
	}
	if r := h.do("", "GET", "/files"+signed("/tmp/raw", "read", past), ""); r.code != 401 {
		t.Fatalf("expired download without the sandbox header: %d %s", r.code, r.body)
	}
	if r := h.do("", "GET", "/files?path=/nope", "", append(clone(hdr), "X-Access-Token", tok)...); r.code != 404 || !strings.Contains(string(r.body), `"code":404`) {
		t.Fatalf("missing file: %d %s", r.code, r.body)
	}
	if r := h.do("", "GET", "/files?path=/dir", "", append(clone(hdr), "X-Access-Token", tok)...); r.code != 400 {
		t.Fatalf("directory: %d %s", r.code, r.body)
	}
	// Stat over the filesystem service.
	fc := filesystemconnect.NewFilesystemClient(h.envdHTTP(sb.SandboxID, tok), h.url, connect.WithProtoJSON())
	st, err := fc.Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: "/tmp/x/a.txt"}))
	if err != nil || st.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_FILE || st.Msg.GetEntry().GetPermissions() != "-rw-r--r--" || st.Msg.GetEntry().GetOwner() != "1000" {
		t.Fatalf("stat: %v %v", st, err)
	}
	if _, err := fc.Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: "/nope"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("stat of a missing file: %v", err)
	}
	if _, err := fc.MakeDir(t.Context(), connect.NewRequest(&filesystem.MakeDirRequest{Path: "/dir"})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("makeDir of an existing directory: %v", err)
	}
	if _, err := fc.Remove(t.Context(), connect.NewRequest(&filesystem.RemoveRequest{Path: "/nope"})); err != nil {
		t.Fatalf("remove of a missing path: %v", err)
	}
}

func clone(s []string) []string { return append([]string(nil), s...) }
