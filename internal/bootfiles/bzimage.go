package bootfiles

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os/exec"

	"github.com/pierrec/lz4/v4"
)

// Compression formats of a bzImage payload.
const (
	formatLZ4  = "lz4"
	formatXZ   = "xz"
	formatGzip = "gzip"
	formatZstd = "zstd"
)

// maxVmlinuxSize caps the decompressed kernel. Debian's vmlinux is about
// 50 MiB; anything far larger is not a kernel.
const maxVmlinuxSize = 512 << 20

var (
	magicLZ4Legacy = []byte{0x02, 0x21, 0x4c, 0x18}
	magicXZ        = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicGzip      = []byte{0x1f, 0x8b, 0x08}
	magicZstd      = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// payload is the compressed kernel inside a bzImage.
type payload struct {
	format string
	data   []byte // the compressed stream, without the size trailer when known
	// size is the uncompressed size from the 4-byte trailer that the kernel
	// build appends to the payload, or -1 when the payload was found by
	// scanning for a magic (then the trailer may still follow data).
	size int64
}

// findPayload locates the compressed kernel in a bzImage. It trusts the boot
// protocol header (payload_offset and payload_length, protocol >= 2.08)
// when it is consistent, and otherwise scans for a known compression magic.
func findPayload(bz []byte) (payload, error) {
	if p, ok := payloadFromHeader(bz); ok {
		return p, nil
	}
	best, format := -1, ""
	for _, m := range []struct {
		magic  []byte
		format string
	}{
		{magicLZ4Legacy, formatLZ4},
		{magicXZ, formatXZ},
		{magicZstd, formatZstd},
		{magicGzip, formatGzip},
	} {
		if i := bytes.Index(bz, m.magic); i >= 0 && (best < 0 || i < best) {
			best, format = i, m.format
		}
	}
	if best < 0 {
		return payload{}, errors.New("no compressed kernel payload found (not a bzImage?)")
	}
	return payload{format: format, data: bz[best:], size: -1}, nil
}

// payloadFromHeader reads the payload position from the x86 boot protocol
// header. See Documentation/arch/x86/boot.rst.
func payloadFromHeader(bz []byte) (payload, bool) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return payload{}, false
	}
	if binary.LittleEndian.Uint16(bz[0x206:]) < 0x208 {
		return payload{}, false
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	off := uint64(setupSects+1)*512 + uint64(binary.LittleEndian.Uint32(bz[0x248:]))
	n := uint64(binary.LittleEndian.Uint32(bz[0x24c:]))
	if n < 8 || off+n > uint64(len(bz)) {
		return payload{}, false
	}
	data := bz[off : off+n]
	format := detectFormat(data)
	if format == "" {
		return payload{}, false
	}
	return payload{
		format: format,
		data:   data[:len(data)-4],
		size:   int64(binary.LittleEndian.Uint32(data[len(data)-4:])),
	}, true
}

func detectFormat(b []byte) string {
	switch {
	case bytes.HasPrefix(b, magicLZ4Legacy):
		return formatLZ4
	case bytes.HasPrefix(b, magicXZ):
		return formatXZ
	case bytes.HasPrefix(b, magicZstd):
		return formatZstd
	case bytes.HasPrefix(b, magicGzip):
		return formatGzip
	}
	return ""
}

// extractVmlinux decompresses the kernel in bzImage bz into w and returns
// the payload's format. LZ4 and gzip are decoded in Go; XZ and zstd by the
// xz and zstd tools. When the uncompressed size is known it is checked.
func extractVmlinux(ctx context.Context, bz []byte, w io.Writer) (string, error) {
	p, err := findPayload(bz)
	if err != nil {
		return "", err
	}
	cw := &countingWriter{w: w, limit: maxVmlinuxSize}
	switch p.format {
	case formatLZ4:
		err = decodeLZ4Legacy(p.data, cw)
	case formatGzip:
		err = decodeGzip(p.data, cw)
	case formatXZ:
		err = decodeTool(ctx, cw, p.data, "xz", "-dc", "--single-stream")
	case formatZstd:
		err = decodeTool(ctx, cw, p.data, "zstd", "-dc")
	}
	if err != nil {
		return p.format, fmt.Errorf("decompress %s payload: %w", p.format, err)
	}
	if p.size >= 0 && cw.n != p.size {
		return p.format, fmt.Errorf("decompress %s payload: got %d bytes, header says %d", p.format, cw.n, p.size)
	}
	return p.format, nil
}

// decodeLZ4Legacy decodes an LZ4 legacy frame as the kernel writes it: the
// magic, then blocks of (4-byte little-endian compressed size, data), each
// at most 8 MiB uncompressed. A repeated magic starts a new frame. Decoding
// stops at the end of data, or at a length that cannot be a block (the
// uncompressed-size trailer when the payload was found by scanning).
func decodeLZ4Legacy(data []byte, w io.Writer) error {
	const blockMax = 8 << 20
	if !bytes.HasPrefix(data, magicLZ4Legacy) {
		return errors.New("not an lz4 legacy frame")
	}
	buf := make([]byte, blockMax)
	pos := len(magicLZ4Legacy)
	blocks := 0
	for len(data)-pos >= 4 {
		cs := binary.LittleEndian.Uint32(data[pos:])
		if cs == binary.LittleEndian.Uint32(magicLZ4Legacy) {
			pos += 4
			continue
		}
		if cs == 0 || uint64(cs) > uint64(lz4.CompressBlockBound(blockMax)) || uint64(pos)+4+uint64(cs) > uint64(len(data)) {
			break
		}
		pos += 4
		n, err := lz4.UncompressBlock(data[pos:pos+int(cs)], buf)
		if err != nil {
			return fmt.Errorf("block %d: %w", blocks, err)
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		pos += int(cs)
		blocks++
	}
	if blocks == 0 {
		return errors.New("lz4 frame holds no blocks")
	}
	return nil
}

func decodeGzip(data []byte, w io.Writer) error {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return err
	}
	zr.Multistream(false)
	_, err = io.Copy(w, zr)
	return err
}

// decodeTool pipes data through an external decompressor.
func decodeTool(ctx context.Context, w io.Writer, data []byte, name string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = bytes.NewReader(data)
	cmd.Stdout = w
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// countingWriter counts bytes and refuses to write past limit.
type countingWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.limit {
		return 0, fmt.Errorf("output exceeds %d bytes", c.limit)
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ELF note identifying the PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY).
const (
	pvhNoteName = "Xen"
	pvhNoteType = 18
)

// checkVmlinux verifies that r is an x86-64 ELF executable with a PVH entry
// note, which QEMU needs to boot an uncompressed kernel with -kernel.
func checkVmlinux(r io.ReaderAt) error {
	f, err := elf.NewFile(r)
	if err != nil {
		return fmt.Errorf("not an ELF file: %w", err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		return fmt.Errorf("not an x86-64 ELF executable (%v %v %v)", f.Class, f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes, err := io.ReadAll(io.LimitReader(p.Open(), 1<<20))
		if err != nil {
			return fmt.Errorf("read ELF notes: %w", err)
		}
		if hasNote(notes, f.ByteOrder, pvhNoteName, pvhNoteType) {
			return nil
		}
	}
	return errors.New("ELF has no PVH entry note (kernel built without CONFIG_PVH)")
}

// hasNote reports whether the ELF note segment b holds a note with the
// given name and type.
func hasNote(b []byte, bo binary.ByteOrder, name string, typ uint32) bool {
	align4 := func(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
	for len(b) >= 12 {
		namesz, descsz, t := bo.Uint32(b), bo.Uint32(b[4:]), bo.Uint32(b[8:])
		b = b[12:]
		if align4(namesz)+align4(descsz) > uint64(len(b)) {
			return false
		}
		n := b[:namesz]
		if t == typ && string(bytes.TrimRight(n, "\x00")) == name {
			return true
		}
		b = b[align4(namesz)+align4(descsz):]
	}
	return false
}
