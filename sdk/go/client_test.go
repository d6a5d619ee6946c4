package airlock_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	airlock "github.com/airlock-sandbox/airlock/sdk/go"
)

func newTestClient(t *testing.T) (*airlock.Client, *fakeServer) {
	t.Helper()
	f := newFakeServer(t)
	return airlock.New(f.srv.URL+"/", f.key), f
}

func TestSandboxLifecycle(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{CPUs: 2, Timeout: 90 * time.Second, Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != airlock.StateRunning || sb.Image != "base" || sb.CPUs != 2 || sb.Metadata["team"] != "a" || sb.CreatedAt.IsZero() {
		t.Fatalf("created %+v", sb)
	}
	if got := f.lastRequest().Header.Get("User-Agent"); !strings.HasPrefix(got, "airlock-go/") {
		t.Errorf("User-Agent %q", got)
	}
	if _, err := c.Create(ctx, airlock.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	all, err := c.List(ctx, airlock.ListOptions{State: airlock.StateRunning})
	if err != nil || len(all) != 2 {
		t.Fatalf("List = %d, %v", len(all), err)
	}
	some, err := c.List(ctx, airlock.ListOptions{Metadata: map[string]string{"team": "a"}})
	if err != nil || len(some) != 1 || some[0].ID != sb.ID {
		t.Fatalf("List(metadata) = %+v, %v", some, err)
	}
	if q := f.lastRequest().URL.Query().Get("metadata.team"); q != "a" {
		t.Errorf("metadata filter sent as %q", f.lastRequest().URL.RawQuery)
	}
	upd, err := c.SetTimeout(ctx, sb.ID, 1500*time.Millisecond) // rounds up to 2 s
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(upd.ExpiresAt); d > 3*time.Second {
		t.Errorf("expires in %v after SetTimeout(1.5s)", d)
	}
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Get after Kill: %v, want ErrNotFound", err)
	}
	if err := c.Kill(ctx, sb.ID); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("second Kill: %v, want ErrNotFound", err)
	}
}

func TestAuthHeader(t *testing.T) {
	t.Parallel()
	f := newFakeServer(t)
	if _, err := airlock.New(f.srv.URL, f.key).List(t.Context(), airlock.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := f.lastRequest().Header.Get("Authorization"); got != "Bearer "+f.key {
		t.Fatalf("Authorization %q", got)
	}
	_, err := airlock.New(f.srv.URL, "al_wrong").List(t.Context(), airlock.ListOptions{})
	var ae *airlock.APIError
	if !errors.As(err, &ae) || !errors.Is(err, airlock.ErrUnauthenticated) || ae.Status != 401 {
		t.Fatalf("wrong key: %v", err)
	}
	if errors.Is(err, airlock.ErrNotFound) {
		t.Error("401 matched ErrNotFound")
	}
}

func TestErrorDecoding(t *testing.T) {
	t.Parallel()
	cases := []struct {
		status  int
		body    string
		code    string
		msg     string
		reqID   string
		match   error
		noMatch error
	}{
		{400, `{"error":{"code":"invalid","message":"cmd is required","request_id":"r1"}}`, "invalid", "cmd is required", "r1", airlock.ErrInvalid, airlock.ErrConflict},
		{404, `{"error":{"code":"not_found","message":"sandbox not found","request_id":"r2"}}`, "not_found", "sandbox not found", "r2", airlock.ErrNotFound, airlock.ErrInvalid},
		{409, `{"error":{"code":"conflict","message":"exec has exited","request_id":"r3"}}`, "conflict", "exec has exited", "r3", airlock.ErrConflict, nil},
		{429, `{"error":{"code":"resource_exhausted","message":"limit sandboxes_per_tenant=5","request_id":"r4"}}`, "resource_exhausted", "limit sandboxes_per_tenant=5", "r4", airlock.ErrQuota, nil},
		{401, `{"error":{"code":"unauthenticated","message":"bad key","request_id":"r5"}}`, "unauthenticated", "bad key", "r5", airlock.ErrUnauthenticated, nil},
		{412, `{"error":{"code":"failed_precondition","message":"sandbox is stopping"}}`, "failed_precondition", "sandbox is stopping", "hdr", nil, airlock.ErrConflict},
		{422, `{"error":{"code":"exec_not_started","message":"the exec did not start (not found): executable not found in PATH","request_id":"r6"}}`, "exec_not_started", "the exec did not start (not found): executable not found in PATH", "r6", airlock.ErrExecNotStarted, airlock.ErrNotFound},
		{507, `{"error":{"code":"insufficient_storage","message":"the server is short of disk space","request_id":"r7"}}`, "insufficient_storage", "the server is short of disk space", "r7", airlock.ErrInsufficientStorage, airlock.ErrQuota},
		{507, "", "insufficient_storage", "Insufficient Storage", "hdr", airlock.ErrInsufficientStorage, nil},
		// Not the contract's body: a proxy's page. Code from the status, request ID from the header.
		{502, "<html>bad gateway</html>", "internal", "<html>bad gateway</html>", "hdr", nil, airlock.ErrNotFound},
		{503, "", "unavailable", "Service Unavailable", "hdr", nil, nil},
		{429, "slow down", "resource_exhausted", "slow down", "hdr", airlock.ErrQuota, nil},
	}
	for _, tc := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", "hdr")
			w.WriteHeader(tc.status)
			_, _ = io.WriteString(w, tc.body)
		}))
		_, err := airlock.New(srv.URL, "k").Get(t.Context(), "abc")
		srv.Close()
		var ae *airlock.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%d: %T %v is not an *APIError", tc.status, err, err)
		}
		want := airlock.APIError{Status: tc.status, Code: tc.code, Message: tc.msg, RequestID: tc.reqID}
		if *ae != want {
			t.Errorf("%d %q: got %+v, want %+v", tc.status, tc.body, *ae, want)
		}
		if tc.match != nil && !errors.Is(err, tc.match) {
			t.Errorf("%d: %v does not match %v", tc.status, err, tc.match)
		}
		if tc.noMatch != nil && errors.Is(err, tc.noMatch) {
			t.Errorf("%d: %v matches %v", tc.status, err, tc.noMatch)
		}
		if !strings.Contains(err.Error(), tc.code) || !strings.Contains(err.Error(), tc.reqID) {
			t.Errorf("Error() = %q lacks code or request id", err.Error())
		}
	}
}

func TestExecStreamsBytesExactly(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var started string
	var out []byte
	st, err := c.Exec(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"bytes"}}, airlock.ExecHandlers{
		OnStart:  func(id string, pid int) { started = id },
		OnStdout: func(p []byte) { out = append(out, p...) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if q := f.lastRequest().URL.Query().Get("encoding"); q != "base64" {
		t.Errorf("exec sent without ?encoding=base64: %q", f.lastRequest().URL.RawQuery)
	}
	if started == "" || st.Code != 0 || st.Duration != 7*time.Millisecond {
		t.Fatalf("start %q, status %+v", started, st)
	}
	if len(out) != 256 {
		t.Fatalf("got %d bytes, want 256", len(out))
	}
	for i, b := range out {
		if int(b) != i {
			t.Fatalf("byte %d = %d", i, b)
		}
	}

	// Run collects; stdin (binary) goes out base64 and comes back intact.
	in := []byte{0, 0xff, '\n', 0x80, 'x'}
	res, err := c.Run(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"cat"}, Stdin: in})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, in) || res.ExecID == "" {
		t.Fatalf("Run(cat) = %+v", res)
	}
	res, err = c.Run(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"fail", "3"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Exit.Code != 3 || string(res.Stderr) != "boom" || len(res.Stdout) != 0 {
		t.Fatalf("Run(fail 3) = %+v", res)
	}
	if _, err := c.Run(ctx, "nope", airlock.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("exec in a missing sandbox: %v", err)
	}
}

// streamServer answers every request with the given NDJSON chunks, flushing
// and pausing after each so that records arrive split across reads.
func streamServer(t *testing.T, chunks ...string) *airlock.Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, c := range chunks {
			_, _ = io.WriteString(w, c)
			w.(http.Flusher).Flush()
			time.Sleep(5 * time.Millisecond)
		}
	}))
	t.Cleanup(srv.Close)
	return airlock.New(srv.URL, "k")
}

func TestNDJSONParsing(t *testing.T) {
	t.Parallel()
	t.Run("split lines and base64", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t,
			`{"type":"start","exec_id":"abcdefghabcdefgh","pid":7}`+"\n"+`{"type":"std`,
			`out","data":"aGVs`, `bG8K"}`+"\n\n",
			`{"type":"stderr","data":"AP8="}`+"\n"+`{"type":"future-kind","x":1}`+"\n",
			`{"type":"exit","code":-1,"signal":9,"timeout":true,"truncated":true,"duration_ms":1500}`+"\n")
		var stdout, stderr []byte
		var id string
		var pid int
		st, err := c.Exec(t.Context(), "sb", airlock.ExecRequest{Cmd: []string{"x"}}, airlock.ExecHandlers{
			OnStart:  func(e string, p int) { id, pid = e, p },
			OnStdout: func(p []byte) { stdout = append(stdout, p...) },
			OnStderr: func(p []byte) { stderr = append(stderr, p...) },
		})
		if err != nil {
			t.Fatal(err)
		}
		want := airlock.ExitStatus{Code: -1, Signal: 9, TimedOut: true, Truncated: true, Duration: 1500 * time.Millisecond}
		if *st != want || string(stdout) != "hello\n" || !bytes.Equal(stderr, []byte{0, 0xff}) || id != "abcdefghabcdefgh" || pid != 7 {
			t.Fatalf("status %+v stdout %q stderr %q id %q pid %d", st, stdout, stderr, id, pid)
		}
	})
	t.Run("exit without trailing newline", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t, `{"type":"exit","code":2}`)
		// A record cut at EOF is not trusted even if it parses.
		_, err := c.Attach(t.Context(), "sb", "e1", airlock.ExecHandlers{})
		if !errors.Is(err, airlock.ErrStreamBroken) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("missing exit", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t, `{"type":"start","exec_id":"e2","pid":1}`+"\n", `{"type":"stdout","data":"aGk="}`+"\n")
		var got []byte
		_, err := c.Exec(t.Context(), "sb", airlock.ExecRequest{Cmd: []string{"x"}}, airlock.ExecHandlers{
			OnStdout: func(p []byte) { got = append(got, p...) },
		})
		var se *airlock.StreamError
		if !errors.As(err, &se) || se.ExecID != "e2" || !errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(err, airlock.ErrStreamBroken) {
			t.Fatalf("got %v", err)
		}
		if string(got) != "hi" {
			t.Errorf("output before the break: %q", got)
		}
		if _, err := c.Run(t.Context(), "sb", airlock.ExecRequest{Cmd: []string{"x"}}); !errors.Is(err, airlock.ErrStreamBroken) {
			t.Fatalf("Run: %v", err)
		}
	})
	t.Run("server stopping", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t, `{"type":"start","exec_id":"e5","pid":1}`+"\n",
			`{"type":"error","error":{"code":"unavailable","message":"the server is stopping; the exec goes on"}}`+"\n")
		_, err := c.Exec(t.Context(), "sb", airlock.ExecRequest{Cmd: []string{"x"}}, airlock.ExecHandlers{})
		var se *airlock.StreamError
		if !errors.As(err, &se) || se.ExecID != "e5" || !strings.Contains(err.Error(), "the server is stopping") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("sandbox paused", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t, `{"type":"start","exec_id":"e6","pid":1}`+"\n", `{"type":"stdout","data":"aGk="}`+"\n",
			`{"type":"paused","exec_id":"e6","message":"the sandbox was paused; the exec goes on when it resumes"}`+"\n",
			`{"type":"exit","code":0}`+"\n")
		_, err := c.Exec(t.Context(), "sb", airlock.ExecRequest{Cmd: []string{"x"}}, airlock.ExecHandlers{})
		var se *airlock.StreamError
		if !errors.As(err, &se) || se.ExecID != "e6" || !errors.Is(err, airlock.ErrExecPaused) || !errors.Is(err, airlock.ErrStreamBroken) {
			t.Fatalf("got %v; want a StreamError for e6 caused by ErrExecPaused", err)
		}
	})
	t.Run("bad base64", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t, `{"type":"stdout","data":"not base64!"}`+"\n"+`{"type":"exit","code":0}`+"\n")
		if _, err := c.Attach(t.Context(), "sb", "e3", airlock.ExecHandlers{}); !errors.Is(err, airlock.ErrStreamBroken) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("bad json", func(t *testing.T) {
		t.Parallel()
		c := streamServer(t, "{oops\n")
		if _, err := c.Attach(t.Context(), "sb", "e4", airlock.ExecHandlers{}); !errors.Is(err, airlock.ErrStreamBroken) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("long record", func(t *testing.T) {
		t.Parallel()
		big := bytes.Repeat([]byte{'A'}, 300<<10) // longer than the reader's buffer
		c := streamServer(t, `{"type":"stdout","data":"`+string(big)+`"}`+"\n"+`{"type":"exit","code":0}`+"\n")
		n := 0
		if _, err := c.Attach(t.Context(), "sb", "e5", airlock.ExecHandlers{OnStdout: func(p []byte) { n += len(p) }}); err != nil {
			t.Fatal(err)
		}
		if n != len(big)/4*3 {
			t.Fatalf("decoded %d bytes", n)
		}
	})
}

func TestBackgroundExec(t *testing.T) {
	t.Parallel()
	c, _ := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eid, err := c.Start(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.GetExec(ctx, sb.ID, eid)
	if err != nil || info.State != "running" || info.Exit != nil || !info.EndedAt.IsZero() || info.Cmd[0] != "cat" {
		t.Fatalf("GetExec = %+v, %v", info, err)
	}
	if err := c.SendStdin(ctx, sb.ID, eid, []byte("ab"), false); err != nil {
		t.Fatal(err)
	}
	if err := c.SendStdin(ctx, sb.ID, eid, []byte("c\x00"), true); err != nil {
		t.Fatal(err)
	}
	var out []byte
	st, err := c.Attach(ctx, sb.ID, eid, airlock.ExecHandlers{OnStdout: func(p []byte) { out = append(out, p...) }})
	if err != nil || st.Code != 0 || string(out) != "abc\x00" {
		t.Fatalf("Attach = %+v %q, %v", st, out, err)
	}
	execs, err := c.ListExecs(ctx, sb.ID)
	if err != nil || len(execs) != 1 || execs[0].Exit == nil || execs[0].State != "exited" || execs[0].Exit.Duration != 7*time.Millisecond {
		t.Fatalf("ListExecs = %+v, %v", execs, err)
	}
	if err := c.SendStdin(ctx, sb.ID, eid, []byte("x"), false); !errors.Is(err, airlock.ErrConflict) {
		t.Fatalf("stdin after exit: %v", err)
	}

	eid2, err := c.Start(ctx, sb.ID, airlock.ExecRequest{Cmd: []string{"cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, sb.ID, eid2, 9); err != nil {
		t.Fatal(err)
	}
	info, err = c.GetExec(ctx, sb.ID, eid2)
	if err != nil || info.Exit == nil || info.Exit.Signal != 9 || info.Exit.Code != -1 {
		t.Fatalf("after Signal: %+v, %v", info, err)
	}
	if _, err := c.GetExec(ctx, sb.ID, "nope"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("GetExec(missing): %v", err)
	}
}

// gatedReader yields first, then blocks until release is closed, then yields rest.
type gatedReader struct {
	first, rest []byte
	release     <-chan struct{}
	step        int
	blockedFor  time.Duration
}

func (g *gatedReader) Read(p []byte) (int, error) {
	switch g.step {
	case 0:
		g.step++
		return copy(p, g.first), nil
	case 1:
		g.step++
		t0 := time.Now()
		select {
		case <-g.release:
		case <-time.After(10 * time.Second):
			return 0, errors.New("the server never saw the first chunk: the upload is buffered, not streamed")
		}
		g.blockedFor = time.Since(t0)
		return copy(p, g.rest), nil
	}
	return 0, io.EOF
}

func (g *gatedReader) Close() error {
	panic("WriteFile must not close the caller's reader")
}

func TestWriteFileStreams(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	f.uploadStarted = make(chan struct{})
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := &gatedReader{first: []byte("first chunk;"), rest: []byte("rest"), release: f.uploadStarted}
	n, err := c.WriteFile(ctx, sb.ID, "/tmp/a.txt", r)
	if err != nil {
		t.Fatal(err)
	}
	if n != 16 {
		t.Fatalf("size %d", n)
	}
	if te := f.lastRequest().TransferEncoding; len(te) != 1 || te[0] != "chunked" {
		t.Errorf("transfer encoding %v, want chunked", te)
	}
	rc, err := c.ReadFile(ctx, sb.ID, "/tmp/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != "first chunk;rest" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Mkdir(ctx, sb.ID, "/srv", true); err != nil {
		t.Fatal(err)
	}
	if n, err := c.WriteFileMode(ctx, sb.ID, "/srv/x", strings.NewReader("hello"), 0o600); err != nil || n != 5 {
		t.Fatalf("WriteFileMode = %d, %v", n, err)
	}
	req := f.lastRequest()
	if req.URL.Query().Get("mode") != "0600" || req.ContentLength != 5 {
		t.Errorf("mode %q, content length %d", req.URL.Query().Get("mode"), req.ContentLength)
	}
	if n, err := c.WriteFile(ctx, sb.ID, "/srv/empty", nil); err != nil || n != 0 {
		t.Fatalf("WriteFile(nil) = %d, %v", n, err)
	}
	fi, err := c.Stat(ctx, sb.ID, "/srv/x")
	if err != nil || fi.Size != 5 || fi.Name != "x" || fi.Type != "file" || fi.Mode != 0o644 || fi.MTime.IsZero() || fi.IsDir() {
		t.Fatalf("Stat = %+v, %v", fi, err)
	}
	list, err := c.ListFiles(ctx, sb.ID, "/srv", 0)
	if err != nil || len(list.Entries) != 2 || list.Truncated {
		t.Fatalf("ListFiles = %+v, %v", list, err)
	}
	if err := c.Rename(ctx, sb.ID, "/srv/x", "/srv/y"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/srv/x"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Stat of the old name after Rename: %v", err)
	}
	if err := c.Rename(ctx, sb.ID, "/srv/y", "/srv/x"); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, sb.ID, "/srv/x", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/srv/x"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Stat after Remove: %v", err)
	}
	if _, err := c.ReadFile(ctx, sb.ID, "/srv/x"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("ReadFile after Remove: %v", err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "relative", strings.NewReader("x")); !errors.Is(err, airlock.ErrInvalid) {
		t.Fatalf("relative path: %v", err)
	}
	// A path with characters that need escaping survives the query string.
	if _, err := c.WriteFile(ctx, sb.ID, "/srv/a b&c=d?.txt", strings.NewReader("q")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, sb.ID, "/srv/a b&c=d?.txt"); err != nil {
		t.Fatal(err)
	}
}

func TestFileInfoModeForms(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]uint32{`{"mode":420}`: 0o644, `{"mode":"0755"}`: 0o755, `{"mode":null}`: 0, `{}`: 0} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) }))
		fi, err := airlock.New(srv.URL, "k").Stat(t.Context(), "sb", "/x")
		srv.Close()
		if err != nil || uint32(fi.Mode) != want {
			t.Errorf("%s: mode %o, %v", body, fi.Mode, err)
		}
	}
}

func TestEvents(t *testing.T) {
	t.Parallel()
	c, _ := newTestClient(t)
	ctx := t.Context()
	a, _ := c.Create(ctx, airlock.CreateOptions{})
	b, _ := c.Create(ctx, airlock.CreateOptions{})
	if _, err := c.WriteFile(ctx, a.ID, "/f", strings.NewReader("xyz")); err != nil {
		t.Fatal(err)
	}
	evs, next, err := c.Events(ctx, airlock.EventsOptions{})
	if err != nil || len(evs) != 3 || next != 3 {
		t.Fatalf("Events = %d, %d, %v", len(evs), next, err)
	}
	if evs[2].Action != "file.write" || evs[2].Detail["size"] != float64(3) || evs[2].Time.IsZero() || evs[2].KeyID == "" {
		t.Fatalf("event %+v", evs[2])
	}
	evs, next, err = c.Events(ctx, airlock.EventsOptions{Sandbox: b.ID})
	if err != nil || len(evs) != 1 || evs[0].SandboxID != b.ID || next != 2 {
		t.Fatalf("Events(sandbox) = %+v, %d, %v", evs, next, err)
	}
	evs, next, err = c.Events(ctx, airlock.EventsOptions{Since: 1, Limit: 1})
	if err != nil || len(evs) != 1 || evs[0].Seq != 2 || next != 2 {
		t.Fatalf("Events(since, limit) = %+v, %d, %v", evs, next, err)
	}
	evs, next, err = c.Events(ctx, airlock.EventsOptions{Since: 3})
	if err != nil || len(evs) != 0 || next != 3 {
		t.Fatalf("Events(at end) = %+v, %d, %v", evs, next, err)
	}
}

func TestContextCancelsStream(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"type":"start","exec_id":"e","pid":1}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := airlock.New(srv.URL, "k").Exec(ctx, "sb", airlock.ExecRequest{Cmd: []string{"sleep"}}, airlock.ExecHandlers{})
	var se *airlock.StreamError
	if !errors.As(err, &se) || se.ExecID != "e" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
}

func TestNewFromEnv(t *testing.T) {
	f := newFakeServer(t)
	t.Setenv("AIRLOCK_HOST", "")
	if _, err := airlock.NewFromEnv(); err == nil {
		t.Fatal("NewFromEnv without AIRLOCK_HOST succeeded")
	}
	t.Setenv("AIRLOCK_HOST", strings.TrimPrefix(f.srv.URL, "http://"))
	t.Setenv("AIRLOCK_API_KEY", f.key)
	c, err := airlock.NewFromEnv(airlock.WithUserAgent("mine/1"), airlock.WithHTTPClient(&http.Client{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(t.Context(), airlock.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if ua := f.lastRequest().Header.Get("User-Agent"); ua != "mine/1" {
		t.Errorf("User-Agent %q", ua)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	c, f := newTestClient(t)
	ctx := t.Context()
	sb, err := c.Create(ctx, airlock.CreateOptions{IdlePause: 4500 * time.Millisecond}) // rounds up to 5 s
	if err != nil {
		t.Fatal(err)
	}
	if sb.IdlePauseS != 5 || !sb.PausedAt.IsZero() || sb.LifetimeLeftS != 0 {
		t.Fatalf("created %+v", sb)
	}
	res, err := c.Pause(ctx, sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sandbox.State != airlock.StatePaused || res.Sandbox.ID != sb.ID || res.Sandbox.PausedAt.IsZero() ||
		res.Sandbox.LifetimeLeftS != 600 || res.StateBytes != 123<<20 || res.SaveTime != 800*time.Millisecond {
		t.Fatalf("Pause = %+v", res)
	}
	if res, err := c.Pause(ctx, sb.ID, true); err != nil || res.StateBytes != 0 {
		t.Fatalf("second Pause = %+v, %v", res, err)
	}
	got, err := c.Resume(ctx, sb.ID)
	if err != nil || got.State != airlock.StateRunning || got.LifetimeLeftS != 0 {
		t.Fatalf("Resume = %+v, %v", got, err)
	}
	if err := c.Keepalive(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := f.lastRequest(); r.Method != "POST" || r.URL.Path != "/v1/sandboxes/"+sb.ID+"/keepalive" {
		t.Errorf("keepalive sent %s %s", r.Method, r.URL.Path)
	}

	busy, err := c.Create(ctx, airlock.CreateOptions{Metadata: map[string]string{"busy": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, busy.ID, false); !errors.Is(err, airlock.ErrFailedPrecondition) {
		t.Fatalf("busy Pause: %v, want ErrFailedPrecondition", err)
	}
	if _, err := c.Pause(ctx, busy.ID, true); err != nil {
		t.Fatalf("forced Pause: %v", err)
	}
	if _, err := c.Resume(ctx, "sbmissing000"); !errors.Is(err, airlock.ErrNotFound) {
		t.Fatalf("Resume(missing): %v", err)
	}
}
