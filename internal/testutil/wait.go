package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond every few milliseconds until it holds (true) or
// timeout passes (false). Tests wait for the condition they need instead
// of sleeping for a guessed time; the caller fails with what it saw.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-time.After(wait):
		case <-t.Context().Done():
			return false
		}
	}
}

// Buffer is a bytes.Buffer safe for a writer goroutine (an exec.Cmd's
// Stdout or Stderr) and a test reading it meanwhile.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
