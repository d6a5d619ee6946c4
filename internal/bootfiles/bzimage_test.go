package bootfiles

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"os/exec"
	"strings"
	"testing"

	"github.com/pierrec/lz4/v4"

	"github.com/airlock-sandbox/airlock/internal/testutil"
)

// lz4Legacy compresses data as the kernel build does (lz4 -l): the legacy
// magic, then blocks of at most blockSize uncompressed bytes.
func lz4Legacy(t testing.TB, data []byte, blockSize int) []byte {
	t.Helper()
	out := append([]byte(nil), magicLZ4Legacy...)
	for len(data) > 0 {
		n := min(blockSize, len(data))
		dst := make([]byte, lz4.CompressBlockBound(n))
		c, err := lz4.CompressBlock(data[:n], dst, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c == 0 { // incompressible: lz4 legacy has no raw blocks, so test data must compress
			t.Fatal("test data did not compress")
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(c))
		out = append(out, dst[:c]...)
		data = data[n:]
	}
	return out
}

// fakeBzImage wraps a compressed payload in an x86 boot header the way
// arch/x86/boot/tools/build does: setup sectors, then the protected-mode
// code with the payload at payload_offset, followed by the 4-byte
// uncompressed size. If header is false the header fields are left zero.
func fakeBzImage(compressed []byte, uncompressedSize int, header bool) []byte {
	const setupSects = 3
	const payloadOffset = 0x1ac // arbitrary, within the protected-mode code
	bz := make([]byte, (setupSects+1)*512+payloadOffset)
	pl := binary.LittleEndian.AppendUint32(append([]byte(nil), compressed...), uint32(uncompressedSize))
	if header {
		bz[0x1f1] = setupSects
		copy(bz[0x202:], "HdrS")
		binary.LittleEndian.PutUint16(bz[0x206:], 0x20f)
		binary.LittleEndian.PutUint32(bz[0x248:], payloadOffset)
		binary.LittleEndian.PutUint32(bz[0x24c:], uint32(len(pl)))
	}
	bz = append(bz, pl...)
	return append(bz, bytes.Repeat([]byte{0xcc}, 100)...) // trailing code after the payload
}

func kernelELF(t testing.TB) []byte {
	return buildELF(t, fakeELF{notes: append(note("GNU", 3, []byte("abcd")), pvhNote()...), padding: 300 << 10})
}

func TestExtractVmlinux(t *testing.T) {
	t.Parallel()
	vmlinux := kernelELF(t)
	for _, tc := range []struct {
		name     string
		bz       func(t *testing.T) []byte
		format   string
		needTool string
	}{
		{"lz4 header", func(t *testing.T) []byte { return fakeBzImage(lz4Legacy(t, vmlinux, 100<<10), len(vmlinux), true) }, formatLZ4, ""},
		{"lz4 scanned", func(t *testing.T) []byte { return fakeBzImage(lz4Legacy(t, vmlinux, 64<<10), len(vmlinux), false) }, formatLZ4, ""},
		{"gzip header", func(t *testing.T) []byte { return fakeBzImage(gzipBytes(t, vmlinux), len(vmlinux), true) }, formatGzip, ""},
		{"xz header", func(t *testing.T) []byte {
			return fakeBzImage(toolCompress(t, vmlinux, "xz", "-c", "--check=crc32"), len(vmlinux), true)
		}, formatXZ, "xz"},
		{"xz scanned", func(t *testing.T) []byte {
			return fakeBzImage(toolCompress(t, vmlinux, "xz", "-c", "--check=crc32"), len(vmlinux), false)
		}, formatXZ, "xz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.needTool != "" {
				requireTool(t, tc.needTool)
			}
			var out bytes.Buffer
			format, err := extractVmlinux(t.Context(), tc.bz(t), &out)
			if err != nil {
				t.Fatal(err)
			}
			if format != tc.format {
				t.Errorf("format = %q, want %q", format, tc.format)
			}
			if !bytes.Equal(out.Bytes(), vmlinux) {
				t.Fatalf("decompressed %d bytes, differ from the %d-byte original", out.Len(), len(vmlinux))
			}
			if err := checkVmlinux(bytes.NewReader(out.Bytes())); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestFindPayloadHeaderPosition(t *testing.T) {
	t.Parallel()
	vmlinux := kernelELF(t)
	c := lz4Legacy(t, vmlinux, 128<<10)
	bz := fakeBzImage(c, len(vmlinux), true)
	p, err := findPayload(bz)
	if err != nil {
		t.Fatal(err)
	}
	if p.size != int64(len(vmlinux)) || !bytes.Equal(p.data, c) {
		t.Fatalf("payload: size %d len %d, want %d and %d", p.size, len(p.data), len(vmlinux), len(c))
	}
}

func TestExtractVmlinuxSizeMismatch(t *testing.T) {
	t.Parallel()
	vmlinux := kernelELF(t)
	bz := fakeBzImage(lz4Legacy(t, vmlinux, 100<<10), len(vmlinux)+1, true)
	var out bytes.Buffer
	if _, err := extractVmlinux(t.Context(), bz, &out); err == nil || !strings.Contains(err.Error(), "header says") {
		t.Fatalf("err = %v, want a size mismatch", err)
	}
}

func TestFindPayloadNone(t *testing.T) {
	t.Parallel()
	if _, err := findPayload(bytes.Repeat([]byte{0x90}, 4096)); err == nil {
		t.Fatal("want an error for data without a payload")
	}
}

func TestDecodeLZ4LegacyCorrupt(t *testing.T) {
	t.Parallel()
	c := lz4Legacy(t, kernelELF(t), 100<<10)
	c[len(c)/2] ^= 0xff
	c[len(c)/2+1] ^= 0xff
	var out bytes.Buffer
	err := decodeLZ4Legacy(c, &out)
	if err == nil && bytes.Equal(out.Bytes(), kernelELF(t)) {
		t.Fatal("corruption went unnoticed")
	}
}

func TestCheckVmlinux(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		elf  fakeELF
		ok   bool
	}{
		{"pvh", fakeELF{notes: pvhNote()}, true},
		{"pvh after other notes", fakeELF{notes: append(note("Linux", 1, []byte("x")), pvhNote()...)}, true},
		{"no notes", fakeELF{}, false},
		{"other notes only", fakeELF{notes: note("GNU", 3, []byte("abcdefgh"))}, false},
		{"xen but other type", fakeELF{notes: note("Xen", 1, []byte{1, 2, 3, 4})}, false},
		{"wrong machine", fakeELF{notes: pvhNote(), machine: elf.EM_AARCH64}, false},
		{"relocatable", fakeELF{notes: pvhNote(), typ: elf.ET_REL}, false},
	} {
		err := checkVmlinux(bytes.NewReader(buildELF(t, tc.elf)))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if err := checkVmlinux(bytes.NewReader([]byte("MZ not an elf"))); err == nil {
		t.Error("non-ELF accepted")
	}
}

func gzipBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func toolCompress(t testing.TB, b []byte, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// requireTool skips t when a compression tool the code shells out to is
// missing, and fails it in the tiers of `make test` (testutil.NeedTool).
// These tools are part of every Debian install (xz-utils, zstd from `make
// deps`).
func requireTool(t testing.TB, name string) {
	t.Helper()
	testutil.NeedTool(t, name, "make deps, or apt-get install xz-utils zstd")
}
