package shim

import (
	"strings"
	"testing"
)

func TestThreat021UploadPathTraversal(t *testing.T) {
	t.Parallel()
	good := []string{"/", "/srv/in.txt", "/a b/c"}
	bad := []string{"", "rel/path", "/a/../b", "/a//b", "/a/", "/a\x00b", "/" + strings.Repeat("a", maxPathLen)}
	for _, p := range good {
		if err := ValidateGuestPath(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range bad {
		if err := ValidateGuestPath(p); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}

func TestAdmitCapsOutput(t *testing.T) {
	t.Parallel()
	var sent uint64
	truncated := false
	chunk := func(n int) []byte { return make([]byte, n) }
	d := chunk(6)
	if !admit(&sent, 10, &d, &truncated) || len(d) != 6 || truncated {
		t.Fatalf("first chunk: len %d truncated %v", len(d), truncated)
	}
	d = chunk(6)
	if !admit(&sent, 10, &d, &truncated) || len(d) != 4 || !truncated {
		t.Fatalf("second chunk: len %d truncated %v", len(d), truncated)
	}
	d = chunk(1)
	if admit(&sent, 10, &d, &truncated) {
		t.Fatal("chunk past the cap admitted")
	}
	if sent != 10 {
		t.Fatalf("sent = %d", sent)
	}
}
