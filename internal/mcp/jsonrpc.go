package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxMessageBytes bounds one JSON-RPC message (a stdio line or an HTTP
// body). file_write carries at most 8 MiB base64-encoded, so 16 MiB leaves
// room for the envelope.
const MaxMessageBytes = 16 << 20

// badMessage is why the server cannot take a message: the JSON-RPC error
// it answers with (id null unless the message had a usable id).
type badMessage struct {
	id      any // nil, a string or a number
	code    int64
	message string
}

// check classifies one JSON-RPC message the way the SDK reads it: nil if
// the SDK takes it, otherwise the spec's error to answer. Batches are
// refused on stdio (batch is false): MCP 2025-06-18 removed them and no
// client sends them; over HTTP a non-empty batch goes to the SDK, which
// answers it per protocol version.
func check(msg []byte, batch bool) *badMessage {
	msg = bytes.TrimSpace(msg)
	if !json.Valid(msg) {
		return &badMessage{code: jsonrpc.CodeParseError, message: "parse error: the message is not valid JSON"}
	}
	switch msg[0] {
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(msg, &items); err != nil || len(items) == 0 {
			return &badMessage{code: jsonrpc.CodeInvalidRequest, message: "invalid request: empty batch"}
		}
		if !batch {
			return &badMessage{code: jsonrpc.CodeInvalidRequest, message: "invalid request: JSON-RPC batches are not supported"}
		}
		for _, it := range items {
			if bad := check(it, false); bad != nil {
				return bad
			}
		}
		return nil
	case '{':
	default:
		return &badMessage{code: jsonrpc.CodeInvalidRequest, message: "invalid request: a message must be a JSON object"}
	}
	if _, err := jsonrpc.DecodeMessage(msg); err != nil {
		return &badMessage{id: rawID(msg), code: jsonrpc.CodeInvalidRequest, message: "invalid request: " + clip(err.Error(), 200)}
	}
	return nil
}

// rawID returns msg's id if it is one JSON-RPC allows (a string or a
// number), else nil.
func rawID(msg []byte) any {
	var m struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(msg, &m) != nil {
		return nil
	}
	switch id := m.ID.(type) {
	case string:
		return clip(id, 256)
	case float64:
		return id
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// errorResponse is a JSON-RPC error response for bad.
func (bad *badMessage) response() []byte {
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": bad.id,
		"error": map[string]any{"code": bad.code, "message": bad.message},
	})
	return b
}

// StdioTransport serves one session on newline-delimited JSON-RPC (stdin
// and stdout when In and Out are nil). Unlike the SDK's, a malformed line
// (not JSON, not a message, a batch, over MaxMessageBytes) is answered
// with the spec's error and the session goes on.
type StdioTransport struct {
	In  io.Reader
	Out io.Writer
}

var _ sdk.Transport = (*StdioTransport)(nil)

// Connect starts reading.
func (t *StdioTransport) Connect(context.Context) (sdk.Connection, error) {
	in, out := t.In, t.Out
	if in == nil {
		in = os.Stdin
	}
	if out == nil {
		out = os.Stdout
	}
	c := &lineConn{out: out, msgs: make(chan lineMsg), closed: make(chan struct{})}
	go c.readLoop(bufio.NewReaderSize(in, 64<<10))
	return c, nil
}

type lineMsg struct {
	msg jsonrpc.Message
	err error
}

type lineConn struct {
	out    io.Writer
	wmu    sync.Mutex
	msgs   chan lineMsg
	once   sync.Once
	closed chan struct{}
}

// readLoop reads lines until EOF or a read error, answering bad ones
// itself and handing good ones to Read.
func (c *lineConn) readLoop(r *bufio.Reader) {
	for {
		line, err := readLine(r, MaxMessageBytes)
		var m lineMsg
		switch {
		case errors.Is(err, errLineTooLong):
			c.reply(&badMessage{code: jsonrpc.CodeInvalidRequest, message: fmt.Sprintf("invalid request: a message is at most %d bytes", MaxMessageBytes)})
			continue
		case len(bytes.TrimSpace(line)) == 0 && err == nil:
			continue
		case len(bytes.TrimSpace(line)) == 0:
			m.err = err
		default:
			if bad := check(line, false); bad != nil {
				c.reply(bad)
				if err == nil {
					continue
				}
				m.err = err
			} else {
				// check accepted it, so this cannot fail.
				m.msg, m.err = jsonrpc.DecodeMessage(bytes.TrimSpace(line))
			}
		}
		select {
		case c.msgs <- m:
		case <-c.closed:
			return
		}
		if m.err != nil {
			return
		}
		if err != nil { // the last line had no newline
			select {
			case c.msgs <- lineMsg{err: err}:
			case <-c.closed:
			}
			return
		}
	}
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next line without its newline. A line longer than
// max is skipped to its end and reported as errLineTooLong.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > max+1 {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			if err == nil {
				return nil, errLineTooLong
			}
			return nil, err
		}
		line = append(line, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimSuffix(line, []byte("\n")), err
	}
}

func (c *lineConn) reply(bad *badMessage) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.out.Write(append(bad.response(), '\n'))
}

func (c *lineConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, io.EOF
	case m := <-c.msgs:
		return m.msg, m.err
	}
}

func (c *lineConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err = c.out.Write(append(b, '\n'))
	return err
}

func (c *lineConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *lineConn) SessionID() string { return "" }

// checkBody answers a POST whose body is not a JSON-RPC message the SDK
// takes with HTTP 400 and the spec's error; anything else goes to next
// with its body intact. The session (if any) is untouched.
func checkBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxMessageBytes))
		_ = r.Body.Close()
		var bad *badMessage
		switch {
		case err != nil:
			bad = &badMessage{code: jsonrpc.CodeInvalidRequest, message: fmt.Sprintf("invalid request: a message is at most %d bytes", MaxMessageBytes)}
		case len(bytes.TrimSpace(body)) == 0:
			bad = &badMessage{code: jsonrpc.CodeInvalidRequest, message: "invalid request: empty body"}
		default:
			bad = check(body, true)
		}
		if bad != nil {
			w.Header().Set("Content-Type", "application/json")
			status := http.StatusBadRequest
			if err != nil {
				status = http.StatusRequestEntityTooLarge
			}
			w.WriteHeader(status)
			_, _ = w.Write(bad.response())
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}
