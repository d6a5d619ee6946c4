package secrets

import (
	"bytes"
	"io"
)

// replacer turns each of a set of byte strings into another (real secret
// values, in every form the scrubber knows, into their placeholders on the
// way back to the guest). It matches exactly (case-sensitively), leftmost
// first, longest first at one position, and never rescans its own output.
// It runs in time linear in its input for each rule (plus the length of
// each replacement), whatever the input holds.
//
// A rule may carry a base64 edge (see b64edge): then the base64 characters
// just before and after the match, which mix bits of the secret with bits
// of whatever surrounds it, are rewritten too.
//
// A replacer is immutable and safe for concurrent use.
type replacer struct {
	rules  []rule
	maxLen int // longest old
	look   int // bytes kept before a possible match for a base64 edge (0 or maxToken)
}

// rule replaces old by new.
type rule struct {
	old, new []byte
	edge     *b64edge
	fail     []int // KMP failure function of old
}

// maxToken is the longest form of one base64 character the edges accept:
// `\u002B` (a JSON escape).
const maxToken = 6

func newReplacer(oldnew ...string) *replacer {
	var rules []rule
	for i := 0; i+1 < len(oldnew); i += 2 {
		rules = append(rules, rule{old: []byte(oldnew[i]), new: []byte(oldnew[i+1])})
	}
	return newReplacerRules(rules)
}

// newReplacerRules builds a replacer; rules with an empty old are dropped,
// and of two rules with the same old the first is kept.
func newReplacerRules(rules []rule) *replacer {
	r := &replacer{}
	seen := map[string]bool{}
	for _, ru := range rules {
		if len(ru.old) == 0 || seen[string(ru.old)] {
			continue
		}
		seen[string(ru.old)] = true
		ru.fail = failure(ru.old)
		r.rules = append(r.rules, ru)
		r.maxLen = max(r.maxLen, len(ru.old))
		if ru.edge != nil {
			r.look = maxToken
		}
	}
	return r
}

// with returns a replacer with r's rules and then extra ones (which lose
// ties against r's).
func (r *replacer) with(extra []rule) *replacer {
	if len(extra) == 0 {
		return r
	}
	return newReplacerRules(append(append([]rule(nil), r.rules...), extra...))
}

// failure returns the KMP failure function of p: f[i] is the length of the
// longest proper prefix of p[:i+1] that is also its suffix.
func failure(p []byte) []int {
	f := make([]int, len(p))
	for i, k := 1, 0; i < len(p); i++ {
		for k > 0 && p[i] != p[k] {
			k = f[k-1]
		}
		if p[i] == p[k] {
			k++
		}
		f[i] = k
	}
	return f
}

// String replaces every old string in s.
func (r *replacer) String(s string) string {
	if len(r.rules) == 0 {
		return s
	}
	out, _ := r.transform(nil, []byte(s), true)
	return string(out)
}

// contains reports whether s holds any of the old strings.
func (r *replacer) contains(s string) bool {
	for _, ru := range r.rules {
		if bytes.Contains([]byte(s), ru.old) {
			return true
		}
	}
	return false
}

// transform appends to dst the replaced form of in and returns the bytes it
// held back because they may be the start of an old string split across
// calls, or the base64 character before one (none when atEOF).
func (r *replacer) transform(dst, in []byte, atEOF bool) (out, rest []byte) {
	// next[k] caches where rule k next matches at or after pos: -2 not
	// searched yet, -1 nowhere. A cached match before pos is searched again
	// from pos, so each rule scans the input about once.
	next := make([]int, len(r.rules))
	for k := range next {
		next[k] = -2
	}
	pos := 0
	for {
		at, which := -1, -1
		for k := range r.rules {
			if next[k] == -2 || next[k] >= 0 && next[k] < pos {
				next[k] = -1
				if i := bytes.Index(in[pos:], r.rules[k].old); i >= 0 {
					next[k] = pos + i
				}
			}
			if n := next[k]; n >= 0 && (at < 0 || n < at || n == at && len(r.rules[k].old) > len(r.rules[which].old)) {
				at, which = n, k
			}
		}
		if at < 0 {
			break
		}
		ru := &r.rules[which]
		end := at + len(ru.old)
		if !atEOF && (r.couldGrow(in[at:], len(ru.old)) || ru.edge != nil && ru.edge.trailBits > 0 && len(in)-end < maxToken) {
			// A longer old string may still match here, or the character
			// after the match is not all there yet: hold back from the
			// match (and the character before it) on.
			cut := max(pos, at-r.look)
			return append(dst, in[pos:cut]...), in[cut:]
		}
		from := at
		var lead []byte
		if e := ru.edge; e != nil {
			if n, c, ok := e.lead(in[pos:at]); ok {
				from, lead = at-n, []byte{c}
			}
			end += e.trail(in[end:])
		}
		dst = append(dst, in[pos:from]...)
		dst = append(dst, lead...)
		dst = append(dst, ru.new...)
		pos = end
	}
	hold := 0
	if !atEOF {
		for k := range r.rules {
			hold = max(hold, r.rules[k].partial(in[pos:]))
		}
		hold = min(len(in)-pos, hold+r.look)
	}
	return append(dst, in[pos:len(in)-hold]...), in[len(in)-hold:]
}

// partial returns the length of the longest suffix of b that is a proper
// prefix of ru.old.
func (ru *rule) partial(b []byte) int {
	if n := len(ru.old) - 1; len(b) > n {
		b = b[len(b)-n:]
	}
	q := 0
	for _, c := range b {
		for q > 0 && (q == len(ru.old) || ru.old[q] != c) {
			q = ru.fail[q-1]
		}
		if ru.old[q] == c {
			q++
		}
	}
	if q == len(ru.old) {
		q = ru.fail[q-1]
	}
	return q
}

// couldGrow reports whether tail is a proper prefix of an old string longer
// than n bytes.
func (r *replacer) couldGrow(tail []byte, n int) bool {
	for _, ru := range r.rules {
		if len(ru.old) > n && len(tail) < len(ru.old) && bytes.HasPrefix(ru.old, tail) {
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
