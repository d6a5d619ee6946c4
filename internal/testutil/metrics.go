package testutil

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// ParseMetrics reads a Prometheus text exposition (GET /metrics) into
// series -> value, a series named as the text format writes it
// (name{labels}, labels sorted). Comments are skipped; a line whose value
// does not parse fails t.
func ParseMetrics(t testing.TB, b []byte) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for sc := bufio.NewScanner(bytes.NewReader(b)); sc.Scan(); {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}
