package main

import (
	"strings"
	"testing"
)

// The secret interceptor rows run on the host alone: a short run measures
// both protocols and reports a ratio.
func TestSecretsBench(t *testing.T) {
	t.Parallel()
	rows, err := secretsBench(t.Context(), 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || !strings.Contains(rows[1][0], "HTTP/2") || !strings.Contains(rows[1][1], "x HTTP/1.1") ||
		!strings.Contains(rows[3][1], "x HTTP/1.1") {
		t.Fatalf("rows %q", rows)
	}
	for _, r := range rows {
		t.Log(r[0], "|", r[1])
	}
}
