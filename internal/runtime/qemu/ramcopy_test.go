package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCopyNonZeroKeepsDataAndLeavesZeroPagesOut: a RAM memfd whose every
// page is allocated (as after a restore) is copied with its data at the same
// offsets; its zero pages, written or never touched, become holes.
func TestCopyNonZeroKeepsDataAndLeavesZeroPagesOut(t *testing.T) {
	const page, pages = 4096, 64
	ram, err := memfdCreate("test-ram", mfdCloexec)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	// Every page allocated, zero but for pages 3, 4 (a run), 40 and the
	// last one's last byte.
	if _, err := ram.WriteAt(make([]byte, page*pages), 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, page*pages)
	for _, p := range []int{3, 4, 40} {
		copy(want[p*page:], bytes.Repeat([]byte{byte(p)}, page))
	}
	want[len(want)-1] = 0xff
	if _, err := ram.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "mem.raw")
	if err := copyNonZero(out, ram); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the copy differs from the RAM")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(out, &st); err != nil {
		t.Fatal(err)
	}
	// 4 data pages; a file system may round up a little, never to the whole.
	if used := st.Blocks * 512; used < 4*page || used > 16*page {
		t.Errorf("the copy takes %d bytes on disk; want about %d (4 pages of %d)", used, 4*page, pages)
	}
	if err := copyNonZero(out, ram); err == nil {
		t.Error("copyNonZero over an existing file succeeded")
	}
}
