package mcp

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// reply is one line the server wrote.
type reply struct {
	ID     any             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// stdioSession serves one session over pipes and returns a line writer
// and a reply reader. The session ends when the test does.
func stdioSession(t *testing.T) (send func(string), next func() reply) {
	t.Helper()
	h := newHandler(t, newFake(), nil)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.ServeStdio(ctx, &StdioTransport{In: inR, Out: outW}) }()
	t.Cleanup(func() {
		cancel()
		_ = inW.Close()
		_ = outR.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeStdio: %v", err)
		}
	})
	lines := bufio.NewScanner(outR)
	lines.Buffer(nil, 1<<20)
	send = func(s string) {
		t.Helper()
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatalf("write %q: %v", s, err)
		}
	}
	next = func() reply {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("no reply: %v", lines.Err())
		}
		var r reply
		if err := json.Unmarshal(lines.Bytes(), &r); err != nil {
			t.Fatalf("reply %q: %v", lines.Text(), err)
		}
		return r
	}
	return send, next
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// malformed are lines that once ended `airlock mcp`, and their kin, with
// the JSON-RPC error code and id each must be answered with.
var malformed = []struct {
	line string
	code int64
	id   any
}{
	{`{`, jsonrpc.CodeParseError, nil},
	{`nul`, jsonrpc.CodeParseError, nil},
	{"\x00\xff", jsonrpc.CodeParseError, nil},
	{`[]`, jsonrpc.CodeInvalidRequest, nil},
	{`[{"jsonrpc":"2.0","id":9,"method":"ping"}]`, jsonrpc.CodeInvalidRequest, nil},
	{`42`, jsonrpc.CodeInvalidRequest, nil},
	{`"initialize"`, jsonrpc.CodeInvalidRequest, nil},
	{`{"jsonrpc":"1.0","id":"v1","method":"ping"}`, jsonrpc.CodeInvalidRequest, "v1"},
	{`{"jsonrpc":"2.0","id":{},"method":"ping"}`, jsonrpc.CodeInvalidRequest, nil},
	{`{"jsonrpc":"2.0","id":7,"method":5}`, jsonrpc.CodeInvalidRequest, float64(7)},
	{`{"jsonrpc":"2.0"}`, jsonrpc.CodeInvalidRequest, nil},
}

func TestStdioMalformedKeepsSession(t *testing.T) {
	send, next := stdioSession(t)
	for i, m := range malformed {
		send(m.line)
		r := next()
		if r.Error == nil || r.Error.Code != m.code || r.ID != m.id {
			t.Errorf("%q: reply %+v (error %+v), want code %d id %v", m.line, r, r.Error, m.code, m.id)
		}
		if i == 3 {
			// Initialize between bad lines: the session is live and stays.
			send(initialize)
			if r := next(); r.Error != nil || len(r.Result) == 0 {
				t.Fatalf("initialize after %q: %+v", m.line, r)
			}
			send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		}
	}
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	r := next()
	if r.Error != nil || r.ID != float64(2) || !strings.Contains(string(r.Result), "sandbox_create") {
		t.Fatalf("tools/list after malformed lines: %+v", r)
	}
}

func TestStdioOverlongLine(t *testing.T) {
	send, next := stdioSession(t)
	send(`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", MaxMessageBytes) + `"}}`)
	if r := next(); r.Error == nil || r.Error.Code != jsonrpc.CodeInvalidRequest || !strings.Contains(r.Error.Message, "at most") {
		t.Fatalf("overlong line: %+v", r)
	}
	send(initialize)
	if r := next(); r.Error != nil || r.ID != float64(1) {
		t.Fatalf("initialize after an overlong line: %+v", r)
	}
}

func TestHTTPMalformedKeepsSession(t *testing.T) {
	h := newHandler(t, newFake(), nil)
	srv := httptest.NewServer(h.HTTPHandler(func(*http.Request) (Principal, bool) {
		return Principal{Tenant: "a", KeyID: "ka"}, true
	}))
	defer srv.Close()
	hc := &http.Client{Transport: bearer{"ka"}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil).Connect(t.Context(),
		&sdk.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for _, m := range malformed {
		if strings.HasPrefix(m.line, "[{") {
			continue // a non-empty batch is the SDK's to answer per protocol version
		}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(m.line))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", cs.ID())
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var r reply
		derr := json.NewDecoder(resp.Body).Decode(&r)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || derr != nil || r.Error == nil || r.Error.Code != m.code {
			t.Errorf("%q: %d %+v (%v), want 400 code %d", m.line, resp.StatusCode, r, derr, m.code)
		}
	}
	// The session still works.
	if _, err := cs.ListTools(t.Context(), nil); err != nil {
		t.Fatalf("tools/list after malformed posts: %v", err)
	}
}

// FuzzCheck: check never panics, and whatever it accepts the SDK decodes.
func FuzzCheck(f *testing.F) {
	for _, m := range malformed {
		f.Add([]byte(m.line))
	}
	f.Add([]byte(initialize))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"a","result":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		bad := check(b, false)
		if bad == nil {
			if _, err := jsonrpc.DecodeMessage(b); err != nil {
				t.Fatalf("check accepted %q, the SDK refuses it: %v", b, err)
			}
			return
		}
		var v map[string]any
		if err := json.Unmarshal(bad.response(), &v); err != nil || v["jsonrpc"] != "2.0" {
			t.Fatalf("error reply for %q is not JSON-RPC: %s", b, bad.response())
		}
	})
}

// FuzzStdioTransport: any input line is answered or passed on, and a ping
// after it is still answered.
func FuzzStdioTransport(f *testing.F) {
	for _, m := range malformed {
		f.Add(m.line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		line = strings.ReplaceAll(line, "\n", " ")
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		conn, err := (&StdioTransport{In: inR, Out: outW}).Connect(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		go func() {
			_, _ = io.WriteString(inW, line+"\n"+`{"jsonrpc":"2.0","id":"last","method":"ping"}`+"\n")
		}()
		// Errors the transport answers itself arrive on out; drain them.
		go func() { _, _ = io.Copy(io.Discard, outR) }()
		for {
			msg, err := conn.Read(t.Context())
			if err != nil {
				t.Fatalf("read after %q: %v", line, err)
			}
			if req, ok := msg.(*jsonrpc.Request); ok && req.ID.Raw() == "last" {
				return
			}
		}
	})
}
