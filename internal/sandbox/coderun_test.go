package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/errdefs"
)

func TestSplitPattern(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ cwd, pattern, dir, rest string }{
		{"/root", "*.png", "/root", "*.png"},
		{"/root", "plot.png", "/root", "plot.png"},
		{"/root", "out/*.png", "/root/out", "*.png"},
		{"/root", "out/*/b?.svg", "/root/out", "*/b?.svg"},
		{"/root", "/tmp/*.png", "/tmp", "*.png"},
		{"/root", "../tmp/x.png", "/tmp", "x.png"},
		{"/", "*.png", "/", "*.png"},
		{"/root", "[ab]/c.png", "/root", "[ab]/c.png"},
	} {
		dir, rest := splitPattern(tc.cwd, tc.pattern)
		if dir != tc.dir || strings.Join(rest, "/") != tc.rest {
			t.Errorf("splitPattern(%q, %q) = %q %q, want %q %q", tc.cwd, tc.pattern, dir, rest, tc.dir, tc.rest)
		}
	}
}

func TestValidateReturnFiles(t *testing.T) {
	t.Parallel()
	if err := validateReturnFiles([]string{"*.png", "out/*.svg", "/tmp/a/*/*.jpg"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]string{
		{""}, {"[a"}, {"a\x00b"}, {strings.Repeat("a", 1025)}, {"*/*/*/*/*.png"},
		{"1", "2", "3", "4", "5", "6", "7", "8", "9"},
	} {
		if err := validateReturnFiles(bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestLooksLike(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mime string
		data string
		ok   bool
	}{
		{"image/png", "\x89PNG\r\n\x1a\nrest", true},
		{"image/png", "GIF89a", false},
		{"image/jpeg", "\xff\xd8\xff\xe0", true},
		{"image/gif", "GIF87a...", true},
		{"image/svg+xml", `<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"/>`, true},
		{"image/svg+xml", "<svg \xff>", false},
		{"image/webp", "RIFF", false},
	} {
		if got := looksLike(tc.mime, []byte(tc.data)); got != tc.ok {
			t.Errorf("looksLike(%s, %q) = %v", tc.mime, tc.data, got)
		}
	}
}
