package secrets

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
)

// contentCoding returns the one content coding a response body must be
// decoded from before it can be scrubbed: "" for none (no Content-Encoding,
// or only "identity"), "gzip" (also "x-gzip") or "deflate". ok is false for
// anything else: another coding (br, zstd, compress, unknown), or more than
// one. The interceptor asks for identity, so a compliant upstream never
// sends any.
func contentCoding(h http.Header) (coding string, ok bool) {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			c = strings.ToLower(strings.Trim(c, " \t"))
			if c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0:
		return "", true
	case len(codings) > 1:
		return "", false
	case codings[0] == "gzip" || codings[0] == "x-gzip":
		return "gzip", true
	case codings[0] == "deflate":
		return "deflate", true
	}
	return "", false
}

// newDecoder returns a reader of body decoded from coding ("gzip" or
// "deflate"). Deflate is the zlib format (RFC 9110), or raw deflate, which
// some servers send instead, when the first two bytes are not a zlib
// header. An empty body decodes to an empty body. The decoder streams: it holds a window, never the whole body.
func newDecoder(coding string, body io.Reader) (io.Reader, error) {
	br := bufio.NewReader(body)
	if _, err := br.Peek(1); err == io.EOF {
		return br, nil // an empty body, whatever its coding claims
	}
	if coding == "gzip" {
		return gzip.NewReader(br)
	}
	if h, err := br.Peek(2); err == nil && h[0]&0x0f == 8 && (uint(h[0])<<8|uint(h[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}
