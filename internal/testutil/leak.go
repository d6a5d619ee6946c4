package testutil

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// VerifyNoLeaks runs the tests, then fails the package if goroutines that
// run airlock code are still alive 3 s after the last test (as net/http's
// TestMain does). Use it as `func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }`.
func VerifyNoLeaks(m *testing.M) {
	code := m.Run()
	if code == 0 {
		deadline := time.Now().Add(3 * time.Second)
		var leaked []string
		for {
			leaked = leakedGoroutines()
			if len(leaked) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "leaked %d goroutine(s) running airlock code:\n\n%s\n", len(leaked), strings.Join(leaked, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "airlock-sandbox/airlock/internal") ||
			strings.Contains(g, "testutil.leakedGoroutines") || strings.Contains(g, "testing.(*M).Run") {
			continue
		}
		out = append(out, g)
	}
	return out
}
