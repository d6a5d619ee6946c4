package secrets

import (
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func TestHostMatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"api.x.com", "api.x.com", true},
		{"api.x.com", "API.X.COM", true},
		{"api.x.com", "api.x.com.", true},
		{"api.x.com.", "api.x.com", true},
		{"api.x.com", "api.x.com..", false},
		{"api.x.com", "a.api.x.com", false},
		{"api.x.com", "x.com", false},
		{"*.x.com", "a.x.com", true},
		{"*.x.com", "a.b.x.com", true},
		{"*.X.com", "A.x.COM.", true},
		{"*.x.com", "x.com", false},
		{"*.x.com", ".x.com", false},
		{"*.x.com", "a..x.com", false},
		{"*.x.com", "ax.com", false},
		{"*.x.com", "a.x.com.evil", false},
		{"*x.com", "ax.com", false},
		{"*.", "a.", false},
		{"", "", false},
		{"a.com", "", false},
	}
	for _, tt := range tests {
		if got := HostMatches(tt.pattern, tt.name); got != tt.want {
			t.Errorf("HostMatches(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}
