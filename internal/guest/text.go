package guest

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text makes a string the guest wrote (an error message, a kernel
// release) safe to show as the host's own words: in a terminal, a log line
// or an HTTP error body. Control characters (C0, DEL, C1), Unicode
// formatting characters that reorder or hide text (bidi overrides,
// zero-width) and bytes that are not UTF-8 are written as Go escapes
// (\x1b, \n, \u202e), and the result is cut at max bytes with "...". What a
// guest process prints (stdout, stderr, tracebacks) is data the user asked
// for and is not passed through Text.
func Text(s string, max int) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && n == 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case r == '\t':
			piece = " "
		case r == '\n':
			piece = `\n`
		case r == '\r':
			piece = `\r`
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			piece = fmt.Sprintf(`\x%02x`, r)
		case unicode.Is(unicode.Cf, r) || r == utf8.RuneError:
			piece = fmt.Sprintf(`\u%04x`, r)
		default:
			piece = s[i : i+n]
		}
		if b.Len()+len(piece) > max {
			b.WriteString("...")
			break
		}
		b.WriteString(piece)
		i += n
	}
	return b.String()
}
