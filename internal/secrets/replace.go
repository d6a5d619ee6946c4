package secrets

import (
	"bytes"
	"io"
	"strings"
)

// replacer turns each of a set of byte strings into another (real secret
// values into their placeholders, on the way back to the guest). It matches
// exactly (case-sensitively), leftmost first, longest first at one position,
// and never rescans its own output.
type replacer struct {
	olds, news [][]byte
	maxLen     int
}

func newReplacer(oldnew ...string) *replacer {
	r := &replacer{}
	for i := 0; i+1 < len(oldnew); i += 2 {
		if oldnew[i] == "" {
			continue
		}
		r.olds = append(r.olds, []byte(oldnew[i]))
		r.news = append(r.news, []byte(oldnew[i+1]))
		r.maxLen = max(r.maxLen, len(oldnew[i]))
	}
	return r
}

// String replaces every old string in s.
func (r *replacer) String(s string) string {
	if len(r.olds) == 0 {
		return s
	}
	out, _ := r.transform(nil, []byte(s), true)
	return string(out)
}

// contains reports whether s holds any of the old strings.
func (r *replacer) contains(s string) bool {
	for _, o := range r.olds {
		if strings.Contains(s, string(o)) {
			return true
		}
	}
	return false
}

// transform appends to dst the replaced form of in and returns the bytes it
// held back because they may be the start of an old string split across
// calls (none when atEOF).
func (r *replacer) transform(dst, in []byte, atEOF bool) (out, rest []byte) {
	for len(in) > 0 {
		at, which := -1, -1
		for k, o := range r.olds {
			hay := in
			if at >= 0 {
				hay = in[:min(len(in), at+len(o))]
			}
			if i := bytes.Index(hay, o); i >= 0 && (at < 0 || i < at || i == at && len(o) > len(r.olds[which])) {
				at, which = i, k
			}
		}
		if at < 0 {
			break
		}
		if !atEOF && r.couldGrow(in[at:], len(r.olds[which])) {
			// A longer old string may still match here once more input
			// arrives: hold back from the match on.
			return append(dst, in[:at]...), in[at:]
		}
		dst = append(dst, in[:at]...)
		dst = append(dst, r.news[which]...)
		in = in[at+len(r.olds[which]):]
	}
	hold := 0
	if !atEOF {
		hold = longestPartial(in, r.maxLen, func(suffix []byte) bool {
			for _, o := range r.olds {
				if len(suffix) < len(o) && bytes.HasPrefix(o, suffix) {
					return true
				}
			}
			return false
		})
	}
	return append(dst, in[:len(in)-hold]...), in[len(in)-hold:]
}

// couldGrow reports whether tail is a proper prefix of an old string longer
// than n bytes.
func (r *replacer) couldGrow(tail []byte, n int) bool {
	for _, o := range r.olds {
		if len(o) > n && len(tail) < len(o) && bytes.HasPrefix(o, tail) {
			return true
		}
	}
	return false
}

// replacingReader streams src through a replacer.
type replacingReader struct {
	r    *replacer
	src  io.ReadCloser
	buf  []byte // read buffer
	held []byte // unprocessed tail of the input
	out  []byte // processed, not yet returned
	err  error  // from src, reported once out is drained
}

// replaceReader returns a ReadCloser yielding src with r applied. Closing it
// closes src.
func replaceReader(src io.ReadCloser, r *replacer) io.ReadCloser {
	return &replacingReader{r: r, src: src, buf: make([]byte, 32<<10)}
}

func (rr *replacingReader) Read(p []byte) (int, error) {
	for len(rr.out) == 0 && rr.err == nil {
		n, err := rr.src.Read(rr.buf)
		in := append(rr.held, rr.buf[:n]...)
		rr.out, rr.held = rr.r.transform(rr.out[:0], in, err != nil)
		rr.held = append([]byte(nil), rr.held...)
		rr.err = err
	}
	if len(rr.out) > 0 {
		n := copy(p, rr.out)
		rr.out = rr.out[n:]
		return n, nil
	}
	return 0, rr.err
}

func (rr *replacingReader) Close() error { return rr.src.Close() }
