package airlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// TerminalOptions is what runs on a terminal (Client.Terminal).
type TerminalOptions struct {
	// Cmd is the command (default: a login shell, bash or sh).
	Cmd []string
	// Rows and Cols are the terminal's size (default 24x80).
	Rows, Cols int
	Env        map[string]string
	Cwd, User  string
	Timeout    time.Duration
	// Keep leaves the command running when the terminal is closed (attach
	// again with ExecID).
	Keep bool
	// ExecID attaches to a running terminal exec instead of starting one
	// (its retained output comes first).
	ExecID string
}

// Terminal is a command on a terminal in a sandbox: Read its output (echo
// included), Write typed input, Resize it; Wait returns its exit after
// Read has returned io.EOF. Close ends the connection (and the command,
// unless Keep).
type Terminal struct {
	ExecID string
	PID    int

	conn *websocket.Conn
	out  *io.PipeReader

	mu   sync.Mutex
	exit *ExitStatus
	err  error
	done chan struct{}
}

// Terminal opens a terminal in sandbox id (GET /v1/sandboxes/{id}/pty).
func (c *Client) Terminal(ctx context.Context, id string, o TerminalOptions) (*Terminal, error) {
	q := url.Values{}
	for _, a := range o.Cmd {
		q.Add("cmd", a)
	}
	if o.Rows > 0 {
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	if o.Cols > 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
	}
	for k, v := range o.Env {
		q.Add("env", k+"="+v)
	}
	for k, v := range map[string]string{"cwd": o.Cwd, "user": o.User, "exec_id": o.ExecID} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if o.Timeout > 0 {
		q.Set("timeout_s", strconv.Itoa(int(o.Timeout/time.Second)))
	}
	if o.Keep {
		q.Set("keep", "true")
	}
	u := strings.Replace(c.base, "http", "ws", 1) + "/v1/sandboxes/" + url.PathEscape(id) + "/pty?" + q.Encode()
	hdr := http.Header{}
	if c.apiKey != "" {
		hdr.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.userAgent != "" {
		hdr.Set("User-Agent", c.userAgent)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("airlock: terminal: %w", err)
	}
	conn.SetReadLimit(1 << 20)
	typ, b, err := conn.Read(ctx)
	var started struct {
		Type   string `json:"type"`
		ExecID string `json:"exec_id"`
		PID    int    `json:"pid"`
	}
	if err == nil && (typ != websocket.MessageText || json.Unmarshal(b, &started) != nil || started.Type != "started") {
		err = errors.New("the server did not start the terminal")
	}
	if err != nil {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("airlock: terminal: %w", err)
	}
	pr, pw := io.Pipe()
	t := &Terminal{ExecID: started.ExecID, PID: started.PID, conn: conn, out: pr, done: make(chan struct{})}
	go t.readLoop(pw)
	return t, nil
}

// readLoop turns the socket's messages into output and the exit.
func (t *Terminal) readLoop(pw *io.PipeWriter) {
	defer close(t.done)
	for {
		typ, b, err := t.conn.Read(context.Background())
		if err != nil {
			t.mu.Lock()
			if t.exit == nil && t.err == nil {
				t.err = fmt.Errorf("airlock: terminal: the connection ended before the command's exit: %w", err)
			}
			err = t.err
			t.mu.Unlock()
			if err == nil {
				err = io.EOF
			}
			pw.CloseWithError(err)
			return
		}
		if typ == websocket.MessageBinary {
			if _, err := pw.Write(b); err != nil {
				return // the reader closed
			}
			continue
		}
		var m struct {
			Type  string    `json:"type"`
			Exit  *wireExit `json:"exit"`
			Error string    `json:"error"`
		}
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		if m.Type == "exit" && m.Exit != nil {
			st := m.Exit.status()
			t.mu.Lock()
			t.exit = &st
			t.mu.Unlock()
		}
	}
}

// Read reads the terminal's output; io.EOF once the command exited.
func (t *Terminal) Read(p []byte) (int, error) { return t.out.Read(p) }

// Write types p into the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.conn.Write(context.Background(), websocket.MessageBinary, p); err != nil {
		return 0, fmt.Errorf("airlock: terminal input: %w", err)
	}
	return len(p), nil
}

func (t *Terminal) control(ctx context.Context, m map[string]any) error {
	b, _ := json.Marshal(m)
	if err := t.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("airlock: terminal %s: %w", m["type"], err)
	}
	return nil
}

// Resize sets the terminal's size.
func (t *Terminal) Resize(ctx context.Context, rows, cols int) error {
	return t.control(ctx, map[string]any{"type": "resize", "rows": rows, "cols": cols})
}

// Signal sends sig to the command's process group.
func (t *Terminal) Signal(ctx context.Context, sig int) error {
	return t.control(ctx, map[string]any{"type": "signal", "signal": sig})
}

// Wait waits until the connection ends and returns the command's exit
// (an error if it ended without one). Read the output until io.EOF first,
// or concurrently: unread output holds the connection.
func (t *Terminal) Wait(ctx context.Context) (*ExitStatus, error) {
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.exit != nil {
		return t.exit, nil
	}
	return nil, t.err
}

// Close ends the connection: the command is killed unless it was started
// with Keep.
func (t *Terminal) Close() error {
	err := t.conn.Close(websocket.StatusNormalClosure, "closed by the client")
	_ = t.out.Close()
	return err
}
