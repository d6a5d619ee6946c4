package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConsoleLogCapsAndKeepsTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	c := newConsoleLog(f, 100)
	_, _ = c.Write([]byte("[    0.000000] Linux version 6.1\n"))
	for range 10000 {
		_, _ = c.Write([]byte("noise noise noise noise noise noise noise noise\n"))
	}
	_, _ = c.Write([]byte("[    2.100000] Kernel panic - not syncing: Attempted to kill init!\x1b[0m exitcode=0x00000100\n"))
	_, _ = c.Write([]byte("[    2.100001] Kernel panic - not syncing: second\n"))
	if got := c.PanicMessage(); got != "Kernel panic - not syncing: Attempted to kill init![0m exitcode=0x00000100" {
		t.Errorf("panic = %q", got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	if !strings.HasPrefix(s, "[    0.000000] Linux version 6.1\n") {
		t.Errorf("head lost: %q", s[:50])
	}
	if !strings.Contains(s, "bytes omitted") || !strings.HasSuffix(s, "second\n") {
		t.Errorf("tail lost: %q", s[len(s)-200:])
	}
	if len(s) > 100+consoleTailBytes+200 {
		t.Errorf("file is %d bytes", len(s))
	}
}

func TestSanitize(t *testing.T) {
	if got := sanitize("a\x00b\t\tc  \x7f" + strings.Repeat("x", 500)); len(got) != maxReasonLen || !strings.HasPrefix(got, "ab c x") {
		t.Errorf("got %q", got)
	}
}

func TestCappedWriter(t *testing.T) {
	var sb strings.Builder
	w := &cappedWriter{w: &sb, limit: 10}
	_, _ = w.Write([]byte("qemu: first\nqemu-system-x86_64: could not load kernel\n"))
	if sb.Len() != 10 {
		t.Errorf("wrote %d", sb.Len())
	}
	if got := w.LastLine(); got != "qemu-system-x86_64: could not load kernel" {
		t.Errorf("last line %q", got)
	}
}
