package secrets

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Two sets of values of the same length and shape (the same characters
// needing an escape at the same places) whose other characters, the first
// and last included, differ in every bit a base64 edge could carry. A guest
// that reads the same bytes whichever set the host holds learns nothing of
// the values.
var (
	echoValues1 = [2]string{
		"Zq+Ab/cD=eF+gH/iJ==kL9mN+oP/qR=sa",
		`p"w\ <d>&x:y z+1/2=3;?#[]@!$'()*,~%Q`,
	}
	echoValues2 = [2]string{
		">r+Xy/Wv=Ut+Sr/Qp==On8Ml+Kj/Ih=G^",
		`Q"b\ <c>&k:t m+7/5=9;?#[]@!$'()*,~%j`,
	}
	echoPh = [2]string{ph1, ph2}
)

func echoSecrets(values [2]string) []Binding {
	return []Binding{
		{Name: "KEY1", Hosts: []string{"api.test"}, Placeholder: echoPh[0], Value: values[0]},
		{Name: "KEY2", Hosts: []string{"api.test"}, Placeholder: echoPh[1], Value: values[1]},
	}
}

// echoHandler reflects the whole request: request line, headers, path (raw
// and decoded), query (raw and decoded), Basic credential (decoded, and the
// password re-encoded in base64 at each alignment and alphabet) and body,
// as text or as JSON in the escaping of several encoders (X-Echo-Format),
// and compressed as X-Echo-Encoding says (or gzip when the request accepts
// it), with a body over 1 MiB when X-Echo-Big is set.
func echoHandler(h *harness) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.reqs = append(h.reqs, seen{r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(body), false, r.Proto})
		h.mu.Unlock()
		m := map[string]any{
			"line":     r.Method + " " + r.RequestURI,
			"headers":  r.Header,
			"path":     r.URL.Path,
			"rawpath":  r.URL.RawPath,
			"rawquery": r.URL.RawQuery,
			"query":    r.URL.Query(),
			"body":     string(body),
		}
		if u, p, ok := r.BasicAuth(); ok {
			var b64 []string
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
				for _, pre := range []string{"", "x", "xy"} {
					b64 = append(b64, enc.EncodeToString([]byte(pre+p+"!")), enc.EncodeToString([]byte(pre+p)))
				}
			}
			m["user"], m["password"], m["b64"] = u, p, b64
		}
		var out []byte
		switch format := r.Header.Get("X-Echo-Format"); format {
		case "text", "html":
			var b bytes.Buffer
			fmt.Fprintf(&b, "%s\n", m["line"])
			_ = r.Header.Write(&b)
			fmt.Fprintf(&b, "path=%s rawpath=%s query=%s decoded=%v user=%v password=%v b64=%v\nbody=%s",
				r.URL.Path, r.URL.RawPath, r.URL.RawQuery, r.URL.Query(), m["user"], m["password"], m["b64"], body)
			out = b.Bytes()
			if format == "html" {
				out = []byte(html.EscapeString(string(out)))
			}
		default:
			var err error
			if out, err = json.Marshal(m); err != nil {
				panic(err)
			}
			switch format {
			case "php":
				out = bytes.ReplaceAll(out, []byte("/"), []byte(`\/`))
			case "dotnet":
				out = bytes.ReplaceAll(out, []byte("+"), []byte(`\u002B`))
			}
		}
		if r.Header.Get("X-Echo-Big") != "" {
			out = append(bytes.Repeat([]byte("0123456789abcdef"), (1<<20)/16+100), out...)
		}
		w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
		w.Header().Set("X-Echo-Query", r.URL.RawQuery)
		w.Header().Set("X-Echo-Path", r.URL.EscapedPath())
		enc := r.Header.Get("X-Echo-Encoding")
		if enc == "" && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			enc = "gzip"
		}
		var b bytes.Buffer
		var zw io.WriteCloser
		switch enc {
		case "gzip":
			zw = gzip.NewWriter(&b)
		case "deflate":
			zw, _ = zlib.NewWriterLevel(&b, zlib.DefaultCompression)
		case "rawdeflate":
			zw, _ = flate.NewWriter(&b, flate.DefaultCompression)
			enc = "deflate"
		case "br":
			b.Write(out) // not really brotli: the interceptor must refuse it unread
		default:
			_, _ = w.Write(out)
			return
		}
		if zw != nil {
			_, _ = zw.Write(out)
			zw.Close()
		}
		w.Header().Set("Content-Encoding", enc)
		_, _ = w.Write(b.Bytes())
	}
}

// echoRequests are the guest's requests: every injection site, each value.
func echoRequests() []string {
	var reqs []string
	for _, ph := range echoPh {
		reqs = append(reqs,
			"GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph+"\r\nX-Api-Key: k="+ph+";\r\n",
			"GET /echo?key="+ph+"&x=a"+ph+"b HTTP/1.1\r\nHost: api.test\r\n",
			"GET /echo/"+ph+"/x/a"+ph+" HTTP/1.1\r\nHost: api.test\r\n",
		)
		for _, user := range []string{"u", "us", "usr", ""} { // three alignments, and none
			cred := base64.StdEncoding.EncodeToString([]byte(user + ":" + ph))
			reqs = append(reqs, "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic "+cred+"\r\n")
		}
	}
	// The first value (no colon) as user-id and password at once.
	cred := base64.StdEncoding.EncodeToString([]byte(echoPh[0] + ":" + echoPh[0] + "x"))
	reqs = append(reqs, "GET /echo HTTP/1.1\r\nHost: api.test\r\nProxy-Authorization: Basic "+cred+"\r\nAuthorization: Basic "+cred+"\r\n")
	return reqs
}

// echoRun sends every request in every format and encoding through an
// interceptor holding values, and returns what the guest read for each
// (status, headers but Date, body), what the upstream saw, and the
// Accept-Encoding each request arrived with.
func echoRun(t *testing.T, values [2]string) (got []string, h *harness) {
	t.Helper()
	h = &harness{}
	h.start(t, echoSecrets(values), echoHandler(h))
	g := h.connect(t, "api.test", nil)
	for _, format := range []string{"text", "html", "json", "php", "dotnet"} {
		for _, enc := range []string{"", "gzip", "deflate", "rawdeflate", "askgzip", "big"} {
			if enc == "big" && format != "json" {
				continue // the streamed path once is enough
			}
			for _, raw := range echoRequests() {
				extra := "X-Echo-Format: " + format + "\r\n"
				switch enc {
				case "askgzip":
					extra += "Accept-Encoding: gzip, br\r\n"
				case "big":
					extra += "X-Echo-Big: 1\r\nX-Echo-Encoding: gzip\r\nAccept-Encoding: gzip\r\n"
				case "":
				default:
					extra += "X-Echo-Encoding: " + enc + "\r\n"
				}
				resp, body := g.do(t, raw+extra+"\r\n")
				if enc == "big" {
					// The filler went through the streaming path; the
					// checks below need only what follows it.
					filler := strings.Repeat("0123456789abcdef", (1<<20)/16+100)
					var ok bool
					if body, ok = strings.CutPrefix(body, filler); !ok || resp.ContentLength != -1 {
						t.Fatalf("big body: length %d, %d bytes", resp.ContentLength, len(body))
					}
				}
				resp.Header.Del("Date")
				var hdr bytes.Buffer
				_ = resp.Header.Write(&hdr)
				got = append(got, fmt.Sprintf("%d %v %s\n%s", resp.StatusCode, resp.TransferEncoding, hdr.String(), body))
				if resp.StatusCode != 200 {
					t.Fatalf("%q (%s, %s): status %d: %s", raw, format, enc, resp.StatusCode, body)
				}
			}
		}
	}
	return got, h
}

func TestInterceptEchoLeaksNothing(t *testing.T) {
	t.Parallel()
	got1, h := echoRun(t, echoValues1)
	got2, _ := echoRun(t, echoValues2)

	// The test's subject ran: the upstream received every value, in the
	// forms the injector writes, and never an Accept-Encoding but identity.
	var wire strings.Builder
	for _, s := range h.seen() {
		fmt.Fprintf(&wire, "%s %v\n", s.uri, s.header)
	}
	for _, v := range echoValues1 {
		for _, form := range []string{v, url.QueryEscape(v), url.PathEscape(v), base64.StdEncoding.EncodeToString([]byte("u:" + v))} {
			if !strings.Contains(wire.String(), form) {
				t.Errorf("the upstream never received %q", form)
			}
		}
	}
	for _, s := range h.seen() {
		if ae := s.header.Values("Accept-Encoding"); len(ae) != 1 || ae[0] != "identity" {
			t.Fatalf("upstream saw Accept-Encoding %q", ae)
		}
	}
	if len(got1) != len(got2) {
		t.Fatalf("%d responses and %d", len(got1), len(got2))
	}
	for i := range got1 {
		// Noninterference: the guest reads the same bytes whatever the
		// values are.
		if got1[i] != got2[i] {
			t.Errorf("response %d depends on the values:\n%s\n---\n%s", i, got1[i], got2[i])
			break
		}
		for _, v := range echoValues1 {
			if what, ok := recoverable(v, []byte(got1[i])); ok {
				t.Errorf("response %d: value recoverable (%s): %q", i, what, got1[i])
			}
		}
	}
	// The reflections became placeholders rather than vanishing.
	for _, resp := range got1 {
		if !strings.Contains(resp, placeholderPrefix) {
			t.Errorf("no placeholder in %s", resp)
			break
		}
	}
}

func TestInterceptRefusesUnknownEncoding(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, echoSecrets(echoValues1), echoHandler(h))
	g := h.connect(t, "api.test", nil)
	resp, body := g.do(t, "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\nX-Echo-Encoding: br\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, echoValues1[0]) {
		t.Fatalf("status %d: %q", resp.StatusCode, body)
	}
	evs := h.audit()
	if len(evs) == 0 || evs[len(evs)-1].Action != ActionBlock || !strings.Contains(evs[len(evs)-1].Reason, "Content-Encoding") {
		t.Errorf("events %+v", evs)
	}
}

func TestInterceptRefusesColonInUserID(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, echoSecrets(echoValues1), echoHandler(h))
	g := h.connect(t, "api.test", nil)
	cred := base64.StdEncoding.EncodeToString([]byte(echoPh[1] + ":pw"))
	resp, body := g.do(t, "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic "+cred+"\r\n\r\n")
	if resp.StatusCode != http.StatusBadRequest || len(h.seen()) != 0 {
		t.Fatalf("status %d: %q; upstream saw %d requests", resp.StatusCode, body, len(h.seen()))
	}
}

func TestInterceptRefusesPartialToInjected(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, echoSecrets(echoValues1), func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Range", "bytes 0-3/10")
		w.WriteHeader(http.StatusPartialContent)
		_, _ = io.WriteString(w, r.Header.Get("Authorization")[7:11])
	})
	g := h.connect(t, "api.test", nil)
	resp, body := g.do(t, "GET /x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\n\r\n")
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, echoValues1[0][:4]) {
		t.Fatalf("status %d: %q", resp.StatusCode, body)
	}
}

func TestInterceptEmptyEncodedBody(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, echoSecrets(echoValues1), func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.(http.Flusher).Flush() // chunked, and empty
	})
	g := h.connect(t, "api.test", nil)
	resp, body := g.do(t, "GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n")
	if resp.StatusCode != http.StatusOK || body != "" || resp.Header.Get("Content-Encoding") != "" {
		t.Fatalf("status %d %v: %q", resp.StatusCode, resp.Header, body)
	}
}

func TestInterceptRangeStripped(t *testing.T) {
	t.Parallel()
	h := &harness{}
	h.start(t, echoSecrets(echoValues1), echoHandler(h))
	g := h.connect(t, "api.test", nil)
	g.do(t, "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer "+ph1+"\r\nRange: bytes=3-9\r\nIf-Range: x\r\nTE: gzip\r\n\r\n")
	g.do(t, "GET /echo HTTP/1.1\r\nHost: api.test\r\nRange: bytes=3-9\r\n\r\n")
	got := h.seen()
	if len(got) != 2 || got[0].header.Get("Range") != "" || got[0].header.Get("If-Range") != "" || got[0].header.Get("TE") != "" ||
		got[1].header.Get("Range") != "bytes=3-9" {
		t.Errorf("upstream saw %+v", got)
	}
}

// recoverable reports whether v can be read back from b by the decodings a
// guest could try: as is, gunzipped, percent-decoded, JSON-unescaped,
// base64-decoded at every offset of every run of base64 characters, and
// combinations of those. It also flags any 10-byte piece of v.
func recoverable(v string, b []byte) (string, bool) {
	views := map[string][]byte{"raw": b}
	for name, data := range maps(views) {
		if i := bytes.Index(data, []byte{0x1f, 0x8b}); i >= 0 {
			if zr, err := gzip.NewReader(bytes.NewReader(data[i:])); err == nil {
				if d, err := io.ReadAll(zr); err == nil || len(d) > 0 {
					views[name+"+gunzip"] = d
				}
			}
		}
	}
	for name, data := range maps(views) {
		views[name+"+json"] = jsonUnescape(data)
	}
	for name, data := range maps(views) {
		views[name+"+pct"] = percentDecode(data, false)
		views[name+"+pct+"] = percentDecode(data, true)
	}
	for name, data := range maps(views) {
		views[name+"+b64"] = base64Runs(data)
	}
	for name, data := range views {
		if bytes.Contains(data, []byte(v)) {
			return name, true
		}
		for i := 0; i+10 <= len(v); i++ {
			if bytes.Contains(data, []byte(v[i:i+10])) {
				return name + " (piece)", true
			}
		}
	}
	return "", false
}

func maps(m map[string][]byte) map[string][]byte {
	c := make(map[string][]byte, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// jsonUnescape decodes \uXXXX (ASCII), \/, \", \\ anywhere in b.
func jsonUnescape(b []byte) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+1 < len(b) {
			switch c := b[i+1]; c {
			case '/', '"', '\\':
				out = append(out, c)
				i++
				continue
			case 'u':
				if i+6 <= len(b) {
					if c, ok := hexEscape(b[i+2 : i+6]); ok {
						out = append(out, c)
						i += 5
						continue
					}
				}
			}
		}
		out = append(out, b[i])
	}
	return out
}

// percentDecode decodes every valid %XX, and + as a space if plus.
func percentDecode(b []byte, plus bool) []byte {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] == '%' && i+2 < len(b) {
			if d, err := url.PathUnescape(string(b[i : i+3])); err == nil {
				out = append(out, d...)
				i += 2
				continue
			}
		}
		if plus && b[i] == '+' {
			out = append(out, ' ')
			continue
		}
		out = append(out, b[i])
	}
	return out
}

var b64Run = regexp.MustCompile(`[A-Za-z0-9+/_-]{6,}`)

// base64Runs decodes every run of base64 characters, in both alphabets, at
// each of the four character offsets, and concatenates the results (with a
// separator).
func base64Runs(b []byte) []byte {
	var out []byte
	for _, run := range b64Run.FindAll(b, -1) {
		std := strings.NewReplacer("-", "+", "_", "/").Replace(string(run))
		for off := range 4 {
			s := std[off:]
			s = s[:len(s)/4*4]
			if d, err := base64.StdEncoding.DecodeString(s); err == nil {
				out = append(append(out, d...), 0)
			}
			// A last partial quantum too.
			if rest := std[off+len(s):]; len(rest) >= 2 {
				if d, err := base64.RawStdEncoding.DecodeString(rest); err == nil {
					out = append(append(out, d...), 0)
				}
			}
		}
	}
	return out
}

func TestScrubBase64Noninterference(t *testing.T) {
	t.Parallel()
	r1 := newReplacerRules(valueRules(echoSecrets(echoValues1)))
	r2 := newReplacerRules(valueRules(echoSecrets(echoValues2)))
	encs := []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding}
	for k := range echoValues1 {
		for pre := range 6 {
			for suf := range 4 {
				for e, enc := range encs {
					for _, esc := range []func(string) string{
						func(s string) string { return s },
						func(s string) string { return strings.ReplaceAll(s, "/", `\/`) },
						func(s string) string { return strings.ReplaceAll(s, "+", `\u002B`) },
					} {
						p, s := strings.Repeat("P", pre), strings.Repeat("s", suf)
						in1 := "<" + esc(enc.EncodeToString([]byte(p+echoValues1[k]+s))) + ">"
						in2 := "<" + esc(enc.EncodeToString([]byte(p+echoValues2[k]+s))) + ">"
						out1, out2 := r1.String(in1), r2.String(in2)
						if out1 != out2 {
							t.Errorf("value %d prefix %d suffix %d encoding %d: %q and %q", k, pre, suf, e, out1, out2)
						}
						if what, ok := recoverable(echoValues1[k], []byte(out1)); ok {
							t.Errorf("value %d prefix %d suffix %d encoding %d: recoverable (%s) from %q", k, pre, suf, e, what, out1)
						}
						// Streamed one byte at a time, the same.
						var out bytes.Buffer
						if _, err := out.ReadFrom(replaceReader(nopCloser{&oneByteReader{s: in1}}, r1)); err != nil || out.String() != out1 {
							t.Errorf("streamed %q, whole %q (%v)", out.String(), out1, err)
						}
					}
				}
			}
		}
	}
}

// FuzzReplacerStream checks that a replacer gives the same output however
// its input is split.
func FuzzReplacerStream(f *testing.F) {
	v := echoValues1[0]
	f.Add(base64.StdEncoding.EncodeToString([]byte("u:"+v)), uint8(3))
	f.Add("a"+v+url.QueryEscape(v)+"b", uint8(1))
	f.Add(strings.ReplaceAll(base64.StdEncoding.EncodeToString([]byte("xy"+v+"!")), "/", `\/`), uint8(7))
	r := newReplacerRules(append(valueRules(echoSecrets(echoValues1)),
		credentialRules(credential{guest: "u:" + ph1, sent: "u:" + v})...))
	f.Fuzz(func(t *testing.T, in string, step uint8) {
		whole := r.String(in)
		var out []byte
		var held []byte
		n := int(step%16) + 1
		for i := 0; i < len(in); i += n {
			chunk := append(held, in[i:min(i+n, len(in))]...)
			out, held = r.transform(out, chunk, false)
			held = slices.Clone(held)
		}
		out, _ = r.transform(out, held, true)
		if string(out) != whole {
			t.Fatalf("split by %d: %q, whole: %q", n, out, whole)
		}
	})
}
