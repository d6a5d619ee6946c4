package guest

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"no such file":      "no such file",
		"a\x1b[2Jb":         `a\x1b[2Jb`,
		"line\nFAKE: ok\r":  `line\nFAKE: ok\r`,
		"tab\there":         "tab here",
		"evil\u202etxt.exe": `evil\u202etxt.exe`,
		"zero\u200bwidth":   `zero\u200bwidth`,
		"bad\xffutf8":       `bad\xffutf8`,
		"c1\u009bcsi":       `c1\x9bcsi`,
		"héllo 世界":          "héllo 世界",
		"del\x7f":           `del\x7f`,
	} {
		if got := Text(in, 100); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
	long := strings.Repeat("é", 100)
	got := Text(long, 51)
	if len(got) > 54 || !strings.HasSuffix(got, "...") || !utf8.ValidString(got) {
		t.Errorf("cut: %q (%d bytes)", got, len(got))
	}
}

func FuzzText(f *testing.F) {
	f.Add("a\x1b[2J\n\u202e\xff", 64)
	f.Fuzz(func(t *testing.T, s string, max int) {
		max = max%2048 + 1
		if max < 1 {
			max += 2048
		}
		got := Text(s, max)
		if !utf8.ValidString(got) || len(got) > max+3 {
			t.Fatalf("Text(%q, %d) = %q", s, max, got)
		}
		for _, r := range got {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) {
				t.Fatalf("Text(%q) kept %U: %q", s, r, got)
			}
		}
	})
}
