package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCachedVersion: the answer is kept for the same binary and asked
// again once the binary changes; errors are never kept; no cache path
// keeps nothing.
func TestCachedVersion(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "vmm")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(dir, "vmm-version")
	calls := 0
	answer, fail := "vmm 1.0", error(nil)
	run := func(context.Context) (string, error) { calls++; return answer, fail }
	get := func(cache string) string {
		t.Helper()
		v, err := CachedVersion(t.Context(), cache, bin, run)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	if v := get(cache); v != "vmm 1.0" || calls != 1 {
		t.Fatalf("first: %q after %d runs", v, calls)
	}
	answer = "vmm 2.0"
	if v := get(cache); v != "vmm 1.0" || calls != 1 {
		t.Fatalf("same binary: %q after %d runs, want the kept answer and no run", v, calls)
	}
	// A new build (another size and time) is asked again.
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n# v2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(bin, time.Now(), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if v := get(cache); v != "vmm 2.0" || calls != 2 {
		t.Fatalf("changed binary: %q after %d runs", v, calls)
	}
	// A failure is returned and not kept.
	if err := os.Chtimes(bin, time.Now(), time.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	fail = errors.New("vmm: broken")
	if _, err := CachedVersion(t.Context(), cache, bin, run); err == nil || calls != 3 {
		t.Fatalf("a failing run: %v after %d runs", err, calls)
	}
	fail, answer = nil, "vmm 3.0"
	if v := get(cache); v != "vmm 3.0" || calls != 4 {
		t.Fatalf("after a failure: %q after %d runs", v, calls)
	}
	// No cache path: every call runs.
	get("")
	get("")
	if calls != 6 {
		t.Fatalf("without a cache: %d runs, want 6", calls)
	}
	// A missing binary is not cached either.
	if _, err := CachedVersion(t.Context(), cache, filepath.Join(dir, "absent"), run); err != nil || calls != 7 {
		t.Fatalf("absent binary: %v after %d runs", err, calls)
	}
}
