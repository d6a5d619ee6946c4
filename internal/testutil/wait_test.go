package testutil

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWaitFor(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 50 {
			fmt.Fprintf(&b, "line %d\n", i)
		}
	})
	if !WaitFor(t, 10*time.Second, func() bool { return strings.Contains(b.String(), "line 49\n") }) {
		t.Fatalf("WaitFor gave up; buffer %q", b.String())
	}
	wg.Wait()
	t0 := time.Now()
	if WaitFor(t, 20*time.Millisecond, func() bool { return false }) {
		t.Fatal("WaitFor reported a condition that never held")
	}
	if d := time.Since(t0); d < 20*time.Millisecond {
		t.Fatalf("WaitFor gave up after %v, before its timeout", d)
	}
}
