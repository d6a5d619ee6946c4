package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// MaxMessageBytes caps one message (one line) from QEMU.
const MaxMessageBytes = 1 << 20

// EventBuffer is the capacity of the Events channel. Events that arrive
// while it is full are dropped (and counted by DroppedEvents).
const EventBuffer = 64

// ErrClosed is returned by calls on a client whose connection has ended.
var ErrClosed = errors.New("qmp: connection closed")

// Error is an error reply from QEMU.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// Event is an asynchronous QMP event.
type Event struct {
	Name string
	Data json.RawMessage
	Time time.Time
}

// Version is QEMU's version from the greeting.
type Version struct {
	Major, Minor, Micro int
	Package             string
}

func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
	if v.Package != "" {
		s += " (" + v.Package + ")"
	}
	return s
}

// message is any line QEMU sends.
type message struct {
	QMP *struct {
		Version struct {
			QEMU struct {
				Major int `json:"major"`
				Minor int `json:"minor"`
				Micro int `json:"micro"`
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
	} `json:"QMP"`
	ID        json.RawMessage `json:"id"`
	Return    json.RawMessage `json:"return"`
	Error     *Error          `json:"error"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

type reply struct {
	ret json.RawMessage
	err error
}

// Client is one QMP session. Safe for concurrent use.
type Client struct {
	conn    net.Conn
	version Version
	events  chan Event
	done    chan struct{} // closed when the reader has exited

	wmu sync.Mutex // serialises writes (a command and its fds in one sendmsg)

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan reply
	readErr error  // why the reader stopped; set before done is closed
	dropped uint64 // events dropped because Events was full
}

// Dial performs the QMP handshake on conn: it reads the greeting and sends
// qmp_capabilities, both within ctx. On success the Client owns conn and
// closes it in Close; on failure conn is closed too.
func Dial(ctx context.Context, conn net.Conn) (*Client, error) {
	c := &Client{
		conn:    conn,
		events:  make(chan Event, EventBuffer),
		done:    make(chan struct{}),
		pending: make(map[string]chan reply),
	}
	greeting := make(chan Version, 1)
	go c.readLoop(greeting)

	select {
	case v := <-greeting:
		c.version = v
	case <-c.done:
		_ = c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", c.err())
	case <-ctx.Done():
		_ = c.Close()
		return nil, fmt.Errorf("qmp greeting: %w", context.Cause(ctx))
	}
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// Version returns QEMU's version from the greeting.
func (c *Client) Version() Version { return c.version }

// Events returns the channel of asynchronous events. It is closed when the
// connection ends. Events are dropped while it is full.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when the connection has ended (QEMU exited or Close).
func (c *Client) Done() <-chan struct{} { return c.done }

// DroppedEvents returns how many events were dropped because nobody read
// Events in time.
func (c *Client) DroppedEvents() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped
}

// Close ends the session and closes the connection. It waits for the reader
// goroutine. Idempotent.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (c *Client) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

// Execute runs one QMP command. args (may be nil) is marshalled as the
// command's "arguments"; if result is non-nil the reply's "return" is
// unmarshalled into it. A QMP error reply is returned as *Error. If ctx ends
// first the call returns its cause; a late reply is discarded.
func (c *Client) Execute(ctx context.Context, cmd string, args, result any) error {
	return c.execute(ctx, cmd, args, result, nil)
}

// SendFD passes f to QEMU under name (QMP getfd), attaching the descriptor
// to the command with SCM_RIGHTS. The connection must be a *net.UnixConn.
// QEMU holds its own copy; the caller still owns f.
func (c *Client) SendFD(ctx context.Context, name string, f *os.File) error {
	if _, ok := c.conn.(*net.UnixConn); !ok {
		return errors.New("qmp: SendFD needs a unix socket connection")
	}
	return c.execute(ctx, "getfd", map[string]string{"fdname": name}, nil, f)
}

// ExecuteFD is Execute with f attached to the command with SCM_RIGHTS
// (e.g. add-fd). The connection must be a *net.UnixConn. QEMU holds its
// own copy; the caller still owns f.
func (c *Client) ExecuteFD(ctx context.Context, cmd string, args, result any, f *os.File) error {
	if _, ok := c.conn.(*net.UnixConn); !ok {
		return errors.New("qmp: ExecuteFD needs a unix socket connection")
	}
	return c.execute(ctx, cmd, args, result, f)
}

func (c *Client) execute(ctx context.Context, cmd string, args, result any, f *os.File) error {
	c.mu.Lock()
	if c.readErr != nil {
		err := c.readErr
		c.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	ch := make(chan reply, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()

	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp %s: encode: %w", cmd, err)
	}
	b = append(b, '\n')
	if err := c.write(ctx, b, f); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}

	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, r.err)
		}
		if result != nil {
			if err := json.Unmarshal(r.ret, result); err != nil {
				return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
			}
		}
		return nil
	case <-c.done:
		// The reader may have delivered the reply just before it stopped.
		select {
		case r := <-ch:
			if r.err == nil && result != nil {
				r.err = json.Unmarshal(r.ret, result)
			}
			if r.err != nil {
				return fmt.Errorf("qmp %s: %w", cmd, r.err)
			}
			return nil
		default:
		}
		return fmt.Errorf("qmp %s: %w", cmd, c.err())
	case <-ctx.Done():
		return fmt.Errorf("qmp %s: %w", cmd, context.Cause(ctx))
	}
}

// write sends b (and f's descriptor, if any) as one message, honouring ctx.
func (c *Client) write(ctx context.Context, b []byte, f *os.File) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	if err := c.conn.SetWriteDeadline(dl); err != nil {
		return err
	}
	// A cancelled (not deadlined) ctx interrupts the write too. If the
	// interrupt has begun, wait for it so that it cannot hit a later write.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.conn.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()

	if f == nil {
		_, err := c.conn.Write(b)
		return err
	}
	uc := c.conn.(*net.UnixConn)
	oob := syscall.UnixRights(int(f.Fd()))
	n, oobn, err := uc.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if oobn != len(oob) {
		return errors.New("descriptor not sent")
	}
	if n < len(b) {
		// The fd went with the first part; send the rest plainly.
		_, err = c.conn.Write(b[n:])
	}
	return err
}

// readLoop owns the read side of the connection until it fails.
func (c *Client) readLoop(greeting chan<- Version) {
	err := c.read(greeting)
	c.mu.Lock()
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = ErrClosed
	}
	c.readErr = err
	for id, ch := range c.pending {
		ch <- reply{err: err}
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.events)
	close(c.done)
}

func (c *Client) read(greeting chan<- Version) error {
	br := bufio.NewReaderSize(c.conn, 64<<10)
	gotGreeting := false
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var m message
		if err := json.Unmarshal(line, &m); err != nil {
			return fmt.Errorf("qmp: malformed message: %w", err)
		}
		switch {
		case m.QMP != nil:
			if gotGreeting {
				return errors.New("qmp: second greeting")
			}
			gotGreeting = true
			q := m.QMP.Version.QEMU
			greeting <- Version{Major: q.Major, Minor: q.Minor, Micro: q.Micro, Package: m.QMP.Version.Package}
		case m.Event != "":
			ev := Event{Name: m.Event, Data: m.Data}
			if m.Timestamp != nil {
				ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
			}
			select {
			case c.events <- ev:
			default:
				c.mu.Lock()
				c.dropped++
				c.mu.Unlock()
			}
		case m.Return != nil || m.Error != nil:
			var id string
			if err := json.Unmarshal(m.ID, &id); err != nil {
				continue // a reply to nobody (no or foreign id): ignore it
			}
			c.mu.Lock()
			ch := c.pending[id]
			delete(c.pending, id)
			c.mu.Unlock()
			if ch == nil {
				continue // the caller gave up
			}
			if m.Error != nil {
				ch <- reply{err: m.Error}
			} else {
				ch <- reply{ret: m.Return}
			}
		}
	}
}

// readLine returns one line, failing on lines over MaxMessageBytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > MaxMessageBytes {
			return nil, fmt.Errorf("qmp: message over %d bytes", MaxMessageBytes)
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			return buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}
