package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
)

// consoleTailBytes is the size of the in-memory ring that keeps the end of
// a console whose head filled console.log.
const consoleTailBytes = 64 << 10

// maxReasonLen caps a Reason taken from the guest console.
const maxReasonLen = 160

// consoleLog copies the guest's serial console to a capped file: the first
// limit bytes go to the file as they arrive, later bytes into a tail ring
// that finish appends, so both the boot and the last words survive. It
// also remembers the guest kernel's panic line. Guest output is hostile:
// the file is capped, and the panic line is sanitised before it becomes a
// Reason.
type consoleLog struct {
	f     *os.File
	limit int64

	mu       sync.Mutex
	written  int64  // bytes written to f
	tail     []byte // bytes after the head, at most consoleTailBytes
	dropped  int64  // bytes after the head that fell out of tail
	line     []byte // the current line, capped
	panicMsg string // first "Kernel panic - not syncing: ..." seen
}

func newConsoleLog(f *os.File, limit int64) *consoleLog {
	return &consoleLog{f: f, limit: limit}
}

// Write implements io.Writer; it never fails (a full disk only loses log).
func (c *consoleLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scan(p)
	rest := p
	if room := c.limit - c.written; room > 0 {
		n := min(int64(len(rest)), room)
		m, _ := c.f.Write(rest[:n])
		c.written += int64(m)
		rest = rest[n:]
	}
	if len(rest) > 0 {
		c.tail = append(c.tail, rest...)
		if over := len(c.tail) - consoleTailBytes; over > 0 {
			c.dropped += int64(over)
			if len(c.tail) > 2*consoleTailBytes {
				c.tail = append([]byte(nil), c.tail[over:]...)
			} else {
				c.tail = c.tail[over:]
			}
		}
	}
	return len(p), nil
}

// scan looks for the guest kernel's panic line.
func (c *consoleLog) scan(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := 512 - len(c.line); room > 0 {
			c.line = append(c.line, chunk[:min(len(chunk), room)]...)
		}
		if i < 0 {
			return
		}
		c.endLine()
		p = p[i+1:]
	}
}

func (c *consoleLog) endLine() {
	const marker = "Kernel panic - not syncing:"
	if c.panicMsg == "" {
		if j := bytes.Index(c.line, []byte(marker)); j >= 0 {
			c.panicMsg = sanitize(string(c.line[j:]))
		}
	}
	c.line = c.line[:0]
}

// PanicMessage returns the guest kernel's panic line, if one was seen.
func (c *consoleLog) PanicMessage() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.panicMsg == "" && len(c.line) > 0 {
		c.endLine() // a panic line without its newline
	}
	return c.panicMsg
}

// Close appends the tail and closes the file.
func (c *consoleLog) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	if len(c.tail) > 0 {
		if _, err := fmt.Fprintf(c.f, "\n[airlock: console log capped; %d bytes omitted; last %d bytes follow]\n", c.dropped, len(c.tail)); err != nil {
			errs = append(errs, err)
		}
		if _, err := c.f.Write(c.tail); err != nil {
			errs = append(errs, err)
		}
		c.tail = nil
	}
	if err := c.f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sanitize keeps printable ASCII, collapses whitespace and caps the length.
func sanitize(s string) string {
	var b strings.Builder
	space := false
	for _, r := range s {
		switch {
		case r == ' ' || r == '\t' || r == '\r':
			space = b.Len() > 0
		case r > ' ' && r < 0x7f:
			if space {
				b.WriteByte(' ')
				space = false
			}
			b.WriteRune(r)
		}
		if b.Len() >= maxReasonLen {
			break
		}
	}
	out := b.String()
	if len(out) > maxReasonLen {
		out = out[:maxReasonLen]
	}
	return out
}

// cappedWriter writes at most limit bytes to w and drops the rest (QEMU's
// stderr in qemu.log).
type cappedWriter struct {
	mu    sync.Mutex
	w     io.Writer
	limit int64
	n     int64
	last  []byte // the last line written, for error messages
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - c.n; room > 0 {
		k := min(int64(len(p)), room)
		m, _ := c.w.Write(p[:k])
		c.n += int64(m)
	}
	c.last = append(c.last, p...)
	if len(c.last) > 4096 {
		c.last = append([]byte(nil), c.last[len(c.last)-4096:]...)
	}
	return len(p), nil
}

// LastLine returns the last non-empty line written, sanitised.
func (c *cappedWriter) LastLine() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(c.last)), "\n")
	return sanitize(lines[len(lines)-1])
}
