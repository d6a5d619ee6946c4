package boot

import (
	"strings"
	"testing"
)

func TestValidHostname(t *testing.T) {
	t.Parallel()
	good := []string{"a", "airlock", "sb-123", "A1", strings.Repeat("x", 63)}
	bad := []string{"", "-a", "a-", "a.b", "a_b", "a b", "ä", strings.Repeat("x", 64), "a\x00"}
	for _, s := range good {
		if !ValidHostname(s) {
			t.Errorf("ValidHostname(%q) = false", s)
		}
	}
	for _, s := range bad {
		if ValidHostname(s) {
			t.Errorf("ValidHostname(%q) = true", s)
		}
	}
}
