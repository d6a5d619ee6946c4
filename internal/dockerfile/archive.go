package dockerfile

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"

	"github.com/airlock-sandbox/airlock/internal/archive"
)

// Magic numbers of the compressions ADD recognises.
var (
	gzipMagic  = []byte{0x1f, 0x8b}
	bzip2Magic = []byte("BZh")
	xzMagic    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	zstdMagic  = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// errUnsupportedCompression: a file compressed in a way ADD does not
// decompress; docker would extract it if it held a tar, so it is refused
// rather than copied as it is.
var errUnsupportedCompression = errors.New("xz and zstd archives are not extracted: use COPY and RUN tar")

// tarReader reads r as a tar stream, decompressing gzip and bzip2.
func tarReader(r io.Reader) (*tar.Reader, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(len(xzMagic))
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		zr.Multistream(true)
		return tar.NewReader(zr), nil
	case bytes.HasPrefix(magic, bzip2Magic):
		return tar.NewReader(bzip2.NewReader(br)), nil
	case bytes.HasPrefix(magic, xzMagic), bytes.HasPrefix(magic, zstdMagic):
		return nil, errUnsupportedCompression
	default:
		return tar.NewReader(br), nil
	}
}

// isArchive says the context file rel is a tar archive (plain, gzip or
// bzip2) that ADD extracts: its first header reads cleanly.
func (c *Context) isArchive(rel string, follow bool) (bool, error) {
	f, err := c.openFile(rel, follow)
	if err != nil {
		return false, err
	}
	defer f.Close()
	tr, err := tarReader(f)
	if errors.Is(err, errUnsupportedCompression) {
		return false, err
	}
	if err != nil {
		return false, nil // compressed, but not a tar: copied as it is
	}
	_, err = tr.Next()
	return err == nil, nil
}

// extract emits the entries of the context archive e.src, re-rooted at the
// step's directory. n and size count the step's entries and bytes so far.
func (c *Context) extract(cp *copyPlan, e entry, n *int, size *int64, fn emitFunc) error {
	src := e.src
	f, err := c.openFile(src, e.follow)
	if err != nil {
		return invalid(cp.line, "ADD: open %q: %v", src, err)
	}
	defer f.Close()
	tr, err := tarReader(f)
	if err != nil {
		return invalid(cp.line, "ADD %q: %v", src, err)
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return invalid(cp.line, "ADD %q: %v", src, err)
		}
		name, err := archive.CleanName(h.Name)
		if err != nil {
			return invalid(cp.line, "ADD %q: entry refused: %v", src, err)
		}
		if name == "" {
			continue // the archive's top directory: Dest itself
		}
		out := &tar.Header{Name: name, Mode: h.Mode & 0o7777, ModTime: h.ModTime, Format: tar.FormatPAX}
		switch h.Typeflag {
		case tar.TypeReg:
			out.Typeflag, out.Size = tar.TypeReg, h.Size
		case tar.TypeDir:
			out.Typeflag, out.Name = tar.TypeDir, name+"/"
		case tar.TypeSymlink:
			out.Typeflag, out.Linkname = tar.TypeSymlink, h.Linkname
		case tar.TypeLink:
			target, err := archive.CleanName(h.Linkname)
			if err != nil || target == "" {
				return invalid(cp.line, "ADD %q: hard link %q refused: bad target %q", src, name, h.Linkname)
			}
			out.Typeflag, out.Linkname = tar.TypeLink, target
		case tar.TypeXGlobalHeader:
			continue
		default:
			return invalid(cp.line, "ADD %q: entry %q refused: type %q is not a file, directory or link", src, name, h.Typeflag)
		}
		if cp.chmod >= 0 && out.Typeflag != tar.TypeSymlink {
			out.Mode = cp.chmod
		}
		*n++
		if *n > MaxStepEntries {
			return exhausted(cp.line, "ADD copies more than %d entries", MaxStepEntries)
		}
		*size += out.Size
		if *size > MaxStepBytes {
			return exhausted(cp.line, "ADD copies more than %d bytes", MaxStepBytes)
		}
		var data io.Reader
		if out.Typeflag == tar.TypeReg {
			r := &exactReader{r: tr, left: out.Size}
			data = r
			if err := fn(out, data); err != nil {
				if r.err != nil {
					return invalid(cp.line, "ADD %q: entry %q: %v", src, name, r.err)
				}
				return err
			}
			continue
		}
		if err := fn(out, nil); err != nil {
			return fmt.Errorf("ADD %q: %w", src, err)
		}
	}
}
