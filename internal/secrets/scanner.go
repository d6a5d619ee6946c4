package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
)

// ErrPlaceholder is the error (wrapped in a [*PlaceholderError]) for bytes
// that carry a secret's placeholder to a host the secret is not bound to.
var ErrPlaceholder = errors.New("secret placeholder sent to a host it is not bound to")

// PlaceholderError reports which placeholder was found. It names only the
// placeholder, never a secret's value.
type PlaceholderError struct {
	Placeholder string // the plain form
}

func (e *PlaceholderError) Error() string {
	return "placeholder " + e.Placeholder + ": " + ErrPlaceholder.Error()
}

// Unwrap returns [ErrPlaceholder].
func (e *PlaceholderError) Unwrap() error { return ErrPlaceholder }

// pattern is one byte string a Scanner looks for.
type pattern struct {
	b           []byte // lower-case when fold
	fold        bool   // match ASCII case-insensitively
	placeholder string // the plain placeholder it stands for
}

// Scanner finds placeholders in bytes, in their plain form (ASCII
// case-insensitively), as lower- or upper-case hex, and inside standard and
// URL-safe base64 at each of the three byte alignments: for each, the run of
// base64 characters that depends only on the placeholder's bytes, whatever
// precedes or follows it (so base64("user:"+placeholder) in a Basic
// Authorization header is found). Other encodings (percent-encoding of
// unreserved characters, compression, encryption, any reversible transform
// the guest chooses) are not detected: the scanner stops accidents and naive
// exfiltration of a placeholder, and the real guarantee is that the guest
// never holds a value.
//
// A Scanner is immutable and safe for concurrent use.
type Scanner struct {
	patterns []pattern
	maxLen   int
	first    [256]bool // first bytes of patterns (both cases for folded ones)
}

// NewScanner returns a scanner for placeholders. With an empty list it never
// matches. Empty strings in the list are ignored.
func NewScanner(placeholders []string) *Scanner {
	s := &Scanner{}
	seen := map[string]bool{}
	add := func(b []byte, fold bool, ph string) {
		if len(b) == 0 {
			return
		}
		if fold {
			b = bytes.ToLower(b)
		}
		key := string(b)
		if fold {
			key = "i:" + key
		} else {
			key = "s:" + key
		}
		if seen[key] {
			return
		}
		seen[key] = true
		s.patterns = append(s.patterns, pattern{b: b, fold: fold, placeholder: ph})
		s.maxLen = max(s.maxLen, len(b))
		if fold {
			s.first[lower(b[0])] = true
			s.first[upper(b[0])] = true
		} else {
			s.first[b[0]] = true
		}
	}
	for _, ph := range placeholders {
		if ph == "" {
			continue
		}
		add([]byte(ph), true, ph)
		add([]byte(hex.EncodeToString([]byte(ph))), true, ph)
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for align := range 3 {
				add(stableBase64(enc, []byte(ph), align), false, ph)
			}
		}
	}
	return s
}

// stableBase64 returns the base64 characters of the encoding of p, preceded
// by align (0..2) arbitrary bytes, that depend on p's bits alone: character i
// covers bits [6i, 6i+6) of the input, which must lie within p.
func stableBase64(enc *base64.Encoding, p []byte, align int) []byte {
	buf := make([]byte, align+len(p))
	copy(buf[align:], p)
	all := enc.EncodeToString(buf)
	from := (8*align + 5) / 6      // first character with no bit of the prefix
	to := 8 * (align + len(p)) / 6 // characters wholly inside p end here
	if to <= from {
		return nil
	}
	return []byte(all[from:to])
}

// Find reports the placeholder (its plain form) whose pattern starts
// earliest in b, if any.
func (s *Scanner) Find(b []byte) (placeholder string, ok bool) {
	if len(s.patterns) == 0 || len(b) == 0 {
		return "", false
	}
	var folded []byte
	best := -1
	for _, p := range s.patterns {
		hay := b
		if p.fold {
			if folded == nil {
				folded = bytes.ToLower(b)
			}
			hay = folded
		}
		if best >= 0 {
			hay = hay[:min(len(hay), best+len(p.b)-1)] // only an earlier match counts
		}
		if i := bytes.Index(hay, p.b); i >= 0 && (best < 0 || i < best) {
			best, placeholder = i, p.placeholder
		}
	}
	return placeholder, best >= 0
}

// holdBack returns the length of the longest proper suffix of b that is a
// prefix of some pattern: the bytes that could still become a match.
func (s *Scanner) holdBack(b []byte) int {
	return longestPartial(b, s.maxLen, func(suffix []byte) bool {
		if !s.first[suffix[0]] {
			return false
		}
		for _, p := range s.patterns {
			if len(suffix) < len(p.b) && hasPrefix(p.b, suffix, p.fold) {
				return true
			}
		}
		return false
	})
}

// longestPartial returns the length k < maxLen of the longest suffix of b
// for which isPrefix holds (0 if none).
func longestPartial(b []byte, maxLen int, isPrefix func(suffix []byte) bool) int {
	for k := min(len(b), maxLen-1); k > 0; k-- {
		if isPrefix(b[len(b)-k:]) {
			return k
		}
	}
	return 0
}

// hasPrefix reports whether pat starts with b, folding b's ASCII case when
// fold is set (pat is then lower-case already).
func hasPrefix(pat, b []byte, fold bool) bool {
	if len(b) > len(pat) {
		return false
	}
	if !fold {
		return bytes.Equal(pat[:len(b)], b)
	}
	for i, c := range b {
		if lower(c) != pat[i] {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

// Guard returns a writer that forwards to w everything but placeholders.
func (s *Scanner) Guard(w io.Writer) *Guard { return &Guard{s: s, w: w} }

// Guard is an io.Writer that forwards bytes to another writer unless they
// carry a placeholder its [Scanner] knows. It holds back only the longest
// suffix of what it has seen that is a prefix of some pattern (at most the
// longest pattern's length less one), so unrelated data is never stalled: an
// interactive protocol sees every byte as soon as it can no longer be the
// start of a placeholder.
//
// On a match, Write forwards nothing of the write that completed it and
// returns an error wrapping [ErrPlaceholder] (a [*PlaceholderError]); every
// later Write and Flush returns the same error. Call Flush at EOF to forward
// the bytes still held back. A Guard is not safe for concurrent use.
type Guard struct {
	s    *Scanner
	w    io.Writer
	held []byte
	err  error
}

// Write scans p together with the bytes held back so far and forwards what
// can no longer be part of a placeholder. It returns len(p) on success; an
// error from the underlying writer is returned as is and is sticky.
func (g *Guard) Write(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	buf := p
	if len(g.held) > 0 {
		buf = append(g.held, p...)
	}
	if ph, ok := g.s.Find(buf); ok {
		g.held = nil
		g.err = &PlaceholderError{Placeholder: ph}
		return 0, g.err
	}
	k := g.s.holdBack(buf)
	if out := buf[:len(buf)-k]; len(out) > 0 {
		if _, err := g.w.Write(out); err != nil {
			g.err = err
			return 0, err
		}
	}
	g.held = append(g.held[:0:0], buf[len(buf)-k:]...)
	return len(p), nil
}

// Flush forwards the bytes held back (they are not a placeholder: the
// stream ended before one was complete).
func (g *Guard) Flush() error {
	if g.err != nil {
		return g.err
	}
	if len(g.held) == 0 {
		return nil
	}
	held := g.held
	g.held = nil
	if _, err := g.w.Write(held); err != nil {
		g.err = err
		return err
	}
	return nil
}
