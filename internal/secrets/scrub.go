package secrets

import (
	"encoding/base64"
	"fmt"
	"html"
	"net/url"
	"strings"
	"unicode/utf8"
)

// The response scrubber replaces every form in which the interceptor puts a
// secret's value on the wire, and the usual re-encodings of those forms by
// a host that echoes them, by the corresponding form of the placeholder:
//
//   - the raw value (headers);
//   - url.QueryEscape and url.PathEscape of it (query and path), with
//     upper- and lower-case hex digits;
//   - the exact Basic credentials built for this connection's requests, in
//     standard and URL-safe base64, padded and not (see credentialRules);
//   - the base64 of the value at each of the three byte alignments, in both
//     alphabets (see b64Rules), whatever precedes or follows it;
//   - each of these HTML-escaped (Go's and Python's entities);
//   - each of these as a JSON string escapes it (jsonForms).
//
// minB64Core is the shortest run of base64 characters that is scrubbed as
// "the base64 of a value": a shorter one would turn up in unrelated base64
// data too often. Values shorter than about 6 bytes are therefore not
// scrubbed in base64 form.
const minB64Core = 8

// maxCredential bounds the exact Basic credentials remembered per
// connection (their encoded length, and how many); beyond it the base64
// rules still hide the value.
const (
	maxCredentialLen = 1 << 10
	maxCredentials   = 16
)

// htmlPython escapes as Python's html.escape (Go's html.EscapeString writes
// &#39; and &#34; instead).
var htmlPython = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;")

// valueRules returns the scrub rules for every binding's value.
func valueRules(bindings []Binding) []rule {
	var rules []rule
	for _, b := range bindings {
		plain := []string{
			b.Value,
			url.QueryEscape(b.Value),
			url.PathEscape(b.Value),
			lowerPercent(url.QueryEscape(b.Value)),
			lowerPercent(url.PathEscape(b.Value)),
		}
		for _, f := range plain[:len(plain):len(plain)] {
			plain = append(plain, html.EscapeString(f), htmlPython.Replace(f))
		}
		for _, f := range plain {
			for _, j := range append([]string{f}, jsonForms(f)...) {
				rules = append(rules, rule{old: []byte(j), new: []byte(b.Placeholder)})
			}
		}
		rules = append(rules, b64Rules(b.Value, b.Placeholder)...)
	}
	return rules
}

// credential is one Basic credential the injector built: the decoded
// user:password with the placeholders (as the guest sent it) and with the
// values (as the upstream received it).
type credential struct {
	guest, sent string
	colonInUser bool // a value with a colon was put in the user-id
}

// credentialRules scrubs the exact encodings of a credential, restoring the
// guest's own.
func credentialRules(c credential) []rule {
	var rules []rule
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		old, repl := enc.EncodeToString([]byte(c.sent)), enc.EncodeToString([]byte(c.guest))
		if len(old) > maxCredentialLen {
			return nil
		}
		for _, j := range append([]string{old}, jsonForms(old)...) {
			rules = append(rules, rule{old: []byte(j), new: []byte(repl)})
		}
	}
	return rules
}

// b64edge describes the base64 characters on either side of the base64 of
// a value, at one alignment: they mix bits of the value with bits of what
// precedes or follows it, so they are rewritten along with the run between
// them, which depends on the value alone. After scrubbing, no output bit
// depends on the value.
type b64edge struct {
	alphabet  string
	leadBits  int  // bits of the value in the character before the run (0, 2 or 4)
	leadV     byte // those bits of the value
	leadP     byte // the placeholder's bits put in their place
	trailBits int  // bits of the value in the character after the run (0, 2 or 4)
	trailV    byte // those bits
}

// b64Rules returns, for both alphabets and the three byte alignments, the
// rules replacing the run of base64 characters that depends on value alone
// (see stableBase64) by the placeholder's run at the same alignment,
// followed by a character holding the placeholder's last bits (if its
// encoding has one). The characters before and after the run are rewritten
// by the edge (b64edge). Runs shorter than minB64Core are not scrubbed.
func b64Rules(value, placeholder string) []rule {
	var rules []rule
	v, p := []byte(value), []byte(placeholder)
	for _, enc := range []struct {
		raw      *base64.Encoding
		alphabet string
	}{
		{base64.RawStdEncoding, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"},
		{base64.RawURLEncoding, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"},
	} {
		for align := range 3 {
			core := stableBase64(enc.raw, v, align)
			if len(core) < minB64Core {
				continue
			}
			e := &b64edge{alphabet: enc.alphabet}
			// The character before the run holds 8*align mod 6 bits of
			// the prefix and the value's first 6 - that many bits.
			if pre := 8 * align % 6; pre != 0 {
				e.leadBits = 6 - pre
				e.leadV = v[0] >> (8 - e.leadBits)
				e.leadP = p[0] >> (8 - e.leadBits)
			}
			if e.trailBits = 8 * (align + len(v)) % 6; e.trailBits != 0 {
				e.trailV = v[len(v)-1] & (1<<e.trailBits - 1)
			}
			repl := stableBase64(enc.raw, p, align)
			if tb := 8 * (align + len(p)) % 6; tb != 0 {
				last := p[len(p)-1] & (1<<tb - 1)
				repl = append(repl, enc.alphabet[last<<(6-tb)])
			}
			for _, j := range append([]string{string(core)}, jsonForms(string(core))...) {
				rules = append(rules, rule{old: []byte(j), new: repl, edge: e})
			}
		}
	}
	return rules
}

// lead looks at the bytes before a run (b) for the base64 character that
// shares bits with the value. If it is there, it returns its length (it
// may be JSON-escaped) and its replacement: the same prefix bits, the
// placeholder's bits.
func (e *b64edge) lead(b []byte) (n int, c byte, ok bool) {
	if e.leadBits == 0 {
		return 0, 0, false
	}
	ch, n := lastToken(b)
	i := strings.IndexByte(e.alphabet, ch)
	mask := byte(1<<e.leadBits - 1)
	if n == 0 || i < 0 || byte(i)&mask != e.leadV {
		return 0, 0, false
	}
	return n, e.alphabet[byte(i)&^mask|e.leadP], true
}

// trail returns the length of the base64 character after a run (b starts
// after it) that shares bits with the value, 0 if there is none.
func (e *b64edge) trail(b []byte) int {
	if e.trailBits == 0 {
		return 0
	}
	ch, n := firstToken(b)
	i := strings.IndexByte(e.alphabet, ch)
	if n == 0 || i < 0 || byte(i)>>(6-e.trailBits) != e.trailV {
		return 0
	}
	return n
}

// lastToken decodes the character that ends b, which may be JSON-escaped
// (`\/`, `\u002b`); n is 0 if there is none or it follows a backslash.
func lastToken(b []byte) (c byte, n int) {
	if k := len(b) - 6; k >= 0 && b[k] == '\\' && b[k+1] == 'u' {
		if c, ok := hexEscape(b[k+2:]); ok {
			return c, 6
		}
	}
	if k := len(b) - 2; k >= 0 && b[k] == '\\' {
		if b[k+1] == '/' {
			return '/', 2
		}
		return 0, 0
	}
	if len(b) == 0 {
		return 0, 0
	}
	return b[len(b)-1], 1
}

// firstToken decodes the character that starts b, as lastToken.
func firstToken(b []byte) (c byte, n int) {
	if len(b) >= 6 && b[0] == '\\' && b[1] == 'u' {
		if c, ok := hexEscape(b[2:6]); ok {
			return c, 6
		}
	}
	if len(b) >= 2 && b[0] == '\\' {
		if b[1] == '/' {
			return '/', 2
		}
		return 0, 0
	}
	if len(b) == 0 {
		return 0, 0
	}
	return b[0], 1
}

// hexEscape decodes the four hex digits of a JSON \u escape of an ASCII
// character.
func hexEscape(h []byte) (byte, bool) {
	var v int
	for _, c := range h[:4] {
		var d int
		switch {
		case '0' <= c && c <= '9':
			d = int(c - '0')
		case 'a' <= c && c <= 'f':
			d = int(c-'a') + 10
		case 'A' <= c && c <= 'F':
			d = int(c-'A') + 10
		default:
			return 0, false
		}
		v = v<<4 | d
	}
	return byte(v), v < 0x80
}

// lowerPercent lower-cases the hex digits of every percent escape in s.
func lowerPercent(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1], b[i+2] = lower(b[i+1]), lower(b[i+2])
			i += 2
		}
	}
	return string(b)
}

// jsonForms returns the forms s takes inside a JSON string as encoders
// write it, those that differ from s. Backslash is always `\\`; each other
// character an encoder may escape is written, consistently within one
// form, in each way encoders use: `"` as `\"` or `\u0022`; `/` raw or `\/`
// (PHP); `<`, `>`, `&` raw or `\u003c` (Go) or `\u003C` (.NET); `+` raw or
// `\u002b` or `\u002B` (.NET); `'` and backquote raw or `\u0027`,
// `\u0060`; non-ASCII characters raw or `\uXXXX` in either case (Python's
// ensure_ascii). Only the classes s holds multiply the forms.
func jsonForms(s string) []string {
	type class struct {
		has     func(rune) bool
		options []func(r rune) (string, bool)
	}
	hexEsc := func(upper bool) func(rune) (string, bool) {
		return func(r rune) (string, bool) {
			format := `\u%04x`
			if upper {
				format = `\u%04X`
			}
			if r > 0xffff {
				r -= 0x10000
				return fmt.Sprintf(format, 0xd800+(r>>10)) + fmt.Sprintf(format, 0xdc00+(r&0x3ff)), true
			}
			return fmt.Sprintf(format, r), true
		}
	}
	raw := func(rune) (string, bool) { return "", false }
	in := func(set string) func(rune) bool { return func(r rune) bool { return strings.ContainsRune(set, r) } }
	classes := []class{
		{in(`"`), []func(rune) (string, bool){func(rune) (string, bool) { return `\"`, true }, hexEsc(false), hexEsc(true)}},
		{in(`\`), []func(rune) (string, bool){func(rune) (string, bool) { return `\\`, true }}},
		{in("/"), []func(rune) (string, bool){raw, func(rune) (string, bool) { return `\/`, true }}},
		{in("<>&"), []func(rune) (string, bool){raw, hexEsc(false), hexEsc(true)}},
		{in("+"), []func(rune) (string, bool){raw, hexEsc(false), hexEsc(true)}},
		{in("'`"), []func(rune) (string, bool){raw, hexEsc(false)}},
		{func(r rune) bool { return r >= utf8.RuneSelf }, []func(rune) (string, bool){raw, hexEsc(false), hexEsc(true)}},
	}
	var present []class
	for _, c := range classes {
		if strings.ContainsFunc(s, c.has) {
			present = append(present, c)
		}
	}
	seen := map[string]bool{s: true}
	var out []string
	choice := make([]int, len(present))
	for {
		var b strings.Builder
		for _, r := range s {
			written := false
			for i, c := range present {
				if c.has(r) {
					if e, ok := c.options[choice[i]](r); ok {
						b.WriteString(e)
						written = true
					}
					break
				}
			}
			if !written {
				b.WriteRune(r)
			}
		}
		if f := b.String(); !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
		// Next combination.
		i := 0
		for ; i < len(present); i++ {
			if choice[i]++; choice[i] < len(present[i].options) {
				break
			}
			choice[i] = 0
		}
		if i == len(present) {
			return out
		}
	}
}
